"""
One conversation as the memory plugin keeps it: what each side said, in
order, the summary of what is condensed, and the facts a game pinned.

A conversation is named by L{Key}: the integration, the character and the
game's conversation id (a save slot), or a client session's own id when the
game gives none.  Entries are numbered by C{seq}, which only grows; those up to
C{summarizedThrough} are told by C{summary} and no longer planned one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from rpmiddleware.plugin import estimateTokens

#: Who an entry is from: the player, this conversation's character, a game
#: event, or another character this one heard speak (in a scene; its
#: C{speaker} names them).
PLAYER = "player"
CHARACTER = "character"
EVENT = "event"
OTHER = "other"
ROLES = (PLAYER, CHARACTER, EVENT, OTHER)

#: What an entry is: said and heard in full; a reply cut off (barge-in,
#: cancel) as far as the client got it; the player's turn whose words no one
#: knows (a recording RPEngine did not transcribe to us); the card's opening
#: line, as the player saw it.
COMPLETE = "complete"
INTERRUPTED = "interrupted"
UNHEARD = "unheard"
GREETING = "greeting"
STATUSES = (COMPLETE, INTERRUPTED, UNHEARD, GREETING)

#: The prefix of a conversation id the plugin makes for a client session.
SESSION_PREFIX = "session:"


@dataclass(frozen=True, order=True)
class Key:
    integrationId: str
    characterId: str
    conversationId: str

    @property
    def persistent(self) -> bool:
        """A game's conversation (a save slot) is stored; a session's is not."""
        return not self.conversationId.startswith(SESSION_PREFIX)

    def asDict(self) -> dict[str, str]:
        return {
            "integrationId": self.integrationId,
            "characterId": self.characterId,
            "conversationId": self.conversationId,
        }


@dataclass
class Entry:
    seq: int
    role: str
    text: str
    status: str = COMPLETE
    #: Who spoke, as the game named them (the player's display name, the
    #: character's card name).
    speaker: str = ""
    at: float = 0.0

    @cached_property
    def tokens(self) -> int:
        """
        About what the entry costs as a line of prompt, speaker included:
        counted once, since an entry is never changed in place (an edit or a
        cut replaces it), and every plan and recall walks back over it.
        """
        return estimateTokens(f"{self.speaker}: {self.text}")

    def asDict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "role": self.role,
            "speaker": self.speaker,
            "text": self.text,
            "status": self.status,
            "at": self.at,
        }


@dataclass
class Fact:
    id: int
    text: str

    def asDict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text}


#: Where a memory came from: the character's own reflection, or the game.
REFLECTION = "reflection"
GAME = "game"


@dataclass
class MemoryItem:
    """
    A moment worth keeping, in a line of its own (a reflection's detail, a
    thing the game said this character must remember), with how much it
    matters (0 to 1): recalled like an entry, and ranked higher the more it
    matters.
    """

    id: int
    text: str
    importance: float = 0.5
    at: float = 0.0
    source: str = GAME

    @property
    def tokens(self) -> int:
        return estimateTokens(self.text)

    def asDict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "importance": self.importance,
            "at": self.at,
            "source": self.source,
        }


@dataclass
class Conversation:
    key: Key
    entries: list[Entry] = field(default_factory=list)
    summary: str = ""
    summarizedThrough: int = 0
    facts: list[Fact] = field(default_factory=list)
    updated: float = 0.0
    #: The game said the player saw the card's first message: it opens the
    #: conversation at its next request.
    greetingPending: bool = False
    #: What plugins keep with the conversation beside its entries, by name
    #: (L{MemoryStore.setState}): JSON values, exported and restored with it.
    state: dict[str, Any] = field(default_factory=dict)
    #: Moments kept in lines of their own (L{MemoryItem}), oldest first.
    memories: list[MemoryItem] = field(default_factory=list)

    @property
    def nextSeq(self) -> int:
        return self.entries[-1].seq + 1 if self.entries else self.summarizedThrough + 1

    def unsummarized(self) -> list[Entry]:
        return [e for e in self.entries if e.seq > self.summarizedThrough]

    def unsummarizedTokens(self) -> int:
        return sum(e.tokens for e in self.unsummarized())

    def entry(self, seq: int) -> Entry | None:
        for e in self.entries:
            if e.seq == seq:
                return e
        return None

    def asDict(self) -> dict[str, Any]:
        return {
            **self.key.asDict(),
            "summary": self.summary,
            "summarizedThrough": self.summarizedThrough,
            "facts": [f.asDict() for f in self.facts],
            "entries": [e.asDict() for e in self.entries],
            "updated": self.updated,
            # Only when there are some: exports made before them stay the same.
            **({"memories": [m.asDict() for m in self.memories]} if self.memories else {}),
            # Only when there is some: exports made before it stay the same.
            **({"state": dict(self.state)} if self.state else {}),
        }

    def brief(self) -> dict[str, Any]:
        return {
            **self.key.asDict(),
            "entries": len(self.entries),
            "facts": len(self.facts),
            "summarized": bool(self.summary),
            "updated": self.updated,
        }


@dataclass
class Where:
    """A client's place in the game, for the knowledge scoped to it."""

    location: str | None = None
    scene: str | None = None
