"""
The recall index's search, on one SQLite connection: what a store's reader
thread (L{rpmiddleware.builtin.memory.store}) and the index of session
conversations (L{rpmiddleware.builtin.memory.sessionindex}) both run.

The index is an FTS5 table named C{recall} whose row ids are our own: a
conversation's entries are C{base + seq} and its memories C{-(base + id)},
C{base} being the conversation's number times L{RECALL_SPAN}, so one
conversation is two ranges of ids, which FTS5 searches without reading the
rest.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from rpmiddleware.builtin.memory.recall import ENTRY, MEMORY, Found, matchOf

RECALL_SPAN = 1 << 32
#: A word in more than this many of a conversation's rows is too common to
#: search for; a search looks at this many rows' worth of words at most
#: (L{distinctive}).
COMMON_ROWS = 300
SEARCH_ROWS = 600

_QUERY = (
    "SELECT rowid, bm25(recall) FROM recall WHERE recall MATCH ? "
    "AND rowid BETWEEN ? AND ? ORDER BY rank LIMIT ?"
)


def distinctive(
    db: sqlite3.Connection, words: list[str], ranges: list[tuple[int, int]]
) -> list[str]:
    """
    The rarer of C{words} in a conversation (C{ranges}: its rows in the
    index), rarest first: a word in more than L{COMMON_ROWS} of its rows
    says nothing of a topic and is left out, as is one in none; the rest are
    taken while the rows they are in stay within L{SEARCH_ROWS}.  Counting
    stops at L{COMMON_ROWS} rows a word, so a search costs what its
    distinctive words cost, however long the conversation: a line of common
    words ("the rain keeps falling") looks at little, and a common word
    never swamps a rare one.
    """
    counted: list[tuple[int, int]] = []
    for i, word in enumerate(words):
        match = matchOf([word])
        rows = 0
        for low, high in ranges:
            rows += db.execute(
                "SELECT count(*) FROM (SELECT rowid FROM recall WHERE recall MATCH ? "
                "AND rowid BETWEEN ? AND ? LIMIT ?)",
                (match, low, high, COMMON_ROWS + 1),
            ).fetchone()[0]
        if 0 < rows <= COMMON_ROWS:
            counted.append((rows, i))
    chosen: list[str] = []
    spent = 0
    for rows, i in sorted(counted):
        if spent + rows > SEARCH_ROWS:
            break
        chosen.append(words[i])
        spent += rows
    return chosen


def searchIndex(
    db: sqlite3.Connection,
    number: int,
    words: Sequence[str],
    recentFrom: int,
    older: int,
    recent: int,
    memories: int,
) -> list[Found]:
    """
    What conversation C{number} holds that any of its L{distinctive} C{words}
    finds, best first by BM25: the best C{older} of its entries before seq
    C{recentFrom}, the best C{recent} from it on (those the plan may give as
    history: every one of them, so that the rest are never crowded out), and
    its best C{memories}.
    """
    base = number * RECALL_SPAN
    ranges = [(base + 1, base + RECALL_SPAN - 1), (-(base + RECALL_SPAN - 1), -base)]
    match = matchOf(distinctive(db, list(words), ranges))
    if match is None:
        return []
    found: list[Found] = []
    split = max(1, min(recentFrom, RECALL_SPAN - 1))
    for low, high, limit in (
        (base + 1, base + split - 1, older),
        (base + split, base + RECALL_SPAN - 1, recent),
    ):
        if limit and low <= high:
            found.extend(
                Found(ENTRY, rid - base, score)
                for rid, score in db.execute(_QUERY, (match, low, high, limit))
            )
    if memories:
        found.extend(
            Found(MEMORY, -rid - base, score)
            for rid, score in db.execute(
                _QUERY, (match, -(base + RECALL_SPAN - 1), -base, memories)
            )
        )
    return found
