"""
The memory store's file (L{rpmiddleware.builtin.memory.store} tells the
whole of how the store works): opening it, its connections and threads
(the writer's, the reader's, the caller's), closing it, and the writes
every part of the store gives (L{StoreFile._write}, L{StoreFile._change},
L{StoreFile.transaction}), each one transaction, counted and reported when
lost.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.python.failure import Failure

from rpmiddleware.builtin.memory.conversation import Conversation, Key
from rpmiddleware.builtin.memory.storeerrors import StoreError, describe
from rpmiddleware.builtin.memory.storeschema import checkVersion, migrate
from rpmiddleware.builtin.memory.writer import Lane

#: Seconds a write waits for a lock another process holds (SQLite's busy
#: handler retries meanwhile) before it is given up and reported.
WRITE_TIMEOUT = 30.0
#: Seconds start-up waits for a lock before it refuses the store.
OPEN_TIMEOUT = 2.0

T = TypeVar("T")
Known = tuple[int, str, dict[str, Any]]


class StoreFile:
    """
    The file under L{MemoryStore}: what every change and read goes through.
    Its parameters are L{MemoryStore}'s (all but C{cached}).
    """

    def __init__(
        self,
        path: str,
        now: Callable[[], float],
        reactor: Any = None,
        writeTimeout: float = WRITE_TIMEOUT,
    ) -> None:
        self.path = path
        self._now = now
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
                checkVersion(db, self.path)
                # A write at once, so that a file that cannot be written
                # (read-only, locked) is said now, not at the first turn.
                # A short wait here: a store locked at start-up is refused.
                db.execute(f"PRAGMA busy_timeout={int(OPEN_TIMEOUT * 1000)}")
                migrate(db)
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
