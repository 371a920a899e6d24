"""
What the card cache remembers: cards by hash (across sessions), and what
RPEngine holds in the current session and what is on its way to it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from rpmiddleware.plugin import CanonicalCard

#: An C{(integrationId, characterId)}: RPEngine holds one card for each.
Key = tuple[str, str]
#: How many hashes that RPEngine computes differently one session remembers.
ALIAS_LIMIT = 4096


def trim(mapping: OrderedDict[Any, Any], limit: int) -> None:
    """
    Forget the oldest entries of C{mapping} beyond C{limit}.
    """
    while len(mapping) > limit:
        mapping.popitem(last=False)


class ContentStore:
    """
    Canonical cards by hash, least recently used evicted first.

    It outlives sessions: it is what lets a reference or patch made in an old
    session become a snapshot in a new one.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._cards: OrderedDict[str, CanonicalCard] = OrderedDict()

    def __contains__(self, targetHash: object) -> bool:
        return targetHash in self._cards

    def __len__(self) -> int:
        return len(self._cards)

    def get(self, targetHash: Any) -> CanonicalCard | None:
        found = self._cards.get(targetHash) if isinstance(targetHash, str) else None
        if found is not None:
            self._cards.move_to_end(targetHash)
        return found

    def put(self, card: CanonicalCard) -> CanonicalCard:
        """
        Keep C{card}, or return the one already kept under its hash.
        """
        found = self.get(card.hash)
        if found is not None:
            return found
        self._cards[card.hash] = card
        trim(self._cards, self._size)
        return card


@dataclass
class Sent:
    """
    A card-bearing request on its way, kept until RPEngine accepts or ends it
    (across sessions: see L{CardCache._fresh}) so that
    C{card_resync_required} can be answered with a snapshot.
    """

    fields: dict[str, Any]
    meta: dict[str, Any]
    key: Key
    targetHash: str
    mode: str
    baseHash: str | None
    card: CanonicalCard | None
    resent: bool = False


@dataclass
class SessionCards:
    """
    The card RPEngine holds in the current session for each C{integrationId}
    + C{characterId}, and what is on its way.

    C{held} names each card by our hash; it is set when a snapshot or patch
    leaves (RPEngine takes messages in order, so a reference sent after it
    finds it) and confirmed when RPEngine accepts.  RPEngine's hash is the one
    that counts: C{engineHash} maps ours to RPEngine's where
    C{reply.accepted.resolvedCardHash} or C{character.synced.targetHash}
    showed that they differ, and a card with such a difference is sent as a
    snapshot without C{targetHash} rather than as a patch whose target hash
    we cannot know.
    """

    held: dict[Key, str] = field(default_factory=dict)
    engineHash: OrderedDict[str, str] = field(default_factory=OrderedDict)
    sent: OrderedDict[str, Sent] = field(default_factory=OrderedDict)
    syncs: dict[Key, str] = field(default_factory=dict)

    def engineHashOf(self, ourHash: str) -> str:
        return self.engineHash.get(ourHash, ourHash)

    def learn(self, ourHash: str, resolved: Any, key: Key) -> None:
        """
        RPEngine now holds the card we call C{ourHash} for C{key}, under its
        hash C{resolved}.
        """
        self.held[key] = ourHash
        if isinstance(resolved, str) and resolved and resolved != ourHash:
            self.engineHash[ourHash] = resolved
            trim(self.engineHash, ALIAS_LIMIT)

    def forget(self, key: Key) -> None:
        self.held.pop(key, None)
