"""
Recall: the few past moments of a conversation most relevant to a new line,
found in the store's full-text index and ranked as Generative Agents (Park et
al., 2023) rank memories: relevance, recency and importance, each from 0 to
1, weighted and added.

A small model's running summary keeps little; the exact words are still in
the store.  So each request's query is the words of the new line and the
scene (L{queryOf}: stop-words dropped, every word quoted so that a player's
quotes and operators are only words, OR-joined); the store finds the best
matches by BM25 on its reader thread (L{MemoryStore.searchLater}), never on
the reactor's; and the planner ranks them (L{rank}) and gives the model those
that fit the recall budget, quoted with their speakers' names in a "What
<character> remembers" block of the scenario.  Only the conversation's own
entries and memories are searched: a character recalls only what it heard.
No model is asked anything for it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rpmiddleware.builtin.memory.clip import clip
from rpmiddleware.builtin.memory.conversation import (
    CHARACTER,
    EVENT,
    OTHER,
    PLAYER,
    Conversation,
    Entry,
    MemoryItem,
)
from rpmiddleware.plugin import estimateTokens

#: What a candidate is: one of the conversation's entries, or a memory.
ENTRY = "entry"
MEMORY = "memory"

#: How a moment's score is made (each part from 0 to 1; docs/memory.md,
#: Recall): relevance counts most, so that an old moment the new line is
#: about wins over a recent one it only brushes; recency and importance
#: break ties between moments about as relevant.
RELEVANCE_WEIGHT = 1.0
RECENCY_WEIGHT = 0.5
IMPORTANCE_WEIGHT = 0.5
#: Recency halves every this many entries back.
HALF_LIFE_ENTRIES = 200
#: An entry's importance by who said it (a memory has its own): what the
#: player says and what happens in the game matter more than replies.
ENTRY_IMPORTANCE = {PLAYER: 0.6, EVENT: 0.6, CHARACTER: 0.4, OTHER: 0.4}
#: A moment below this share of the best match's relevance is not recalled.
MIN_RELEVANCE = 0.25
#: What the model is shown of one moment, in tokens at most.
MOMENT_TOKENS = 120
#: Words of a query, at most (the new line's first, then the scene's).
QUERY_WORDS = 32

_WORD = re.compile(r"[^\W_]+", re.UNICODE)

#: Words that say nothing of a topic (English; a query of other languages
#: keeps all its words, and BM25 weighs common ones down anyway).
STOP_WORDS = frozenset(
    """
    a about above after again against all also am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn doing
    don down during each else ever few for from further get got had hadn has hasn have haven
    having he her here hers herself him himself his how i if in into is isn it its itself just
    know let like ll me more most much must mustn my myself no nor not now of off on once only
    or other ought our ours ourselves out over own re really said same say says shall shan she
    should shouldn so some still such tell than that the their theirs them themselves then
    there these they this those through to told too under until up us ve very was wasn we well
    were weren what when where which while who whom why will with won would wouldn yes yet you
    your yours yourself yourselves remember remembers recall think thought please okay oh hey
    """.split()
)


def queryWords(*texts: str) -> list[str]:
    """
    The words a query looks for: those of C{texts} in order, lower case,
    each once, without stop-words or single letters, at most
    L{QUERY_WORDS}.
    """
    found: list[str] = []
    seen: set[str] = set()
    for text in texts:
        for word in _WORD.findall(text or ""):
            word = word.lower()
            if len(word) < 2 or word in STOP_WORDS or word in seen:
                continue
            seen.add(word)
            found.append(word)
            if len(found) >= QUERY_WORDS:
                return found
    return found


def queryOf(*texts: str) -> str | None:
    """
    An FTS5 query for the words of C{texts} (L{queryWords}), any of them
    (OR), or C{None} when there is none.  Each word is a quoted string, so
    nothing a player types (quotes, C{NEAR}, C{*}, C{-}, a column name) is
    read as FTS5 syntax.
    """
    return matchOf(queryWords(*texts))


def matchOf(words: Sequence[str]) -> str | None:
    """The FTS5 query for any of C{words}, each quoted; C{None} for none."""
    if not words:
        return None
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


@dataclass(frozen=True)
class Found:
    """
    A match the store found: an entry (C{ref} its seq) or a memory (its
    id), and its BM25 score (FTS5's: lower is better, below 0).
    """

    kind: str
    ref: int
    bm25: float


@dataclass(frozen=True)
class Moment:
    """A moment to recall: its line of prompt, cost, score and place in time."""

    text: str
    tokens: int
    score: float
    #: The entry's seq, or the seq of the newest entry before the memory.
    position: float


@dataclass(frozen=True)
class Recalled:
    """
    What the store found for one request, for the planner: its matches,
    and the room the moments have.
    """

    found: Sequence[Found]
    #: Tokens the moments may take (the recall budget).
    tokens: int
    #: Moments at most.
    count: int


def _flat(text: str) -> str:
    return " ".join(text.split()).replace("<START>", "(START)")


def entryLine(entry: Entry, character: str, player: str) -> str | None:
    """
    One entry as a recalled line: who said it, and their words in quotes
    (a small model tells a quote from an instruction, and whose words they
    were); a game event as what happened.
    """
    words = _flat(entry.text)
    if not words:
        return None
    words = clip(words, MOMENT_TOKENS)
    if entry.role == EVENT:
        return f"- (happened) {words}"
    if entry.role == CHARACTER:
        speaker = character
    elif entry.role == PLAYER:
        speaker = _flat(entry.speaker) or player
    else:
        speaker = _flat(entry.speaker) or "Someone"
    return f'- {speaker} said: "{words}"'


def memoryLine(item: MemoryItem) -> str:
    return f"- {clip(_flat(item.text), MOMENT_TOKENS)}"


def _entryAt(conversation: Conversation, seq: int) -> Entry | None:
    """The entry C{seq} (entries are in seq order: a binary search)."""
    entries = conversation.entries
    i = bisect.bisect_left(entries, seq, key=lambda e: e.seq)
    return entries[i] if i < len(entries) and entries[i].seq == seq else None


def _memoryAt(conversation: Conversation, memoryId: int) -> MemoryItem | None:
    """The memory C{memoryId} (memories are in id order: a binary search)."""
    memories = conversation.memories
    i = bisect.bisect_left(memories, memoryId, key=lambda m: m.id)
    return memories[i] if i < len(memories) and memories[i].id == memoryId else None


def _positionOf(conversation: Conversation, at: float) -> float:
    """Where a memory made at C{at} stands among the entries (by their time)."""
    entries = conversation.entries
    i = bisect.bisect_right(entries, at, key=lambda e: e.at)
    return float(entries[i - 1].seq) if i else 0.0


def rank(
    conversation: Conversation,
    found: Sequence[Found],
    before: int,
    character: str,
    player: str,
) -> list[Moment]:
    """
    The moments of C{found} worth recalling, best first: entries older than
    C{before} (the oldest entry the plan gives as history; nothing in the
    history is recalled) and memories, scored by L{RELEVANCE_WEIGHT} times
    relevance (BM25 as a share of the best), L{RECENCY_WEIGHT} times
    recency (halving every L{HALF_LIFE_ENTRIES} entries) and
    L{IMPORTANCE_WEIGHT} times importance.
    """
    best = min((f.bm25 for f in found), default=0.0)
    if best >= 0:
        return []
    newest = float(conversation.entries[-1].seq) if conversation.entries else 0.0
    moments: list[Moment] = []
    for f in found:
        relevance = f.bm25 / best
        if relevance < MIN_RELEVANCE:
            continue
        if f.kind == ENTRY:
            if f.ref >= before:
                continue
            entry = _entryAt(conversation, f.ref)
            if entry is None:
                continue
            text = entryLine(entry, character, player)
            if text is None:
                continue
            position = float(entry.seq)
            importance = ENTRY_IMPORTANCE.get(entry.role, 0.4)
        else:
            item = _memoryAt(conversation, f.ref)
            if item is None:
                continue
            text = memoryLine(item)
            position = _positionOf(conversation, item.at)
            importance = item.importance
        recency = 0.5 ** (max(0.0, newest - position) / HALF_LIFE_ENTRIES)
        score = (
            RELEVANCE_WEIGHT * relevance + RECENCY_WEIGHT * recency + IMPORTANCE_WEIGHT * importance
        )
        moments.append(Moment(text, estimateTokens("\n" + text), score, position))
    moments.sort(key=lambda m: -m.score)
    return moments


def chosen(moments: Sequence[Moment], tokens: int, count: int) -> list[Moment]:
    """
    The best moments that fit in C{tokens}, C{count} at most, best first
    (a moment too long for what is left is passed over for a shorter one).
    """
    kept: list[Moment] = []
    spent = 0
    seen: set[str] = set()
    for moment in moments:
        if len(kept) >= count:
            break
        if moment.text in seen or spent + moment.tokens > tokens:
            continue
        seen.add(moment.text)
        kept.append(moment)
        spent += moment.tokens
    return kept


def block(moments: Sequence[Moment]) -> str:
    """The moments as the model reads them: in the order they happened."""
    return "\n".join(m.text for m in sorted(moments, key=lambda m: m.position))


__all__ = [
    "ENTRY",
    "MEMORY",
    "Found",
    "Moment",
    "Recalled",
    "block",
    "chosen",
    "matchOf",
    "queryOf",
    "queryWords",
    "rank",
]
