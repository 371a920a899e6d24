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
import hashlib
import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.python.failure import Failure

from rpmiddleware.builtin.memory.conversation import (
    INTERRUPTED,
    ROLES,
    STATUSES,
    Conversation,
    Entry,
    Fact,
    Key,
    MemoryItem,
)
from rpmiddleware.builtin.memory.recall import Found
from rpmiddleware.builtin.memory.search import searchIndex
from rpmiddleware.builtin.memory.writer import Lane

SCHEMA_VERSION = 1
EXPORT_FORMAT = "rpmiddleware.memory/2"
#: The exports made before they were sealed (no entry count, no checksum):
#: imported only when the game says it takes them as they are.
UNSEALED_FORMAT = "rpmiddleware.memory/1"
#: Seconds a write waits for a lock another process holds (SQLite's busy
#: handler retries meanwhile) before it is given up and reported.
WRITE_TIMEOUT = 30.0
#: Seconds start-up waits for a lock before it refuses the store.
OPEN_TIMEOUT = 2.0

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
CREATE TABLE IF NOT EXISTS state (
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (conversation, name)
);
CREATE TABLE IF NOT EXISTS knowledge (
    id INTEGER PRIMARY KEY,
    integration TEXT NOT NULL,
    scope TEXT NOT NULL,
    entry TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS saves (
    id INTEGER PRIMARY KEY,
    integration TEXT NOT NULL,
    conversation TEXT NOT NULL,
    save TEXT NOT NULL,
    created REAL NOT NULL,
    characters TEXT NOT NULL,
    entries INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    body TEXT NOT NULL,
    checksum TEXT NOT NULL,
    UNIQUE (integration, conversation, save)
);
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    text TEXT NOT NULL,
    importance REAL NOT NULL DEFAULT 0.5,
    at REAL NOT NULL,
    source TEXT NOT NULL DEFAULT 'game'
);
CREATE INDEX IF NOT EXISTS memories_conversation ON memories (conversation);
"""

#: The full-text index of what conversations remember (recall): one FTS5
#: table over the entries and the memories that keeps no copy of their text
#: (external content: the view C{recall_source}) and is kept in step by
#: triggers, so that every writer (this one, a restore, a cascade of a
#: forget) keeps it right.  Its row ids are our own and stable (an entry's
#: implicit rowid may change with VACUUM): an entry's is its conversation's
#: row id times L{search.RECALL_SPAN} plus its seq, a memory's the same with its
#: id, negated; so one conversation's entries are one range of ids and its
#: memories another, which FTS5 searches without reading the rest.
_RECALL_SCHEMA = (
    """
CREATE VIEW IF NOT EXISTS recall_source (rid, text) AS
    SELECT conversation * 4294967296 + seq, text FROM entries
    UNION ALL SELECT -(conversation * 4294967296 + id), text FROM memories
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_entry_added AFTER INSERT ON entries BEGIN
    INSERT INTO recall (rowid, text) VALUES (new.conversation * 4294967296 + new.seq, new.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_entry_removed AFTER DELETE ON entries BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', old.conversation * 4294967296 + old.seq, old.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_entry_changed AFTER UPDATE OF text ON entries BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', old.conversation * 4294967296 + old.seq, old.text);
    INSERT INTO recall (rowid, text) VALUES (new.conversation * 4294967296 + new.seq, new.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_memory_added AFTER INSERT ON memories BEGIN
    INSERT INTO recall (rowid, text) VALUES (-(new.conversation * 4294967296 + new.id), new.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_memory_removed AFTER DELETE ON memories BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', -(old.conversation * 4294967296 + old.id), old.text);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS recall_memory_changed AFTER UPDATE OF text ON memories BEGIN
    INSERT INTO recall (recall, rowid, text)
    VALUES ('delete', -(old.conversation * 4294967296 + old.id), old.text);
    INSERT INTO recall (rowid, text) VALUES (-(new.conversation * 4294967296 + new.id), new.text);
END
""",
)
_RECALL_TABLE = (
    "CREATE VIRTUAL TABLE recall USING fts5 (text, content='recall_source', "
    "content_rowid='rid', tokenize='porter unicode61 remove_diacritics 2')"
)


def _indexForRecall(db: sqlite3.Connection) -> None:
    """
    Make the recall index if the file has none (a file written before it,
    or a new one), filled at once from what the file holds (a one-time
    C{rebuild}), and its triggers; inside the opening transaction.
    """
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'recall'"
    ).fetchone()
    if found is None:
        db.execute(_RECALL_TABLE)
    for statement in _RECALL_SCHEMA:
        db.execute(statement)
    if found is None:
        db.execute("INSERT INTO recall (recall) VALUES ('rebuild')")


_Row = tuple[Any, ...]
T = TypeVar("T")
Known = tuple[int, str, dict[str, Any]]


class StoreError(Exception):
    """
    The store cannot do what was asked (the file cannot be opened or
    written, or a document to import is wrong); the message says what.
    """


class InvalidDocument(StoreError):
    """A document to import is not an exported conversation."""


def describe(error: BaseException | None) -> str:
    """What went wrong, in words for a log and a game."""
    if isinstance(error, StoreError):
        return str(error)
    if isinstance(error, sqlite3.Error):
        return f"SQLite: {error}"
    return f"{type(error).__name__}: {error}"


class MemoryStore:
    """
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
        self.path = path
        self._now = now
        self._cached = max(cached, 1)
        self._writeTimeout = writeTimeout
        self._memoryOnly = path == ":memory:"
        self._writer = Lane(reactor, "rpmiddleware-memory-writer")
        self._reader = (
            self._writer if self._memoryOnly else Lane(reactor, "rpmiddleware-memory-reader")
        )
        self._opening = threading.Lock()
        self._closed = False
        self._db: sqlite3.Connection | None = None
        self._readDb: sqlite3.Connection | None = None
        self._callerDb: sqlite3.Connection | None = None
        self._loaded: OrderedDict[Key, Conversation] = OrderedDict()
        #: Writes in flight per conversation: such a one stays loaded.
        self._pending: dict[Key, int] = {}
        #: Conversations known to be in the file.
        self._stored: set[Key] = set()
        #: The writer's row ids (its thread only).
        self._ids: dict[Key, int] = {}
        self._known: dict[str, list[Known]] | None = None
        self._nextFact = 1
        self._nextMemory = 1
        self._nextKnowledge = 1
        #: Committed transactions, and writes given up, for /metrics.
        self.writes = 0
        self.lost = 0
        #: Told of every write given up: the conversation (None for the
        #: game's knowledge), what it was, and why.
        self.onLost: Callable[[Key | None, str, str], None] = lambda key, what, why: None
        #: While a list, every write's Deferred is added to it (L{collect}).
        self._collecting: list[Deferred[str | None]] | None = None

    # The file.

    def _checkWritable(self) -> None:
        """
        Make the store's folder if there is none, and refuse a store this
        user cannot write with the cause in words: SQLite says only "unable
        to open database file" for a read-only folder (where it keeps the
        C{-wal} and C{-shm} files beside the store).
        """
        path = os.path.abspath(self.path)
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            try:
                os.makedirs(folder)
            except OSError as e:
                raise StoreError(f"cannot create the memory folder {folder}: {e.strerror}")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise StoreError(f"cannot write the memory database {path}: the file is read-only")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StoreError(
                f"cannot write the memory database {path}: its folder {folder} is read-only "
                "(SQLite keeps the store and its -wal and -shm files there)"
            )

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout={int(self._writeTimeout * 1000)}")
        return db

    def _open(self) -> sqlite3.Connection:
        """
        The writer's connection (opened on the calling thread the first
        time: at start-up, L{check}, else in the writer).
        """
        with self._opening:
            if self._db is not None:
                return self._db
            if self._closed:
                raise StoreError(
                    f"the memory database {self.path} is closed (the daemon is stopping)"
                )
            if not self._memoryOnly:
                self._checkWritable()
            try:
                db = self._connect()
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA foreign_keys=ON")
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path} was written by a newer rpmiddleware (memory schema "
                        f"{version}; this one reads {SCHEMA_VERSION})"
                    )
                # A write at once, so that a file that cannot be written
                # (read-only, locked) is said now, not at the first turn.
                # A short wait here: a store locked at start-up is refused.
                db.execute(f"PRAGMA busy_timeout={int(OPEN_TIMEOUT * 1000)}")
                db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            db.execute(statement)
                    _indexForRecall(db)
                    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                db.execute(f"PRAGMA busy_timeout={int(self._writeTimeout * 1000)}")
                facts = db.execute("SELECT coalesce(max(id), 0) FROM facts").fetchone()[0]
                memories = db.execute("SELECT coalesce(max(id), 0) FROM memories").fetchone()[0]
                known: dict[str, list[Known]] = {}
                for i, integration, scope, entry in db.execute(
                    "SELECT id, integration, scope, entry FROM knowledge ORDER BY id"
                ):
                    known.setdefault(integration, []).append((i, scope, json.loads(entry)))
                    self._nextKnowledge = max(self._nextKnowledge, i + 1)
            except sqlite3.Error as e:
                raise StoreError(f"cannot open the memory database {self.path} for writing: {e}")
            except OSError as e:
                raise StoreError(f"cannot open the memory database {self.path}: {e}")
            self._nextFact = max(self._nextFact, facts + 1)
            self._nextMemory = max(self._nextMemory, memories + 1)
            self._known = known
            self._db = db
            return db

    def _exists(self) -> bool:
        """Whether there is a database to read (without creating one)."""
        return self._db is not None or (not self._memoryOnly and os.path.exists(self.path))

    def _readerDb(self) -> sqlite3.Connection:
        """The reader's connection (its thread only)."""
        if self._memoryOnly:
            return self._open()
        if self._closed:
            raise StoreError(f"the memory database {self.path} is closed (the daemon is stopping)")
        if self._readDb is None:
            self._readDb = self._connect()
        return self._readDb

    def _callersDb(self) -> sqlite3.Connection:
        """A connection for the Python API's reads on the caller's thread."""
        if self._memoryOnly or not self._writer.threaded:
            return self._open()
        if self._closed:
            raise StoreError(f"the memory database {self.path} is closed (the daemon is stopping)")
        if self._callerDb is None:
            self._open()
            self._callerDb = self._connect()
        return self._callerDb

    def check(self) -> None:
        """
        Open the file now (at start-up), creating it, and write to it, so
        that a store that cannot be written is said then.

        @raise StoreError: naming the path and what is wrong.
        """
        self._open()

    def close(self) -> Deferred[None]:
        """
        Stop taking changes now (one given later is reported lost), and,
        after the writes already given, write the whole log back into the
        file, empty it (C{wal_checkpoint(TRUNCATE)}) and close.  Closing
        twice does nothing more.
        """
        if self._closed:
            return succeed(None)
        self._closed = True

        def closeReaders() -> None:
            for db in (self._readDb, self._callerDb):
                if db is not None:
                    db.close()
            self._readDb = self._callerDb = None

        def closeWriter() -> None:
            with self._opening:
                db, self._db = self._db, None
            if db is None:
                return
            try:
                if not self._memoryOnly:
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                db.close()

        readers = succeed(None) if self._reader is self._writer else self._reader.run(closeReaders)
        if self._reader is self._writer:
            closeReaders()

        def writer(_: object) -> Deferred[None]:
            return self._writer.run(closeWriter)

        def stopped(result: object) -> object:
            self._reader.stop()
            self._writer.stop()
            return result

        d: Deferred[Any] = readers.addBoth(writer)
        return d.addBoth(stopped)

    # Work of other parts of the plugin (saves, pruning, the store's size).

    def transaction(
        self, what: str, work: Callable[[sqlite3.Connection], T], write: bool = True
    ) -> Deferred[T]:
        """
        C{work} with the writer's connection, as one transaction, on the
        writer's thread after every write given before it (so it sees them
        all): its result, or its failure.  A write (C{write}) that fails
        in SQLite is counted and reported as lost, like any other.
        """

        def transaction() -> T:
            db = self._open()
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = work(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return result

        def kept(result: T) -> T:
            if write:
                self.writes += 1
            return result

        def lost(failure: Failure) -> Failure:
            if write and failure.check(sqlite3.Error, StoreError):
                self.lost += 1
                self.onLost(None, what, describe(failure.value))
            return failure

        if self._closed:
            d: Deferred[T] = maybeDeferred(self._refuseClosed)
        else:
            d = self._writer.run(transaction)
        return d.addCallbacks(kept, lost)

    def _refuseClosed(self) -> Any:
        raise StoreError(f"the memory database {self.path} is closed (the daemon is stopping)")

    def compact(self) -> Deferred[None]:
        """
        Give the space of what was deleted back to the disk (C{VACUUM}, then
        the log written back and emptied), on the writer's thread.  It
        rewrites the whole file: other writes wait meanwhile, the reactor
        does not.
        """

        def vacuum() -> None:
            db = self._open()
            # A full-text index keeps what was deleted as markers until its
            # segments are merged: merged first, or it would not shrink.
            for (table,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%USING fts5%'"
            ).fetchall():
                db.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")
            db.execute("VACUUM")
            if not self._memoryOnly:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        if self._closed:
            return maybeDeferred(self._refuseClosed)
        return self._writer.run(vacuum)

    def size(self) -> Deferred[dict[str, int]]:
        """
        How big the store is: C{bytes} (the file and its C{-wal} log; for
        a store in memory, its pages), C{conversations}, C{entries} and
        C{saves}, read on the reader's thread (the file's size too: a
        stat on a slow disk never holds up the reactor).
        """
        if not self._exists():
            return succeed({"bytes": 0, "conversations": 0, "entries": 0, "saves": 0})

        def measure() -> dict[str, int]:
            db = self._readerDb()
            if self._memoryOnly:
                pages = db.execute("PRAGMA page_count").fetchone()[0]
                size = pages * db.execute("PRAGMA page_size").fetchone()[0]
            else:
                size = sum(
                    os.path.getsize(p) for p in (self.path, self.path + "-wal") if os.path.exists(p)
                )
            count = {
                table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("conversations", "entries", "saves")
            }
            return {"bytes": int(size), **count}

        return self._reader.run(measure)

    def loadedKeys(self) -> list[Key]:
        """The conversations loaded now (and the session ones kept)."""
        return list(self._loaded)

    @property
    def queued(self) -> int:
        """Work given to the store's threads and not finished."""
        reader = 0 if self._reader is self._writer else self._reader.waiting
        return self._writer.waiting + reader

    # Writing.

    def collect(self) -> list[Deferred[str | None]]:
        """
        Start collecting the writes given from now (L{collected} ends it):
        how a client op learns whether what it changed was kept.
        """
        self._collecting = []
        return self._collecting

    def collected(self) -> list[Deferred[str | None]]:
        found, self._collecting = self._collecting or [], None
        return found

    def _write(
        self, key: Key | None, what: str, work: Callable[[sqlite3.Connection], object]
    ) -> Deferred[str | None]:
        """
        Give C{work} to the writer, as one transaction; the Deferred fires
        with C{None} once it is committed, or with why it was not (which
        L{onLost} is told too).
        """
        if key is not None:
            self._pending[key] = self._pending.get(key, 0) + 1

        def transaction() -> None:
            db = self._open()
            db.execute("BEGIN IMMEDIATE")
            try:
                work(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        def done(result: object) -> object:
            if key is not None:
                left = self._pending.get(key, 1) - 1
                if left:
                    self._pending[key] = left
                else:
                    self._pending.pop(key, None)
            return result

        def kept(_: object) -> None:
            self.writes += 1
            if key is not None:
                self._stored.add(key)
            return None

        def lost(failure: Failure) -> str:
            why = describe(failure.value)
            self.lost += 1
            self.onLost(key, what, why)
            return why

        if self._closed:
            d: Deferred[Any] = succeed(None).addCallback(
                lambda _: transaction()  # fails: the store is closed
            )
        else:
            d = self._writer.run(transaction)
        d.addBoth(done).addCallbacks(kept, lost)
        if self._collecting is not None:
            self._collecting.append(d)
        return d

    def _rowid(
        self,
        db: sqlite3.Connection,
        key: Key,
        summary: str = "",
        through: int = 0,
        updated: float = 0.0,
    ) -> int:
        """The conversation's row in the file, made if need be (the writer's thread)."""
        rowid = self._ids.get(key)
        if rowid is None:
            row = db.execute(
                "SELECT id FROM conversations "
                "WHERE integration = ? AND character = ? AND conversation = ?",
                (key.integrationId, key.characterId, key.conversationId),
            ).fetchone()
            if row is not None:
                rowid = int(row[0])
            else:
                cursor = db.execute(
                    "INSERT INTO conversations (integration, character, conversation, summary, "
                    "summarized, updated) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        key.integrationId,
                        key.characterId,
                        key.conversationId,
                        summary,
                        through,
                        updated,
                    ),
                )
                assert cursor.lastrowid is not None
                rowid = cursor.lastrowid
            self._ids[key] = rowid
        return rowid

    def _change(
        self,
        conversation: Conversation,
        what: str,
        work: Callable[[sqlite3.Connection, int], object],
    ) -> Deferred[str | None]:
        """
        One change to C{conversation}, already made in memory: for a game's,
        its write (C{work} with the row id, and the conversation's summary
        and time as they are now); nothing to write for a session's.
        """
        conversation.updated = self._now()
        key = conversation.key
        if not key.persistent:
            return succeed(None)
        summary, through, updated = (
            conversation.summary,
            conversation.summarizedThrough,
            conversation.updated,
        )

        def write(db: sqlite3.Connection) -> None:
            rowid = self._rowid(db, key, summary, through, updated)
            work(db, rowid)
            db.execute(
                "UPDATE conversations SET summary = ?, summarized = ?, updated = ? WHERE id = ?",
                (summary, through, updated, rowid),
            )

        return self._write(key, what, write)

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
        return self.replace(key, _parseExport(key, document, empty, unverified))

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


def checksum(body: dict[str, Any]) -> str:
    """
    SHA-256 of an exported conversation's content (summary, facts' texts,
    entries), each number as the float or int it means, so that a game's
    JSON library (which may write C{5.0} as C{5}) does not change it.
    """
    content = [
        body.get("summary"),
        body.get("summarizedThrough"),
        [f.get("text") if isinstance(f, dict) else f for f in body.get("facts") or []],
        [
            [
                e.get("seq"),
                e.get("role"),
                e.get("speaker", ""),
                e.get("text"),
                e.get("status", "complete"),
                float(e.get("at", 0.0)) if isinstance(e.get("at", 0.0), int | float) else 0.0,
            ]
            if isinstance(e, dict)
            else e
            for e in body.get("entries") or []
        ],
    ]
    if body.get("state"):
        # Sealed with the rest when there is some (older exports have none),
        # its keys in order (a game's JSON library may write them in any).
        content.append(["state", json.dumps(body["state"], sort_keys=True)])
    if body.get("memories"):
        # Sealed with the rest when there are some (older exports have none).
        content.append(["memories", [_sealedMemory(m) for m in body["memories"]]])
    digest = hashlib.sha256()
    for piece in _inPieces(content):
        digest.update(piece.encode("ascii"))
    return digest.hexdigest()


#: Items of a long list JSON-encoded in one call (L{_inPieces}).
PIECE = 256


def _inPieces(content: list[Any]) -> Iterator[str]:
    """
    C{json.dumps(content, ensure_ascii=True, separators=(",", ":"))}, the
    same text, in pieces: a long list in it (the entries) a few hundred
    items at a time, so that no one call holds Python's lock for long (a
    save seals conversations of thousands of entries on the store's thread
    while the reactor runs).
    """
    yield "["
    for i, item in enumerate(content):
        if i:
            yield ","
        if isinstance(item, list) and len(item) > PIECE:
            yield "["
            for start in range(0, len(item), PIECE):
                if start:
                    yield ","
                yield _compact(item[start : start + PIECE])[1:-1]
            yield "]"
        else:
            yield _compact(item)
    yield "]"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def _sealedMemory(item: Any) -> Any:
    """A memory as its checksum sees it: numbers as the floats they mean."""
    if not isinstance(item, dict):
        return item

    def number(value: Any) -> Any:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else value

    return [
        item.get("text"),
        number(item.get("importance", 0.5)),
        number(item.get("at", 0.0)),
        item.get("source", "game"),
    ]


def parseExport(key: Key, document: Any) -> Conversation:
    """
    An exported document read as L{MemoryStore.restore} reads it (one with
    no entries taken), for L{MemoryStore.replace}: a save's documents are
    each read, on the store's thread, before any conversation is replaced.

    @raise InvalidDocument: naming what is wrong with it.
    """
    return _parseExport(key, document, True, False)


def _parseExport(
    key: Key, document: Any, empty: bool = False, unverified: bool = False
) -> Conversation:
    if not isinstance(document, dict):
        raise InvalidDocument(
            f'an imported conversation must be an object with format "{EXPORT_FORMAT}"'
        )
    got = document.get("format")
    unsealed = got == UNSEALED_FORMAT
    if got != EXPORT_FORMAT and not unsealed:
        raise InvalidDocument(
            f'an imported conversation must have format "{EXPORT_FORMAT}"; this one has '
            + (json.dumps(got) if isinstance(got, str) else "none")
        )
    if unsealed and not unverified:
        raise InvalidDocument(
            f'this export has the older format "{UNSEALED_FORMAT}", which carries no entry '
            "count or checksum, so a cut or changed one cannot be told from a whole one: send "
            "unverified: true to import it as it is (then export it again to seal it)"
        )
    if "entries" not in document:
        raise InvalidDocument("the document has no entries (it is not a whole export)")
    count, sealed = document.get("entryCount"), document.get("checksum")
    if unsealed:
        count, sealed = len(document["entries"]) if isinstance(document["entries"], list) else 0, ""
    elif isinstance(count, bool) or not isinstance(count, int) or not isinstance(sealed, str):
        raise InvalidDocument("the document has no entryCount and checksum (not a whole export)")
    if isinstance(document["entries"], list) and len(document["entries"]) != count:
        raise InvalidDocument(
            f"the document holds {len(document['entries'])} entries but was exported with "
            f"{count}: it was cut or changed"
        )
    if not document["entries"] and not empty:
        raise InvalidDocument(
            "the document has no entries; importing it would leave the conversation empty "
            "(send empty: true if that is meant)"
        )
    summary = document.get("summary", "")
    through = document.get("summarizedThrough", 0)
    if not isinstance(summary, str):
        raise InvalidDocument("summary must be a string")
    if isinstance(through, bool) or not isinstance(through, int) or through < 0:
        raise InvalidDocument("summarizedThrough must be a whole number of at least 0")
    entries: list[Entry] = []
    raw = document["entries"]
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
    state = document.get("state", {})
    if not isinstance(state, dict) or not all(isinstance(k, str) and k for k in state):
        raise InvalidDocument("state must be an object of named values")
    memories = _parseMemories(document.get("memories", []))
    if not unsealed and checksum(document) != sealed:
        raise InvalidDocument(
            "the document's checksum does not match its content: it was changed after export"
        )
    found = Conversation(key, entries, summary, through, facts, state=dict(state))
    found.memories = memories
    return found


def _parseMemories(raw: Any) -> list[MemoryItem]:
    """An export's C{memories} (none in exports made before them)."""
    if not isinstance(raw, list):
        raise InvalidDocument("memories must be a list")
    found = []
    for i, item in enumerate(raw):
        where = f"memories[{i}]"
        if not isinstance(item, dict):
            raise InvalidDocument(f"{where} must be an object")
        text, importance = item.get("text"), item.get("importance", 0.5)
        at, source = item.get("at", 0.0), item.get("source", "game")
        if not isinstance(text, str) or not text.strip():
            raise InvalidDocument(f"{where}.text must be a non-empty string")
        if (
            isinstance(importance, bool)
            or not isinstance(importance, int | float)
            or not 0 <= importance <= 1
        ):
            raise InvalidDocument(f"{where}.importance must be a number from 0 to 1")
        if not isinstance(source, str) or not source:
            raise InvalidDocument(f"{where}.source must be a non-empty string")
        when = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
        found.append(MemoryItem(i + 1, text.strip(), float(importance), when, source))
    return found
