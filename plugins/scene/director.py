"""
Who speaks next in a scene: who answers the player's line, and who reacts
to a character's.

RPEngine plays one character per request, so each line of a scene is one
request, and this module only chooses whose.  The player's line goes to,
in order: the character the game named for it (C{address}, or the Python
API's C{meta["addressee"]}); the one it names ("Garrick, open the gate",
the earliest name in the line, a first name enough); else the scene's
director rule: C{addressed} (the character the request was for, as the
client's C{character} says), C{last-speaker}, or C{round-robin} in the
cast's order.  Only characters who hear the player may answer.

A reaction goes to one who heard the line and did not say it: the one the
line names, else the one who spoke least recently (so a reaction goes
round the room, not back and forth between the same two).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rpmiddleware.builtin.scene.model import PLAYER, Member, Scene


def _names(member: Member) -> list[str]:
    """The names a line may call a character by: the whole, and the first word."""
    whole = member.name.strip()
    first = whole.split()[0] if whole.split() else whole
    return [whole] if first == whole else [whole, first]


def named(text: str, candidates: Sequence[Member]) -> Member | None:
    """
    The candidate C{text} names first (whole words, any case), or C{None}.
    """
    best: tuple[int, Member] | None = None
    for member in candidates:
        for name in _names(member):
            found = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE)
            if found and (best is None or found.start() < best[0]):
                best = (found.start(), member)
    return best[1] if best else None


def answerer(scene: Scene, text: str | None, requested: str, addressee: str | None) -> Member:
    """
    Who answers the player's line C{text} (C{None} for words not known yet,
    a voice capture); C{requested} is the character the request was for.
    """
    hearing = scene.listeners(PLAYER) or list(scene.cast.values())
    ids = {m.characterId: m for m in hearing}
    for choice in (addressee, scene.nextAddressee):
        if choice in ids:
            return ids[choice]
    if text:
        found = named(text, hearing)
        if found is not None:
            return found
    order = [m.characterId for m in hearing]
    if scene.director == "round-robin" and scene.lastSpeaker in order:
        return hearing[(order.index(scene.lastSpeaker) + 1) % len(order)]
    if scene.director == "last-speaker" and scene.lastSpeaker in ids:
        return ids[scene.lastSpeaker]
    if requested in ids:
        return ids[requested]
    if scene.lastSpeaker in ids:
        return ids[scene.lastSpeaker]
    return hearing[0]


def reactor(scene: Scene, speaker: str, text: str, spokenThisTurn: Sequence[str]) -> Member | None:
    """
    Who reacts to C{speaker}'s line, or C{None} when nobody else heard it.
    """
    hearing = scene.listeners(speaker)
    if not hearing:
        return None
    found = named(text, hearing)
    if found is not None:
        return found
    # Least recently heard from first; those silent so far in the scene first of all.
    recency = {cid: i for i, cid in enumerate(scene.spoken)}
    fresh = [m for m in hearing if m.characterId not in spokenThisTurn] or hearing
    return min(fresh, key=lambda m: recency.get(m.characterId, -1))


__all__ = ["answerer", "named", "reactor"]
