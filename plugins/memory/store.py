"""
Where conversations live: an embedded SQLite database, and a bounded set of
session conversations in memory.

The database is opened in WAL mode and every change is one transaction, so a
process killed at any moment leaves the file as of its last commit: at most
the turn in flight is lost, and nothing is half-written (SQLite's journal).
C{synchronous=NORMAL} is what WAL needs for that against a killed process;
only a power cut may lose the last commits.

No database work runs on the reactor's thread.  Loaded conversations are kept
in memory (a bounded LRU) and a change is made there at once, so the next
plan sees it; its write goes to the store's writer (L{Lane}: one thread of
its own, in order), which waits for a lock another process holds as long as
C{write_timeout} (SQLite's busy handler retries meanwhile).  What could not
be written is reported (L{MemoryStore.onLost}, C{/metrics}) and every write
returns a Deferred saying whether it was kept.  A conversation not loaded yet
is read on a second thread with a connection of its own (L{MemoryStore.load}),
so that a write waiting for a lock never holds up a read; a conversation with
writes in flight is never let go of the cache, so a read never misses one.
The game's knowledge is small and read wholly when the file is opened.

Closing (L{MemoryStore.close}) runs after the writes already given: the whole
log is written back into the file and emptied, leaving the main file alone,
whole (the C{-wal} file empty).

The Python API (L{MemoryStore.conversation}, L{MemoryStore.briefs}) may read
on the caller's thread when what it asks is not loaded; the plugin's own
request path and client ops never do (L{MemoryStore.load},
L{MemoryStore.briefsLater}).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, succeed

from rpmiddleware.builtin.memory.conversation import (
    INTERRUPTED,
    Conversation,
    Entry,
    Fact,
    Key,
    MemoryItem,
)
from rpmiddleware.builtin.memory.exports import EXPORT_FORMAT, checksum, readExport
from rpmiddleware.builtin.memory.recall import Found
from rpmiddleware.builtin.memory.search import searchIndex
from rpmiddleware.builtin.memory.storeerrors import StoreError
from rpmiddleware.builtin.memory.storefile import WRITE_TIMEOUT, Known, StoreFile

_Row = tuple[Any, ...]


class MemoryStore(StoreFile):
    """
    Conversations, loaded and kept in memory (a bounded LRU), each change
    made there at once and written to the file (L{StoreFile}); what there
    is (L{briefs}); export and import; the game's knowledge.

    @param path: the database file; C{":memory:"} keeps everything in this
        process only.
    @param now: the clock entries are stamped with (the reactor's).
    @param cached: how many conversations are kept loaded, and how many
        session conversations are kept at all.
    @param reactor: where the store's threads hand results back; without
        one (or one without threads, a Clock) the work is done at once on
        the caller's thread.
    @param writeTimeout: seconds a write waits for a lock.
    """

    def __init__(
        self,
        path: str,
        now: Callable[[], float],
        cached: int = 1024,
        reactor: Any = None,
        writeTimeout: float = WRITE_TIMEOUT,
    ) -> None:
        super().__init__(path, now, reactor, writeTimeout)
        self._cached = max(cached, 1)
        self._loaded: OrderedDict[Key, Conversation] = OrderedDict()

    def loadedKeys(self) -> list[Key]:
        """The conversations loaded now (and the session ones kept)."""
        return list(self._loaded)

    # Conversations.

    def cached(self, key: Key) -> Conversation | None:
        """The conversation C{key} names if it is loaded (or a session's)."""
        found = self._loaded.get(key)
        if found is not None:
            self._loaded.move_to_end(key)
            return found
        if not key.persistent:
            return self._keep(key, Conversation(key, updated=self._now()))
        return None

    def _keep(self, key: Key, conversation: Conversation) -> Conversation:
        self._loaded[key] = conversation
        self._loaded.move_to_end(key)
        if len(self._loaded) > self._cached:
            for old in list(self._loaded):
                if len(self._loaded) <= self._cached:
                    break
                if old != key and old not in self._pending:
                    del self._loaded[old]
        return conversation

    def conversation(self, key: Key) -> Conversation:
        """
        The conversation C{key} names, loaded or new (a new one is written
        with its first change).  One not loaded is read on the caller's
        thread: the plugin calls L{load} first.
        """
        found = self.cached(key)
        if found is not None:
            return found
        read = self._read(self._callersDb(), key) if self._exists() else None
        return self._loadedAs(key, read)

    def load(self, key: Key) -> Deferred[Conversation]:
        """
        The conversation C{key} names, read on the reader's thread if it is
        not loaded; fails with L{StoreError} when it cannot be read.
        """
        found = self.cached(key)
        if found is not None:
            return succeed(found)
        if not self._exists():
            return succeed(self._loadedAs(key, None))

        def read() -> tuple[Conversation, int] | None:
            return self._read(self._readerDb(), key)

        return self._reader.run(read).addCallback(lambda read: self._loadedAs(key, read))

    def _loadedAs(self, key: Key, read: tuple[Conversation, int] | None) -> Conversation:
        found = self._loaded.get(key)
        if found is not None:
            # Made or changed while it was being read: the newer one stays.
            return found
        if read is None:
            return self._keep(key, Conversation(key, updated=self._now()))
        self._stored.add(key)
        return self._keep(key, read[0])

    def _read(self, db: sqlite3.Connection, key: Key) -> tuple[Conversation, int] | None:
        row = db.execute(
            "SELECT id, summary, summarized, updated FROM conversations "
            "WHERE integration = ? AND character = ? AND conversation = ?",
            (key.integrationId, key.characterId, key.conversationId),
        ).fetchone()
        if row is None:
            return None
        rowid, summary, summarized, updated = row
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
        memories = [
            MemoryItem(i, text, importance, at, source)
            for i, text, importance, at, source in db.execute(
                "SELECT id, text, importance, at, source FROM memories "
                "WHERE conversation = ? ORDER BY id",
                (rowid,),
            )
        ]
        state = {
            name: json.loads(value)
            for name, value in db.execute(
                "SELECT name, value FROM state WHERE conversation = ? ORDER BY name", (rowid,)
            )
        }
        found = Conversation(key, entries, summary, summarized, facts, updated, state=state)
        found.memories = memories
        return found, rowid

    def searchLater(
        self,
        key: Key,
        words: Sequence[str],
        recentFrom: int,
        older: int,
        recent: int,
        memories: int,
    ) -> Deferred[list[Found]]:
        """
        What conversation C{key} holds that any of C{words} finds, best
        first by BM25, read on the reader's thread (never the reactor's):
        the best C{older} of its entries before seq C{recentFrom}, the best
        C{recent} from it on (those the plan may give as history: every one
        of them, so that the rest are never crowded out), and its best
        C{memories}.  Only this conversation's rows are searched (its range
        of the index's row ids), and only with its rarer words
        (L{searchIndex}).  Nothing for a session's conversation (not in the
        file).
        """
        if not key.persistent or not self._exists() or not words:
            return succeed([])

        def read() -> list[Found]:
            db = self._readerDb()
            row = db.execute(
                "SELECT id FROM conversations "
                "WHERE integration = ? AND character = ? AND conversation = ?",
                (key.integrationId, key.characterId, key.conversationId),
            ).fetchone()
            if row is None:
                return []
            return searchIndex(db, int(row[0]), words, recentFrom, older, recent, memories)

        return self._reader.run(read)

    def append(
        self, conversation: Conversation, *entries: tuple[str, str, str, str]
    ) -> Deferred[str | None]:
        """
        Add entries (C{(role, speaker, text, status)} each) in one change.
        """
        at = self._now()
        made = []
        seq = conversation.nextSeq
        for role, speaker, text, status in entries:
            made.append(Entry(seq, role, text, status, speaker, at))
            seq += 1
        conversation.entries.extend(made)
        rows = [(e.seq, e.role, e.speaker, e.text, e.status, e.at) for e in made]

        def write(db: sqlite3.Connection, rowid: int) -> None:
            db.executemany(
                "INSERT INTO entries (conversation, seq, role, speaker, text, status, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(rowid, *row) for row in rows],
            )

        return self._change(conversation, "entries", write)

    def edit(self, conversation: Conversation, seq: int, text: str | None) -> Deferred[str | None]:
        """
        Change an entry's text, or remove it (C{text} C{None}).

        @raise KeyError: when it has no entry C{seq}.
        """
        entry = conversation.entry(seq)
        if entry is None:
            raise KeyError(seq)
        if text is None:
            conversation.entries.remove(entry)
        else:
            # A new entry, never a change in place: a save's copy of the
            # conversation (saves.py) shares the entries it was given.
            entries = conversation.entries
            entries[entries.index(entry)] = dataclasses.replace(entry, text=text)

        def write(db: sqlite3.Connection, rowid: int) -> None:
            if text is None:
                db.execute("DELETE FROM entries WHERE conversation = ? AND seq = ?", (rowid, seq))
            else:
                db.execute(
                    "UPDATE entries SET text = ? WHERE conversation = ? AND seq = ?",
                    (text, rowid, seq),
                )

        return self._change(conversation, "edit", write)

    def cut(self, conversation: Conversation, seq: int, text: str) -> Deferred[str | None]:
        """
        Entry C{seq} was heard only as far as C{text}: its words become
        that, marked as cut off (L{INTERRUPTED}); or, when C{text} is
        empty, it goes (nothing of it was heard).

        @raise KeyError: when it has no entry C{seq}.
        """
        entry = conversation.entry(seq)
        if entry is None:
            raise KeyError(seq)
        if not text:
            return self.edit(conversation, seq, None)
        entries = conversation.entries
        entries[entries.index(entry)] = dataclasses.replace(entry, text=text, status=INTERRUPTED)

        def write(db: sqlite3.Connection, rowid: int) -> None:
            db.execute(
                "UPDATE entries SET text = ?, status = ? WHERE conversation = ? AND seq = ?",
                (text, INTERRUPTED, rowid, seq),
            )

        return self._change(conversation, "edit", write)

    def summarize(
        self, conversation: Conversation, summary: str, through: int
    ) -> Deferred[str | None]:
        conversation.summary = summary
        conversation.summarizedThrough = max(conversation.summarizedThrough, through)
        return self._change(conversation, "summary", lambda db, rowid: None)

    def pin(self, conversation: Conversation, text: str) -> Fact:
        """
        Pin a fact; its write is in L{collect}'s list.
        """
        if conversation.key.persistent:
            self._open()
            factId = self._nextFact
            self._nextFact += 1
        else:
            factId = max((f.id for f in conversation.facts), default=0) + 1
        fact = Fact(factId, text)
        conversation.facts.append(fact)

        def write(db: sqlite3.Connection, rowid: int) -> None:
            db.execute(
                "INSERT INTO facts (id, conversation, text) VALUES (?, ?, ?)",
                (factId, rowid, text),
            )

        self._change(conversation, "fact", write)
        return fact

    def unpin(self, conversation: Conversation, factId: int) -> Deferred[str | None]:
        """
        @raise KeyError: when the conversation has no such fact.
        """
        fact = next((f for f in conversation.facts if f.id == factId), None)
        if fact is None:
            raise KeyError(factId)
        conversation.facts.remove(fact)
        return self._change(
            conversation,
            "unpin",
            lambda db, rowid: db.execute("DELETE FROM facts WHERE id = ?", (factId,)),
        )

    def setState(self, conversation: Conversation, name: str, value: Any) -> Deferred[str | None]:
        """
        Keep C{value} (anything JSON can write) under C{name} with the
        conversation, replacing what was there; C{None} removes it.  What a
        plugin keeps of a conversation beside its entries (the memory
        plugin's attitudes, a character's mood): read back as
        C{conversation.state[name]}, exported and restored with it, forgotten
        with it.  Its write is in L{collect}'s list.

        @raise ValueError: when C{name} is empty or C{value} is not JSON.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError("a state name must be a non-empty string")
        text = None if value is None else json.dumps(value, ensure_ascii=False, allow_nan=False)
        if text is None:
            conversation.state.pop(name, None)
        else:
            conversation.state[name] = json.loads(text)

        def write(db: sqlite3.Connection, rowid: int) -> None:
            if text is None:
                db.execute("DELETE FROM state WHERE conversation = ? AND name = ?", (rowid, name))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO state (conversation, name, value) VALUES (?, ?, ?)",
                    (rowid, name, text),
                )

        return self._change(conversation, "state", write)

    def remember(
        self, conversation: Conversation, text: str, importance: float = 0.5, source: str = "game"
    ) -> Deferred[str | None]:
        """
        Keep a moment in a line of its own (L{MemoryItem}): changed in
        memory at once, written on the writer, and recalled like an entry
        from the next plan on.

        @raise ValueError: when C{text} is empty, C{importance} is not a
            number from 0 to 1, or C{source} is not a short word.
        """
        text = text.strip() if isinstance(text, str) else ""
        if not text:
            raise ValueError("a memory's text must be a non-empty string")
        if (
            isinstance(importance, bool)
            or not isinstance(importance, int | float)
            or not 0.0 <= importance <= 1.0
        ):
            raise ValueError("a memory's importance must be a number from 0 to 1")
        if not isinstance(source, str) or not source.strip() or len(source) > 40:
            raise ValueError('a memory\'s source must be a short word ("reflection", "game")')
        if conversation.key.persistent:
            self._open()
            memoryId = self._nextMemory
            self._nextMemory += 1
        else:
            memoryId = max((m.id for m in conversation.memories), default=0) + 1
        item = MemoryItem(memoryId, text, float(importance), self._now(), source.strip())
        conversation.memories.append(item)

        def write(db: sqlite3.Connection, rowid: int) -> None:
            db.execute(
                "INSERT INTO memories (id, conversation, text, importance, at, source) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (item.id, rowid, item.text, item.importance, item.at, item.source),
            )

        return self._change(conversation, "memory", write)

    def forget(self, key: Key) -> bool:
        """
        Remove a conversation wholly; whether there was one.
        """
        found = self._loaded.pop(key, None)
        if not key.persistent:
            return found is not None
        existed = key in self._stored or bool(
            found is not None and (found.entries or found.facts or found.summary)
        )
        if found is None and not existed and self._exists():
            existed = self._read(self._callersDb(), key) is not None
        # An empty one stands for it until the delete is written.
        self._keep(key, Conversation(key, updated=self._now()))
        self._stored.discard(key)
        self._write(key, "forget", lambda db: self._delete(db, key))
        return existed

    def _delete(self, db: sqlite3.Connection, key: Key) -> None:
        self._ids.pop(key, None)
        db.execute(
            "DELETE FROM conversations WHERE integration = ? AND character = ? "
            "AND conversation = ?",
            (key.integrationId, key.characterId, key.conversationId),
        )

    def isLoaded(self, key: Key) -> bool:
        """Whether conversation C{key} is kept in memory now."""
        return key in self._loaded

    def dropConversations(self, conversationId: str) -> list[Key]:
        """
        Let go of the loaded conversations named C{conversationId}, whatever
        their character (a session's, which are never written).
        """
        keys = [k for k in self._loaded if k.conversationId == conversationId]
        for key in keys:
            del self._loaded[key]
        return keys

    # What there is.

    _BRIEFS = (
        "SELECT integration, character, conversation, summary != '', updated, "
        "(SELECT count(*) FROM entries WHERE entries.conversation = c.id), "
        "(SELECT count(*) FROM facts WHERE facts.conversation = c.id) "
        "FROM conversations AS c"
    )

    def briefs(
        self, integrationId: str | None = None, characterId: str | None = None
    ) -> list[dict[str, Any]]:
        """
        What conversations there are (L{Conversation.brief}), maybe of one
        integration or character: the loaded ones as they are, the rest
        counted in the database without reading their entries (on the
        caller's thread: the plugin's client ops use L{briefsLater}).
        """
        if self._closed:
            raise StoreError(f"the memory database {self.path} is closed (the daemon is stopping)")
        rows = self._callersDb().execute(self._BRIEFS).fetchall() if self._exists() else []
        return self._briefs(rows, integrationId, characterId)

    def briefsLater(
        self, integrationId: str | None = None, characterId: str | None = None
    ) -> Deferred[list[dict[str, Any]]]:
        """L{briefs}, read on the reader's thread."""
        if not self._exists():
            return succeed(self._briefs([], integrationId, characterId))

        def read() -> list[_Row]:
            return self._readerDb().execute(self._BRIEFS).fetchall()

        return self._reader.run(read).addCallback(self._briefs, integrationId, characterId)

    def _briefs(
        self, rows: list[_Row], integrationId: str | None, characterId: str | None
    ) -> list[dict[str, Any]]:
        def wanted(key: Key) -> bool:
            return (integrationId is None or key.integrationId == integrationId) and (
                characterId is None or key.characterId == characterId
            )

        loaded = {k: c for k, c in self._loaded.items() if wanted(k)}
        found = {k: c.brief() for k, c in loaded.items() if c.entries or c.facts or c.summary}
        for integration, character, name, summarized, updated, entries, facts in rows:
            key = Key(integration, character, name)
            if wanted(key) and key not in loaded:
                brief = {"entries": entries, "facts": facts, "summarized": bool(summarized)}
                found[key] = {**key.asDict(), **brief, "updated": updated}
        return list(found.values())

    # Export and import.

    def export(self, conversation: Conversation) -> dict[str, Any]:
        """
        The conversation as a document for a game's save: with its entry
        count and a checksum of its content, which L{restore} verifies.
        """
        body = conversation.asDict()
        return {
            "format": EXPORT_FORMAT,
            **body,
            "entryCount": len(conversation.entries),
            "checksum": checksum(body),
        }

    def restore(
        self, key: Key, document: Any, empty: bool = False, unverified: bool = False
    ) -> Conversation:
        """
        Replace conversation C{key} with an L{export}ed document (a game's
        save file), in one change: a kill leaves the old one or the new.  A
        document with no entries is refused unless C{empty} says that is
        meant; an export of the older, unsealed format unless C{unverified}
        says the game takes it as it is.  Its write is in L{collect}'s list.

        @raise InvalidDocument: naming what is wrong with C{document}.
        """
        return self.replace(key, readExport(key, document, empty, unverified))

    def replace(self, key: Key, conversation: Conversation) -> Conversation:
        """
        Replace conversation C{key} with C{conversation}, read from an
        export (L{parseExport}: a save being loaded parses its documents
        on the store's thread), in one change: a kill leaves the old one or
        the new.  Its write is in L{collect}'s list.
        """
        write = self._replacing(key, conversation)
        if write is not None:
            self._write(key, "import", write)
        return conversation

    def replaceAll(
        self, conversations: Sequence[Conversation], forgotten: Sequence[Key]
    ) -> Deferred[str | None]:
        """
        Replace each of C{conversations} (under its own key) and forget each
        of C{forgotten}, in memory now and in the file in one transaction: a
        kill leaves all of them as they were, or all as they are now (a
        save loaded).  The Deferred fires with C{None} once written, or why
        it was not; it is in L{collect}'s list.
        """
        writes = [self._replacing(c.key, c) for c in conversations]
        for key in forgotten:
            # An empty one stands for it until the delete is written.
            self._loaded.pop(key, None)
            self._keep(key, Conversation(key, updated=self._now()))
            self._stored.discard(key)
        keys = [c.key for c in conversations if c.key.persistent]
        gone = [k for k in forgotten if k.persistent]
        for key in (*keys, *gone):
            # Kept loaded until written, as any conversation with a write.
            self._pending[key] = self._pending.get(key, 0) + 1

        def work(db: sqlite3.Connection) -> None:
            for key in gone:
                self._delete(db, key)
            for write in writes:
                if write is not None:
                    write(db)

        def done(why: str | None) -> str | None:
            for key in (*keys, *gone):
                left = self._pending.get(key, 1) - 1
                if left:
                    self._pending[key] = left
                else:
                    self._pending.pop(key, None)
            if why is None:
                self._stored.update(keys)
            return why

        return self._write(None, "load-save", work).addCallback(done)

    def _replacing(
        self, key: Key, conversation: Conversation
    ) -> Callable[[sqlite3.Connection], None] | None:
        """
        L{replace} in memory now; what writes it (a game's conversation),
        for the writer's thread.
        """
        conversation.key = key
        conversation.updated = self._now()
        if key.persistent:
            self._open()
            for fact in conversation.facts:
                fact.id = self._nextFact
                self._nextFact += 1
            for item in conversation.memories:
                item.id = self._nextMemory
                self._nextMemory += 1
        self._loaded.pop(key, None)
        self._keep(key, conversation)
        if key.persistent:
            # Its rows are made on the writer's thread (a long one's are
            # many): the entries are replaced, never changed in place, so a
            # copy of the list is what it holds now.
            entries = list(conversation.entries)
            facts = [(f.id, f.text) for f in conversation.facts]
            states = [(name, json.dumps(value)) for name, value in conversation.state.items()]
            memories = [(m.id, m.text, m.importance, m.at, m.source) for m in conversation.memories]
            summary, through = conversation.summary, conversation.summarizedThrough
            updated = conversation.updated

            def write(db: sqlite3.Connection) -> None:
                self._delete(db, key)
                rowid = self._rowid(db, key, summary, through, updated)
                db.executemany(
                    "INSERT INTO entries (conversation, seq, role, speaker, text, status, at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(rowid, e.seq, e.role, e.speaker, e.text, e.status, e.at) for e in entries],
                )
                db.executemany(
                    "INSERT INTO facts (id, conversation, text) VALUES (?, ?, ?)",
                    [(i, rowid, text) for i, text in facts],
                )
                db.executemany(
                    "INSERT INTO state (conversation, name, value) VALUES (?, ?, ?)",
                    [(rowid, name, value) for name, value in states],
                )
                db.executemany(
                    "INSERT INTO memories (id, conversation, text, importance, at, source) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, rowid, *rest) for i, *rest in memories],
                )

            return write
        return None

    # The game's knowledge, kept wholly in memory.

    def _knowledge(self) -> dict[str, list[Known]]:
        if self._known is None:
            if not self._exists():
                return {}
            self._open()
        assert self._known is not None
        return self._known

    def knowledge(self, integrationId: str) -> list[Known]:
        """
        The game's knowledge entries of an integration: C{(id, scope, entry)}.
        """
        return list(self._knowledge().get(integrationId, ()))

    def know(self, integrationId: str, scope: str, entry: dict[str, Any]) -> int:
        """Add knowledge; its write is in L{collect}'s list."""
        self._open()
        known = self._knowledge()
        knowledgeId = self._nextKnowledge
        self._nextKnowledge += 1
        known.setdefault(integrationId, []).append((knowledgeId, scope, entry))
        text = json.dumps(entry)
        self._write(
            None,
            "knowledge",
            lambda db: db.execute(
                "INSERT INTO knowledge (id, integration, scope, entry) VALUES (?, ?, ?, ?)",
                (knowledgeId, integrationId, scope, text),
            ),
        )
        return knowledgeId

    def unknow(self, integrationId: str, knowledgeId: int) -> bool:
        known = self._knowledge().get(integrationId, [])
        found = [k for k in known if k[0] == knowledgeId]
        if not found:
            return False
        known.remove(found[0])
        self._write(
            None,
            "knowledge",
            lambda db: db.execute(
                "DELETE FROM knowledge WHERE integration = ? AND id = ?",
                (integrationId, knowledgeId),
            ),
        )
        return True
