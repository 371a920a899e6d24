"""
Memory tied to a game's own save games, and forgetting by age or size.

A game saves the whole world at once, so a save holds every character's
conversation under the game's C{conversationId} (of one integration): each
as the sealed document C{export} gives (entries, summary, facts, and what
else a conversation holds), together in one row of the store's C{saves}
table with the SHA-256 of the whole, written on the store's writer thread
after every change given before it.  Loading a save replaces each of those
conversations with the one saved, and forgets those the save did not hold
(characters met after it), so every character forgets what happened after
the save and the next request is planned from it.

A save is never loaded while a turn of its conversation is in flight: the
turn would be remembered into the restored conversation, or lost.  Loading
is refused, with the turn named, until it ended.  While a save is taken or
loaded (and while the store is pruned) the plugin holds the envelopes that
come after the op, so a turn the game sends right after C{load-save} is
planned from the save, never from what it replaced.

Pruning deletes the oldest entries of game conversations (their summaries
and facts stay, so the character keeps what was condensed) and old saves;
the store's size is measured on the reader's thread, never the reactor's.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, FirstError, gatherResults
from twisted.python.failure import Failure

from rpmiddleware.builtin.memory.conversation import CHARACTER, Conversation, Fact, Key
from rpmiddleware.builtin.memory.exports import parseExport
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.builtin.memory.storeerrors import InvalidDocument, StoreError, allKept


class SavingPlugin(Protocol):
    """What L{Saves} uses of the memory plugin."""

    store: MemoryStore
    now: Callable[[], float]

    def letGo(self, key: Key) -> None: ...

    def turnsInFlight(self) -> list[tuple[str, Key]]: ...


#: The format of a save's body.
SAVE_FORMAT = "rpmiddleware.memory-save/1"
DAY = 86400.0
#: Times pruning to C{maxBytes} forgets and compacts at most.
PRUNE_ROUNDS = 4
#: Seconds a measurement of the store's size is reported before a scrape
#: asks for a new one.
SIZE_EVERY = 10.0


class SaveRefused(Exception):
    """What was asked cannot be done now (a turn in flight); the message says why."""


class DamagedSave(StoreError):
    """A save in the store no longer matches its checksum, or is not a save."""


#: Entries written on one line of a save's body.
BATCH = 256


def _line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _seal(header: dict[str, Any], documents: list[dict[str, Any]]) -> tuple[str, str]:
    """
    A save's body as stored, and the SHA-256 (hex) of its UTF-8 bytes.  The
    body is JSON lines: the header (with C{conversations}, how many), then
    for each conversation its exported document without its entries (with
    C{entryLines}, how many lines of them follow) and its entries,
    L{BATCH} to a line.  No line is long: written and read on the store's
    thread, a save of thousands of entries never holds Python's lock (and
    so the reactor) for long, as one JSON call over the whole would.
    """
    lines = [_line({**header, "conversations": len(documents)})]
    for document in documents:
        entries = document.get("entries") or []
        batches = [entries[i : i + BATCH] for i in range(0, len(entries), BATCH)]
        rest = {k: v for k, v in document.items() if k != "entries"}
        lines.append(_line({**rest, "entryLines": len(batches)}))
        lines.extend(_line(batch) for batch in batches)
    text = "\n".join(lines)
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def unseal(text: str) -> dict[str, Any]:
    """
    A save's body (L{_seal}) as one object: the header, with
    C{conversations} the exported documents.

    @raise ValueError: when it is not such a body.
    """
    lines = iter(text.split("\n"))
    header = json.loads(next(lines))
    if not isinstance(header, dict) or not isinstance(header.get("conversations"), int):
        raise ValueError("no header")
    documents = []
    for _ in range(header["conversations"]):
        document = json.loads(next(lines))
        entries: list[Any] = []
        for _ in range(document.pop("entryLines")):
            entries.extend(json.loads(next(lines)))
        documents.append({**document, "entries": entries})
    return {**header, "conversations": documents}


def _characters(db: sqlite3.Connection, integrationId: str, conversationId: str) -> list[str]:
    return [
        row[0]
        for row in db.execute(
            "SELECT character FROM conversations WHERE integration = ? AND conversation = ? "
            "ORDER BY character",
            (integrationId, conversationId),
        )
    ]


def _brief(row: tuple[Any, ...]) -> dict[str, Any]:
    save, integration, conversation, created, characters, entries, size = row
    return {
        "saveId": save,
        "integrationId": integration,
        "conversationId": conversation,
        "created": created,
        "characters": json.loads(characters),
        "entries": entries,
        "bytes": size,
    }


_BRIEF = "SELECT save, integration, conversation, created, characters, entries, bytes FROM saves"


class Saves:
    """
    The memory plugin's saves, pruning and size: the ops and the Python
    API call it; what it reads and writes goes through the store's threads.
    """

    def __init__(self, memory: SavingPlugin) -> None:
        self.memory = memory
        self.store = memory.store
        #: The store's size as last measured (L{measured}), and when.
        self.lastSize: dict[str, int] = {"bytes": 0, "conversations": 0, "entries": 0, "saves": 0}
        self._sizeAt: float | None = None
        self._measuring = False

    def _now(self) -> float:
        seconds: Callable[[], float] = self.memory.now
        return seconds()

    # Taking a save.

    def save(
        self, integrationId: str, conversationId: str, saveId: str, characterId: str | None = None
    ) -> Deferred[dict[str, Any]]:
        """
        Snapshot every character's conversation under C{conversationId}
        (or only C{characterId}'s) as save C{saveId}, replacing a save of
        that name; its brief once written.
        """

        def listed(stored: list[str]) -> Deferred[list[Key]]:
            loaded = [
                k
                for k in self.store.loadedKeys()
                if (k.integrationId, k.conversationId) == (integrationId, conversationId)
                and _holdsSomething(self.store.cached(k))
            ]
            keys = sorted({*loaded, *(Key(integrationId, c, conversationId) for c in stored)})
            if characterId is not None:
                keys = [k for k in keys if k.characterId == characterId]
            reads = [self.store.load(k) for k in keys]
            d = gatherResults(reads, consumeErrors=True)
            return d.addCallbacks(lambda _: keys, _firstFailure)

        def snapshot(keys: list[Key]) -> Deferred[dict[str, Any]]:
            # Copies, made now: the save is the conversations as they are
            # at this op, whatever the reactor changes while the writer's
            # thread exports them.
            copies = [_snapshot(self.store.cached(k)) for k in keys]
            created = self._now()
            characters = json.dumps([k.characterId for k in keys])
            entries = sum(len(c.entries) for c in copies)

            def write(db: sqlite3.Connection) -> dict[str, Any]:
                # Exported and sealed here, on the writer's thread: the JSON
                # of a long conversation is no work for the reactor.
                header = {
                    "format": SAVE_FORMAT,
                    "integrationId": integrationId,
                    "conversationId": conversationId,
                    "saveId": saveId,
                    "created": created,
                }
                text, checksum = _seal(header, [self.store.export(c) for c in copies])
                size = len(text.encode("utf-8"))
                db.execute(
                    "DELETE FROM saves WHERE integration = ? AND conversation = ? AND save = ?",
                    (integrationId, conversationId, saveId),
                )
                row = (saveId, integrationId, conversationId, created, characters, entries, size)
                db.execute(
                    "INSERT INTO saves (save, integration, conversation, created, characters, "
                    "entries, bytes, body, checksum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*row, text, checksum),
                )
                return _brief(row)

            return self.store.transaction("save", write)

        d = self.store.transaction(
            "save", lambda db: _characters(db, integrationId, conversationId), write=False
        )
        d.addCallback(listed).addCallback(snapshot)
        return self._changed(d)

    # Loading one.

    def _inFlight(self, integrationId: str, conversationId: str) -> None:
        """
        @raise SaveRefused: naming a turn of the conversation still in flight.
        """
        for requestId, key in self.memory.turnsInFlight():
            if (key.integrationId, key.conversationId) == (integrationId, conversationId):
                raise SaveRefused(
                    f"{key.characterId}'s turn {requestId} in conversation {conversationId} is "
                    "still in flight: load the save once it ended (reply-complete, or after "
                    "cancelling it)"
                )

    def load(
        self, integrationId: str, conversationId: str, saveId: str
    ) -> Deferred[dict[str, Any]]:
        """
        Restore save C{saveId}: each conversation it holds as it was saved,
        and the conversations under C{conversationId} it does not hold
        forgotten.  Refused (L{SaveRefused}) while a turn of that
        conversation is in flight; C{KeyError} when there is no such save;
        L{DamagedSave} when the stored save does not match its checksum.
        """
        try:
            self._inFlight(integrationId, conversationId)
        except SaveRefused as e:
            return _failed(e)

        def read(db: sqlite3.Connection) -> tuple[dict[str, Any], list[Conversation], list[str]]:
            row = db.execute(
                "SELECT body, checksum FROM saves "
                "WHERE integration = ? AND conversation = ? AND save = ?",
                (integrationId, conversationId, saveId),
            ).fetchone()
            if row is None:
                raise KeyError(f"save {saveId!r} of conversation {conversationId!r}")
            text, checksum = row
            if hashlib.sha256(text.encode("utf-8")).hexdigest() != checksum:
                raise DamagedSave(
                    f"save {saveId!r} is damaged: its content does not match its checksum"
                )
            try:
                body = unseal(text)
            except (ValueError, KeyError, TypeError, AttributeError, StopIteration):
                body = {}
            documents = body.get("conversations")
            if body.get("format") != SAVE_FORMAT or not isinstance(documents, list):
                raise DamagedSave(f"save {saveId!r} is not a save of format {SAVE_FORMAT}")
            # Each conversation read (and checked) here, on the store's
            # thread, and whole before any is replaced.
            conversations = []
            for document in documents:
                named = document.get("characterId") if isinstance(document, dict) else None
                if not isinstance(named, str) or not named:
                    raise DamagedSave(f"save {saveId!r} holds a conversation without characterId")
                try:
                    key = Key(integrationId, named, conversationId)
                    conversations.append(parseExport(key, document))
                except InvalidDocument as e:
                    raise DamagedSave(f"save {saveId!r} holds a damaged conversation: {e}")
            return body, conversations, _characters(db, integrationId, conversationId)

        def restore(
            found: tuple[dict[str, Any], list[Conversation], list[str]],
        ) -> Deferred[dict[str, Any]]:
            body, conversations, stored = found
            self._inFlight(integrationId, conversationId)
            restored = [c.key.characterId for c in conversations]
            present = {
                k.characterId
                for k in self.store.loadedKeys()
                if (k.integrationId, k.conversationId) == (integrationId, conversationId)
                and _holdsSomething(self.store.cached(k))
            } | set(stored)
            forgotten = sorted(present - set(restored))
            for conversation in conversations:
                self.memory.letGo(conversation.key)
            gone = [Key(integrationId, c, conversationId) for c in forgotten]
            for key in gone:
                self.memory.letGo(key)
            # One transaction: a kill leaves the world before the load, or
            # the save's.
            kept = self.store.replaceAll(conversations, gone)
            answer = {
                "saveId": saveId,
                "conversationId": conversationId,
                "created": body.get("created"),
                "restored": restored,
                "forgotten": forgotten,
            }
            return allKept([kept], answer)

        d = self.store.transaction("load-save", read, write=False)
        return d.addCallback(restore)

    # Listing and dropping.

    def list(
        self, integrationId: str, conversationId: str | None = None
    ) -> Deferred[list[dict[str, Any]]]:
        """The saves of an integration (or of one conversation), newest first."""

        def read(db: sqlite3.Connection) -> list[dict[str, Any]]:
            where, args = "WHERE integration = ?", [integrationId]
            if conversationId is not None:
                where += " AND conversation = ?"
                args.append(conversationId)
            rows = db.execute(f"{_BRIEF} {where} ORDER BY created DESC, id DESC", args)
            return [_brief(row) for row in rows]

        return self.store.transaction("saves", read, write=False)

    def drop(self, integrationId: str, conversationId: str, saveId: str) -> Deferred[bool]:
        """Delete a save; whether there was one."""

        def delete(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "DELETE FROM saves WHERE integration = ? AND conversation = ? AND save = ?",
                (integrationId, conversationId, saveId),
            )
            return cursor.rowcount > 0

        return self._changed(self.store.transaction("drop-save", delete))

    # Forgetting by age or size.

    def prune(
        self,
        integrationId: str,
        olderThanDays: float | None = None,
        keepEntries: int | None = None,
        keepSaves: int | None = None,
        maxBytes: int | None = None,
        conversationId: str | None = None,
        characterId: str | None = None,
    ) -> Deferred[dict[str, Any]]:
        """
        Delete, in the game conversations of C{integrationId} (or only
        C{conversationId}'s, C{characterId}'s): the entries older than
        C{olderThanDays} and the saves made before then; all but the
        newest C{keepEntries} entries of each conversation; all but the
        newest C{keepSaves} saves of each conversation id; and then, while
        the store would be over C{maxBytes}, the oldest entries and saves,
        oldest first, after which the file is compacted.  Summaries and
        facts stay.  Its answer says what went and the store's size after.
        """
        cutoff = None if olderThanDays is None else self._now() - olderThanDays * DAY

        def delete(db: sqlite3.Connection) -> dict[str, Any]:
            return _prune(
                db,
                integrationId,
                conversationId,
                characterId,
                cutoff,
                keepEntries,
                keepSaves,
                maxBytes,
            )

        removed: dict[str, Any] = {"entries": 0, "conversations": set(), "saves": []}

        def applied(result: dict[str, Any]) -> Any:
            # Loaded conversations lose what the file lost.
            for characterId_, conversationId_, through in result["through"]:
                key = Key(integrationId, characterId_, conversationId_)
                removed["conversations"].add(key)
                conversation = self.store.cached(key)
                if conversation is not None:
                    conversation.entries = [e for e in conversation.entries if e.seq > through]
                    conversation.summarizedThrough = max(conversation.summarizedThrough, through)
            removed["entries"] += result["removed"]["entries"]
            removed["saves"].extend(result["removed"]["saves"])
            if maxBytes is None:
                return self.measure()
            return self.store.compact().addCallback(lambda _: self.measure())

        def again(size: dict[str, int], rounds: int) -> Any:
            # The file holds more than its content (pages, indexes), and not
            # in proportion: while it is still over, forget more, measured
            # anew.
            if maxBytes is None or size["bytes"] <= maxBytes or rounds <= 1:
                return size
            d = self.store.transaction(
                "prune",
                lambda db: _prune(
                    db, integrationId, conversationId, characterId, None, None, None, maxBytes
                ),
            )
            d.addCallback(applied).addCallback(again, rounds - 1)
            return d

        def answered(size: dict[str, int]) -> dict[str, Any]:
            conversations = len(removed.pop("conversations"))
            return {"removed": {**removed, "conversations": conversations}, "size": size}

        d = self.store.transaction("prune", delete)
        d.addCallback(applied).addCallback(again, PRUNE_ROUNDS)
        return self._changed(d.addCallback(answered))

    # The store's size.

    def measure(self) -> Deferred[dict[str, int]]:
        """Measure the store's size now (on the reader's thread)."""
        self._measuring = True

        def measured(size: dict[str, int]) -> dict[str, int]:
            self.lastSize, self._sizeAt = size, self._now()
            return size

        def done(result: Any) -> Any:
            self._measuring = False
            return result

        return self.store.size().addCallback(measured).addBoth(done)

    def sizeForMetrics(self) -> dict[str, int]:
        """
        The last measured size, at once (a scrape runs on the reactor);
        a new measurement is asked when that one is older than
        L{SIZE_EVERY} or a change made it stale.
        """
        stale = self._sizeAt is None or self._now() - self._sizeAt >= SIZE_EVERY
        if stale and not self._measuring:
            self.measure().addErrback(lambda f: None)
        return self.lastSize

    def _changed(self, d: Deferred[Any]) -> Deferred[Any]:
        """After a change of the saves: the next scrape measures again."""

        def stale(result: Any) -> Any:
            self._sizeAt = None
            return result

        return d.addBoth(stale)


def _snapshot(conversation: Conversation | None) -> Conversation:
    """
    A copy of C{conversation} that another thread may read while the
    reactor changes the original: its lists copied (the store replaces an
    entry it edits or cuts, never changes one in place, so the entries are
    shared), its state's values too (small, and maybe changed in place).
    """
    assert conversation is not None, "loaded before it is saved"
    return dataclasses.replace(
        conversation,
        entries=list(conversation.entries),
        facts=[Fact(f.id, f.text) for f in conversation.facts],
        memories=[dataclasses.replace(m) for m in conversation.memories],
        state=copy.deepcopy(conversation.state),
    )


def _holdsSomething(conversation: Any) -> bool:
    """Whether a loaded conversation is more than a placeholder."""
    return conversation is not None and bool(
        conversation.entries
        or conversation.facts
        or conversation.summary
        or getattr(conversation, "memories", None)
        or getattr(conversation, "state", None)
    )


def _firstFailure(failure: Failure) -> Failure:
    """The failure itself, not gatherResults' wrapping of it."""
    error = failure.value
    if isinstance(error, FirstError):
        wrapped: Failure = error.subFailure
        return wrapped
    return failure


def _failed(error: Exception) -> Deferred[Any]:
    d: Deferred[Any] = Deferred()
    d.errback(error)
    return d


def _prune(
    db: sqlite3.Connection,
    integrationId: str,
    conversationId: str | None,
    characterId: str | None,
    cutoff: float | None,
    keepEntries: int | None,
    keepSaves: int | None,
    maxBytes: int | None,
) -> dict[str, Any]:
    """L{Saves.prune}'s deletions, on the writer's thread, in one transaction."""
    where, args = "WHERE integration = ?", [integrationId]
    if conversationId is not None:
        where += " AND conversation = ?"
        args.append(conversationId)
    conversations = {
        rowid: (character, conversation)
        for rowid, character, conversation in db.execute(
            f"SELECT id, character, conversation FROM conversations {where}", args
        )
        if characterId is None or character == characterId
    }
    #: Per conversation row: its entries up to this seq go.
    through: dict[int, int] = {}

    def upTo(rowid: int, seq: int | None) -> None:
        if seq is not None and seq > through.get(rowid, 0):
            through[rowid] = seq

    for rowid in conversations:
        if cutoff is not None:
            upTo(
                rowid,
                db.execute(
                    "SELECT max(seq) FROM entries WHERE conversation = ? AND at < ?",
                    (rowid, cutoff),
                ).fetchone()[0],
            )
        if keepEntries is not None:
            row = db.execute(
                "SELECT seq FROM entries WHERE conversation = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
                (rowid, keepEntries),
            ).fetchone()
            upTo(rowid, row[0] if row else None)
    saves: set[int] = set()
    saveRows = db.execute(
        f"SELECT id, conversation, created, bytes FROM saves {where} "
        "ORDER BY created DESC, id DESC",
        args,
    ).fetchall()
    if characterId is None:
        counted: dict[str, int] = {}
        for saveRow, conversation, created, _ in saveRows:
            counted[conversation] = counted.get(conversation, 0) + 1
            if (cutoff is not None and created < cutoff) or (
                keepSaves is not None and counted[conversation] > keepSaves
            ):
                saves.add(saveRow)
    if maxBytes is not None:
        _toFit(db, maxBytes, conversations, through, saves, saveRows if characterId is None else [])
    for rowid, seq in through.items():
        # Whole exchanges: what is left never opens with the character's
        # reply to a line that went.
        while True:
            after = db.execute(
                "SELECT seq, role FROM entries WHERE conversation = ? AND seq > ? "
                "ORDER BY seq LIMIT 1",
                (rowid, seq),
            ).fetchone()
            if after is None or after[1] != CHARACTER:
                break
            seq = through[rowid] = after[0]
    removed = 0
    for rowid, seq in through.items():
        removed += db.execute(
            "DELETE FROM entries WHERE conversation = ? AND seq <= ?", (rowid, seq)
        ).rowcount
        db.execute(
            "UPDATE conversations SET summarized = max(summarized, ?) WHERE id = ?", (seq, rowid)
        )
    dropped = []
    for saveRow in sorted(saves):
        found = db.execute(
            "SELECT conversation, save FROM saves WHERE id = ?", (saveRow,)
        ).fetchone()
        db.execute("DELETE FROM saves WHERE id = ?", (saveRow,))
        dropped.append({"conversationId": found[0], "saveId": found[1]})
    return {
        "removed": {"entries": removed, "conversations": len(through), "saves": dropped},
        "through": [(*conversations[rowid], seq) for rowid, seq in through.items()],
    }


def _toFit(
    db: sqlite3.Connection,
    maxBytes: int,
    conversations: dict[int, tuple[str, str]],
    through: dict[int, int],
    saves: set[int],
    saveRows: list[tuple[Any, ...]],
) -> None:
    """
    Choose the oldest entries and saves (beyond those chosen already) until
    the store would fit C{maxBytes}: its content (entries' text, saves'
    bodies) scaled by what the file holds now for each byte of content
    (indexes, pages, what else the store keeps).
    """
    pageSize = db.execute("PRAGMA page_size").fetchone()[0]
    used = (
        db.execute("PRAGMA page_count").fetchone()[0]
        - db.execute("PRAGMA freelist_count").fetchone()[0]
    ) * pageSize
    content = (
        db.execute("SELECT coalesce(sum(length(CAST(text AS BLOB))), 0) FROM entries").fetchone()[0]
        + db.execute("SELECT coalesce(sum(bytes), 0) FROM saves").fetchone()[0]
    )
    if content <= 0 or used <= maxBytes:
        return
    target = maxBytes * content / used
    candidates: list[tuple[float, int, int, int, int]] = []  # at, kind, row, seq, bytes
    for rowid in conversations:
        for seq, at, size in db.execute(
            "SELECT seq, at, length(CAST(text AS BLOB)) FROM entries WHERE conversation = ? "
            "ORDER BY seq",
            (rowid,),
        ):
            candidates.append((at, 0, rowid, seq, size))
    for saveRow, _, created, size in saveRows:
        candidates.append((created, 1, saveRow, 0, size))
    candidates.sort()
    left = content
    for _, kind, row, seq, size in candidates:
        if (row in saves) if kind == 1 else (seq <= through.get(row, 0)):
            left -= size
    for _, kind, row, seq, size in candidates:
        if left <= target:
            break
        if kind == 1:
            if row not in saves:
                saves.add(row)
                left -= size
        elif seq > through.get(row, 0):
            through[row] = seq
            left -= size
