"""
Recall for conversations that are never written: a client session's own
(one whose game named no conversation id).

Those live only in memory, so the store's index in the file does not hold
them.  L{SessionIndex} keeps an index of its own for them, an FTS5 table in
an in-memory SQLite database with the same row ids and the same search
(L{rpmiddleware.builtin.memory.search}), on a thread of its own (a L{Lane}),
never the reactor's.  Before each search it brings the conversation's rows
up to date: what changed since the last one (new entries, a cut or edited
line, one removed, new memories), found on that thread by a walk that
compares each line with what was indexed (the same string object, mostly);
the reactor only copies the conversation's lines for it (tens of
microseconds for a thousand entries).  What the index holds of each
conversation (L{_Indexed}) is read and changed on that thread alone, so the
copy is all the two threads share.  A session's rows go when the
session ends (L{forget}), and those of a session conversation no longer kept
in memory are dropped at the next search of any.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred

from rpmiddleware.builtin.memory.conversation import Conversation, Key
from rpmiddleware.builtin.memory.recall import Found
from rpmiddleware.builtin.memory.search import RECALL_SPAN, searchIndex
from rpmiddleware.builtin.memory.writer import Lane

_TABLE = (
    "CREATE VIRTUAL TABLE recall USING fts5 (text, tokenize='porter unicode61 remove_diacritics 2')"
)

#: A change to the index: a row's id and its new text (C{None}: removed).
_Change = tuple[int, str | None]
#: A conversation's lines as the reactor copied them: (seq or id, text).
_Lines = list[tuple[int, str]]


class _Indexed:
    """What the index holds of one conversation: its number and its lines."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.entries: dict[int, str] = {}
        self.memories: dict[int, str] = {}


class SessionIndex:
    """
    @param reactor: where the index's thread hands results back (without
        threads, a Clock, the work is done at once).
    @param kept: whether a session conversation is still kept in memory.
    """

    def __init__(self, reactor: Any, kept: Callable[[Key], bool]) -> None:
        self._lane = Lane(reactor, "rpmiddleware-memory-sessions")
        self._kept = kept
        self._db: sqlite3.Connection | None = None
        self._indexed: dict[Key, _Indexed] = {}
        self._next = 1

    def _open(self) -> sqlite3.Connection:
        """The index's connection (its thread only)."""
        if self._db is None:
            self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            self._db.execute(_TABLE)
        return self._db

    @staticmethod
    def _changes(indexed: _Indexed, entries: _Lines, memories: _Lines) -> list[_Change]:
        """
        What differs between a conversation's lines and what the index holds
        of it (the index's thread).
        """
        base = indexed.number * RECALL_SPAN
        changes: list[_Change] = []
        # An entry's row id is base + seq; a memory's -(base + id).
        for rows, items, sign in (
            (indexed.entries, entries, 1),
            (indexed.memories, memories, -1),
        ):
            present = set()
            for ref, text in items:
                present.add(ref)
                old = rows.get(ref)
                if old is text or old == text:
                    continue
                if old is not None:
                    changes.append((sign * (base + ref), None))
                changes.append((sign * (base + ref), text))
                rows[ref] = text
            for ref in [ref for ref in rows if ref not in present]:
                changes.append((sign * (base + ref), None))
                del rows[ref]
        return changes

    def _gone(self) -> list[_Indexed]:
        """The session conversations no longer kept in memory, let go of."""
        return [self._indexed.pop(key) for key in list(self._indexed) if not self._kept(key)]

    @staticmethod
    def _removed(gone: Sequence[_Indexed]) -> list[_Change]:
        """The rows of conversations let go of (the index's thread)."""
        removed: list[_Change] = []
        for indexed in gone:
            base = indexed.number * RECALL_SPAN
            removed += [(base + seq, None) for seq in indexed.entries]
            removed += [(-(base + i), None) for i in indexed.memories]
        return removed

    def _apply(self, db: sqlite3.Connection, changes: list[_Change]) -> None:
        if not changes:
            return
        db.execute("BEGIN")
        for rowid, text in changes:
            if text is None:
                db.execute("DELETE FROM recall WHERE rowid = ?", (rowid,))
            else:
                db.execute("INSERT INTO recall (rowid, text) VALUES (?, ?)", (rowid, text))
        db.execute("COMMIT")

    def searchLater(
        self,
        conversation: Conversation,
        words: Sequence[str],
        recentFrom: int,
        older: int,
        recent: int,
        memories: int,
    ) -> Deferred[list[Found]]:
        """
        L{MemoryStore.searchLater} for a session conversation: its rows
        brought up to date, then searched, on the index's own thread.
        """
        key = conversation.key
        indexed = self._indexed.get(key)
        if indexed is None:
            indexed = self._indexed[key] = _Indexed(self._next)
            self._next += 1
        gone = self._gone()
        entries = [(e.seq, e.text) for e in conversation.entries]
        kept = [(m.id, m.text) for m in conversation.memories]
        number, words = indexed.number, list(words)

        def work() -> list[Found]:
            db = self._open()
            self._apply(db, self._removed(gone) + self._changes(indexed, entries, kept))
            return searchIndex(db, number, words, recentFrom, older, recent, memories)

        return self._lane.run(work)

    def forget(self, keys: Sequence[Key]) -> None:
        """The sessions of C{keys} are over: their rows go."""
        gone = [self._indexed.pop(key) for key in keys if key in self._indexed]
        if gone:
            self._lane.run(lambda: self._apply(self._open(), self._removed(gone)))

    def close(self) -> None:
        self._lane.stop()
