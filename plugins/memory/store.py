"""
Where conversations live: an embedded SQLite database, and a bounded set of
session conversations in memory.

The database is opened in WAL mode and every change is one transaction, so a
process killed at any moment leaves the file as of its last commit: at most
the turn in flight is lost, and nothing is half-written (SQLite's journal).
C{synchronous=NORMAL} is what WAL needs for that against a killed process;
only a power cut may lose the last commits.  The file is opened on the first
change to a game's conversation, so a daemon whose games give no conversation
ids never creates it.

Loaded conversations are kept in memory (a bounded LRU), so planning a turn
reads no file; every change is written through at once.  Sessions'
conversations (no conversation id from the game) are never written: they last
as long as the client session, and the oldest are let go past a bound.

Work is done on the calling thread: a commit in WAL mode is a write to the
log, well under a millisecond here (C{bench/}).  Checkpoints, which write the
log back into the file, are offloaded (L{MemoryStore.checkpoint}), and so is
closing (L{MemoryStore.closing}): a clean stop writes the whole log back,
empties it and closes, leaving the main file alone, whole (the C{-wal} file
empty or gone).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rpmiddleware.builtin.memory.conversation import (
    ROLES,
    STATUSES,
    Conversation,
    Entry,
    Fact,
    Key,
)

SCHEMA_VERSION = 1
#: Commits between checkpoints (SQLite's own default is about 1000 pages).
CHECKPOINT_EVERY = 256
EXPORT_FORMAT = "rpmiddleware.memory/1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    integration TEXT NOT NULL,
    character TEXT NOT NULL,
    conversation TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    summarized INTEGER NOT NULL DEFAULT 0,
    updated REAL NOT NULL,
    UNIQUE (integration, character, conversation)
);
CREATE TABLE IF NOT EXISTS entries (
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    speaker TEXT NOT NULL,
    text TEXT NOT NULL,
    status TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (conversation, seq)
);
CREATE TABLE IF NOT EXISTS facts (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS knowledge (
    id INTEGER PRIMARY KEY,
    integration TEXT NOT NULL,
    scope TEXT NOT NULL,
    entry TEXT NOT NULL
);
"""


class StoreError(Exception):
    """
    The store cannot do what was asked (the file cannot be opened, or a
    document to import is wrong); the message says what.
    """


class InvalidDocument(StoreError):
    """A document to import is not an exported conversation."""


class MemoryStore:
    """
    @param path: the database file; C{":memory:"} keeps everything in this
        process only.
    @param now: the clock entries are stamped with (the reactor's).
    @param cached: how many conversations are kept loaded, and how many
        session conversations are kept at all.
    """

    def __init__(
        self,
        path: str,
        now: Callable[[], float],
        cached: int = 1024,
        offload: Callable[[Callable[[], object]], object] = lambda work: work(),
    ) -> None:
        """
        @param offload: runs a checkpoint (L{checkpoint}) away from the
            caller's thread (the plugin gives the reactor's thread pool);
            by default, at once.
        """
        self.path = path
        self._now = now
        self._cached = cached
        self._offload = offload
        self._checkpointing = False
        self._closed = False
        self._db: sqlite3.Connection | None = None
        self._loaded: OrderedDict[Key, Conversation] = OrderedDict()
        self._ids: dict[Key, int] = {}
        #: Committed transactions, for /metrics.
        self.writes = 0

    # The file.

    def _open(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        if self._closed:
            raise StoreError(f"the memory database {self.path} is closed (the daemon is stopping)")
        if self.path != ":memory:":
            folder = os.path.dirname(os.path.abspath(self.path))
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the memory folder {folder}: {e.strerror}")
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # A checkpoint writes the log back and syncs the file: tens of
            # milliseconds at times, too long for the reactor's thread.  It
            # runs on a connection of its own, offloaded (L{checkpoint}).
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.execute("PRAGMA foreign_keys=ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer rpmiddleware (memory schema "
                    f"{version}; this one reads {SCHEMA_VERSION})"
                )
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.DatabaseError as e:
            raise StoreError(f"cannot open the memory database {self.path}: {e}")
        self._db = db
        return db

    def _exists(self) -> bool:
        """Whether there is a database to read (without creating one)."""
        return self._db is not None or (self.path != ":memory:" and os.path.exists(self.path))

    def check(self) -> None:
        """
        Open the file now (at start-up), so that a wrong path is said then.

        @raise StoreError: naming the path and what is wrong.
        """
        self._open()

    def close(self) -> None:
        """
        Write the log back, empty it and close, on the caller's thread
        (L{closing}).
        """
        self.closing()()

    def closing(self) -> Callable[[], None]:
        """
        Stop using the database now: whatever asks for it later fails with
        L{StoreError}.  Return the work that ends it, for any thread (the
        plugin runs it in the reactor's thread pool): the whole log written
        back into the file and emptied (C{wal_checkpoint(TRUNCATE)}), then
        the connection closed.  Closing twice does nothing more.
        """
        db, self._db = self._db, None
        self._closed = True

        def close() -> None:
            if db is None:
                return
            try:
                if self.path != ":memory:":
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                db.close()

        return close

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._open()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self.writes += 1
        if self.writes % CHECKPOINT_EVERY == 0 and not self._checkpointing:
            self._checkpointing = True
            self._offload(self.checkpoint)

    def checkpoint(self) -> None:
        """
        Write the log back into the database file, on a connection of its
        own (so any thread may run it); readers and writers go on meanwhile.
        """
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                db.close()
        finally:
            self._checkpointing = False

    # Conversations.

    def conversation(self, key: Key) -> Conversation:
        """
        The conversation C{key} names, loaded or new (a new one is written
        with its first change).
        """
        found = self._loaded.get(key)
        if found is not None:
            self._loaded.move_to_end(key)
            return found
        conversation = self._read(key) if key.persistent else None
        if conversation is None:
            conversation = Conversation(key, updated=self._now())
        self._loaded[key] = conversation
        while len(self._loaded) > self._cached:
            self._loaded.popitem(last=False)
        return conversation

    def _read(self, key: Key) -> Conversation | None:
        db = self._open()
        row = db.execute(
            "SELECT id, summary, summarized, updated FROM conversations "
            "WHERE integration = ? AND character = ? AND conversation = ?",
            (key.integrationId, key.characterId, key.conversationId),
        ).fetchone()
        if row is None:
            return None
        rowid, summary, summarized, updated = row
        self._ids[key] = rowid
        entries = [
            Entry(seq, role, text, status, speaker, at)
            for seq, role, speaker, text, status, at in db.execute(
                "SELECT seq, role, speaker, text, status, at FROM entries "
                "WHERE conversation = ? ORDER BY seq",
                (rowid,),
            )
        ]
        facts = [
            Fact(i, text)
            for i, text in db.execute(
                "SELECT id, text FROM facts WHERE conversation = ? ORDER BY id", (rowid,)
            )
        ]
        return Conversation(key, entries, summary, summarized, facts, updated)

    def _rowid(self, db: sqlite3.Connection, conversation: Conversation) -> int:
        key = conversation.key
        rowid = self._ids.get(key)
        if rowid is None:
            cursor = db.execute(
                "INSERT INTO conversations (integration, character, conversation, summary, "
                "summarized, updated) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    key.integrationId,
                    key.characterId,
                    key.conversationId,
                    conversation.summary,
                    conversation.summarizedThrough,
                    conversation.updated,
                ),
            )
            rowid = cursor.lastrowid
            assert rowid is not None
            self._ids[key] = rowid
        return rowid

    def _touch(self, db: sqlite3.Connection | None, conversation: Conversation) -> None:
        conversation.updated = self._now()
        if db is not None:
            db.execute(
                "UPDATE conversations SET summary = ?, summarized = ?, updated = ? WHERE id = ?",
                (
                    conversation.summary,
                    conversation.summarizedThrough,
                    conversation.updated,
                    self._rowid(db, conversation),
                ),
            )

    @contextmanager
    def _change(self, conversation: Conversation) -> Iterator[sqlite3.Connection | None]:
        """
        One change to C{conversation}: a transaction for a game's, nothing
        to write for a session's.
        """
        if not conversation.key.persistent:
            yield None
            self._touch(None, conversation)
            return
        with self._transaction() as db:
            yield db
            self._touch(db, conversation)

    def append(self, conversation: Conversation, *entries: tuple[str, str, str, str]) -> None:
        """
        Add entries (C{(role, speaker, text, status)} each) in one change.
        """
        at = self._now()
        made = []
        seq = conversation.nextSeq
        for role, speaker, text, status in entries:
            made.append(Entry(seq, role, text, status, speaker, at))
            seq += 1
        with self._change(conversation) as db:
            if db is not None:
                rowid = self._rowid(db, conversation)
                db.executemany(
                    "INSERT INTO entries (conversation, seq, role, speaker, text, status, at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(rowid, e.seq, e.role, e.speaker, e.text, e.status, e.at) for e in made],
                )
            conversation.entries.extend(made)

    def edit(self, conversation: Conversation, seq: int, text: str | None) -> None:
        """
        Change an entry's text, or remove it (C{text} C{None}).

        @raise KeyError: when it has no entry C{seq}.
        """
        entry = conversation.entry(seq)
        if entry is None:
            raise KeyError(seq)
        with self._change(conversation) as db:
            if db is not None:
                rowid = self._rowid(db, conversation)
                if text is None:
                    db.execute(
                        "DELETE FROM entries WHERE conversation = ? AND seq = ?", (rowid, seq)
                    )
                else:
                    db.execute(
                        "UPDATE entries SET text = ? WHERE conversation = ? AND seq = ?",
                        (text, rowid, seq),
                    )
            if text is None:
                conversation.entries.remove(entry)
            else:
                entry.text = text

    def summarize(self, conversation: Conversation, summary: str, through: int) -> None:
        with self._change(conversation):
            conversation.summary = summary
            conversation.summarizedThrough = max(conversation.summarizedThrough, through)

    def pin(self, conversation: Conversation, text: str) -> Fact:
        with self._change(conversation) as db:
            if db is None:
                factId = max((f.id for f in conversation.facts), default=0) + 1
            else:
                cursor = db.execute(
                    "INSERT INTO facts (conversation, text) VALUES (?, ?)",
                    (self._rowid(db, conversation), text),
                )
                assert cursor.lastrowid is not None
                factId = cursor.lastrowid
            fact = Fact(factId, text)
            conversation.facts.append(fact)
        return fact

    def unpin(self, conversation: Conversation, factId: int) -> None:
        """
        @raise KeyError: when the conversation has no such fact.
        """
        fact = next((f for f in conversation.facts if f.id == factId), None)
        if fact is None:
            raise KeyError(factId)
        with self._change(conversation) as db:
            if db is not None:
                db.execute("DELETE FROM facts WHERE id = ?", (factId,))
            conversation.facts.remove(fact)

    def forget(self, key: Key) -> bool:
        """
        Remove a conversation wholly; whether there was one.
        """
        found = self._loaded.pop(key, None)
        if not key.persistent:
            return found is not None
        with self._transaction() as db:
            deleted = self._delete(db, key)
        return deleted or found is not None

    def _delete(self, db: sqlite3.Connection, key: Key) -> bool:
        self._ids.pop(key, None)
        cursor = db.execute(
            "DELETE FROM conversations WHERE integration = ? AND character = ? "
            "AND conversation = ?",
            (key.integrationId, key.characterId, key.conversationId),
        )
        return cursor.rowcount > 0

    def dropConversations(self, conversationId: str) -> list[Key]:
        """
        Let go of the loaded conversations named C{conversationId}, whatever
        their character (a session's, which are never written).
        """
        keys = [k for k in self._loaded if k.conversationId == conversationId]
        for key in keys:
            del self._loaded[key]
        return keys

    def briefs(
        self, integrationId: str | None = None, characterId: str | None = None
    ) -> list[dict[str, Any]]:
        """
        What conversations there are (L{Conversation.brief}), maybe of one
        integration or character: the loaded ones as they are, the rest
        counted in the database without reading their entries.
        """

        def wanted(key: Key) -> bool:
            return (integrationId is None or key.integrationId == integrationId) and (
                characterId is None or key.characterId == characterId
            )

        found = {
            k: c.brief()
            for k, c in self._loaded.items()
            if wanted(k) and (c.entries or c.facts or c.summary)
        }
        if self._exists():
            rows = self._open().execute(
                "SELECT integration, character, conversation, summary != '', updated, "
                "(SELECT count(*) FROM entries WHERE entries.conversation = c.id), "
                "(SELECT count(*) FROM facts WHERE facts.conversation = c.id) "
                "FROM conversations AS c"
            )
            for integration, character, name, summarized, updated, entries, facts in rows:
                key = Key(integration, character, name)
                if wanted(key) and key not in found:
                    brief = {"entries": entries, "facts": facts, "summarized": bool(summarized)}
                    found[key] = {**key.asDict(), **brief, "updated": updated}
        return list(found.values())

    # Export and import.

    def export(self, conversation: Conversation) -> dict[str, Any]:
        return {"format": EXPORT_FORMAT, **conversation.asDict()}

    def restore(self, key: Key, document: Any) -> Conversation:
        """
        Replace conversation C{key} with an L{export}ed document (a game's
        save file), in one change: a kill leaves the old one or the new.

        @raise InvalidDocument: naming what is wrong with C{document}.
        """
        conversation = _parseExport(key, document)
        conversation.updated = self._now()
        self._loaded.pop(key, None)
        if key.persistent:
            with self._transaction() as db:
                self._delete(db, key)
                rowid = self._rowid(db, conversation)
                db.executemany(
                    "INSERT INTO entries (conversation, seq, role, speaker, text, status, at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (rowid, e.seq, e.role, e.speaker, e.text, e.status, e.at)
                        for e in conversation.entries
                    ],
                )
                for fact in conversation.facts:
                    cursor = db.execute(
                        "INSERT INTO facts (conversation, text) VALUES (?, ?)",
                        (rowid, fact.text),
                    )
                    assert cursor.lastrowid is not None
                    fact.id = cursor.lastrowid
        self._loaded[key] = conversation
        return conversation

    # The game's knowledge.

    def knowledge(self, integrationId: str) -> list[tuple[int, str, dict[str, Any]]]:
        """
        The game's knowledge entries of an integration: C{(id, scope, entry)}.
        """
        if not self._exists():
            return []
        return [
            (i, scope, json.loads(entry))
            for i, scope, entry in self._open().execute(
                "SELECT id, scope, entry FROM knowledge WHERE integration = ? ORDER BY id",
                (integrationId,),
            )
        ]

    def know(self, integrationId: str, scope: str, entry: dict[str, Any]) -> int:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO knowledge (integration, scope, entry) VALUES (?, ?, ?)",
                (integrationId, scope, json.dumps(entry)),
            )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def unknow(self, integrationId: str, knowledgeId: int) -> bool:
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM knowledge WHERE integration = ? AND id = ?",
                (integrationId, knowledgeId),
            )
        return cursor.rowcount > 0


def _parseExport(key: Key, document: Any) -> Conversation:
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise InvalidDocument(
            f'an imported conversation must be an object with format "{EXPORT_FORMAT}"'
        )
    summary = document.get("summary", "")
    through = document.get("summarizedThrough", 0)
    if not isinstance(summary, str):
        raise InvalidDocument("summary must be a string")
    if isinstance(through, bool) or not isinstance(through, int) or through < 0:
        raise InvalidDocument("summarizedThrough must be a whole number of at least 0")
    entries: list[Entry] = []
    raw = document.get("entries", [])
    if not isinstance(raw, list):
        raise InvalidDocument("entries must be a list")
    last = 0
    for i, item in enumerate(raw):
        where = f"entries[{i}]"
        if not isinstance(item, dict):
            raise InvalidDocument(f"{where} must be an object")
        seq, role, text = item.get("seq"), item.get("role"), item.get("text")
        status, speaker = item.get("status", "complete"), item.get("speaker", "")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq <= last:
            raise InvalidDocument(f"{where}.seq must be a whole number above the one before it")
        if role not in ROLES:
            raise InvalidDocument(f"{where}.role must be one of {', '.join(ROLES)}")
        if status not in STATUSES:
            raise InvalidDocument(f"{where}.status must be one of {', '.join(STATUSES)}")
        if not isinstance(text, str) or not isinstance(speaker, str):
            raise InvalidDocument(f"{where}.text and .speaker must be strings")
        at = item.get("at", 0.0)
        entries.append(
            Entry(
                seq, role, text, status, speaker, float(at) if isinstance(at, int | float) else 0.0
            )
        )
        last = seq
    facts = []
    rawFacts = document.get("facts", [])
    if not isinstance(rawFacts, list):
        raise InvalidDocument("facts must be a list")
    for i, item in enumerate(rawFacts):
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            raise InvalidDocument(f"facts[{i}] must be a non-empty string or an object with text")
        facts.append(Fact(i + 1, text.strip()))
    return Conversation(key, entries, summary, through, facts)
