"""
A scene as a game declares it: its cast (characters with their cards and
voices), who hears whom, the scene's own context, and how the next speaker
is chosen.  Parsed from a client's C{scene} message or the Python API, with
errors that name the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rpmiddleware.plugin import VOICES, InvalidCard, snapshotTransfer, trimmed, validateCard

#: Who answers a player's line nobody is named in: the character the
#: request was for (the client's C{character}), the last to speak, or the
#: next in the cast's order.
DIRECTORS = ("addressed", "last-speaker", "round-robin")
#: The player, in C{hears} lists.
PLAYER = "player"
#: Bounds: cast size, character-to-character lines per player turn, text.
MAX_CAST = 8
MAX_REACTIONS = 4
MAX_CONTEXT_CHARS = 4000
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class SceneError(ValueError):
    """
    A scene a game asked for that cannot be played; the message names the
    field.
    """


@dataclass(frozen=True)
class Member:
    """
    One character of a scene.

    @ivar hears: the ids of whom this character hears (cast ids and
        L{PLAYER}); C{None}: everyone.
    """

    characterId: str
    name: str
    transfer: dict[str, Any]
    voice: str | None = None
    hears: frozenset[str] | None = None

    def hearsFrom(self, speaker: str) -> bool:
        return self.hears is None or speaker in self.hears

    def asSpeaker(self) -> dict[str, Any]:
        """What each line of this character's tells the client (C{speaker})."""
        spoken = {"characterId": self.characterId, "name": self.name}
        if self.voice:
            spoken["voice"] = self.voice
        return spoken

    def describe(self) -> dict[str, Any]:
        described = self.asSpeaker()
        if self.hears is not None:
            described["hears"] = sorted(self.hears)
        return described


@dataclass
class Scene:
    sceneId: str
    integrationId: str
    cast: dict[str, Member]
    context: str = ""
    director: str = "addressed"
    reactions: int = 1
    #: Who spoke last (a cast id), for the director and round-robin.
    lastSpeaker: str | None = None
    #: The character the game said the next player line is for (once).
    nextAddressee: str | None = None
    spoken: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {
            "sceneId": self.sceneId,
            "cast": [member.describe() for member in self.cast.values()],
            "context": self.context,
            "director": self.director,
            "reactions": self.reactions,
            "lastSpeaker": self.lastSpeaker,
        }

    def listeners(self, speaker: str) -> list[Member]:
        """The cast members who hear C{speaker} (a cast id or L{PLAYER}), but them."""
        return [m for m in self.cast.values() if m.characterId != speaker and m.hearsFrom(speaker)]


CardOwner = Callable[[dict[str, Any]], tuple[dict[str, Any], str]]


def identifier(value: Any, at: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise SceneError(f"{at} must be an id of 1-128 letters, digits or _.:-")
    return value


def parseMember(raw: Any, at: str, own: CardOwner) -> Member:
    """
    One cast entry: C{characterId}, C{card} (a Character Card V2), and
    optional C{voice} (F1-F5, M1-M5) and C{hears}.

    @param own: makes the card the middleware's own, with its hash.
    """
    if not isinstance(raw, Mapping):
        raise SceneError(f"{at} must be an object")
    characterId = identifier(raw.get("characterId"), f"{at}.characterId")
    card = raw.get("card")
    if not isinstance(card, dict):
        raise SceneError(f"{at}.card must be a Character Card V2 object")
    try:
        validateCard(card)
    except InvalidCard as e:
        raise SceneError(f"{at}.card: {e.field} {e.problem}")
    name = trimmed(card["data"].get("name"))
    if not name or ":" in name:
        raise SceneError(f"{at}.card.data.name must be a name without a colon")
    voice = raw.get("voice")
    if voice is not None and voice not in VOICES:
        raise SceneError(f"{at}.voice must be one of F1-F5, M1-M5")
    hears = raw.get("hears")
    if hears is not None:
        if not isinstance(hears, list) or not all(isinstance(h, str) for h in hears):
            raise SceneError(f'{at}.hears must be an array of cast ids and "player"')
        hears = frozenset(hears)
    document, hash = own(card)
    return Member(characterId, name, snapshotTransfer(document, hash), voice, hears)


def parseScene(raw: Mapping[str, Any], integrationId: str, own: CardOwner) -> Scene:
    """
    A scene from a game's description: C{sceneId}, C{cast}, and optional
    C{context}, C{director} and C{reactions}.
    """
    sceneId = identifier(raw.get("sceneId"), "scene.sceneId")
    rawCast = raw.get("cast")
    if not isinstance(rawCast, list) or not rawCast:
        raise SceneError("scene.cast must be a non-empty array of characters")
    if len(rawCast) > MAX_CAST:
        raise SceneError(f"scene.cast has {len(rawCast)} characters; at most {MAX_CAST}")
    cast: dict[str, Member] = {}
    for index, entry in enumerate(rawCast):
        made = parseMember(entry, f"scene.cast[{index}]", own)
        if made.characterId in cast:
            raise SceneError(f"scene.cast[{index}].characterId {made.characterId!r} is there twice")
        cast[made.characterId] = made
    opened = Scene(sceneId, integrationId, cast)
    configureScene(opened, raw)
    checkHearing(opened)
    return opened


def configureScene(target: Scene, raw: Mapping[str, Any]) -> None:
    """The optional settings of C{scene.open}, also what C{scene.set} changes."""
    if "context" in raw:
        context = raw["context"]
        if not isinstance(context, str) or len(context) > MAX_CONTEXT_CHARS:
            raise SceneError(f"scene.context must be a string of at most {MAX_CONTEXT_CHARS}")
        target.context = context.strip()
    if "director" in raw:
        if raw["director"] not in DIRECTORS:
            raise SceneError(f"scene.director must be one of {', '.join(DIRECTORS)}")
        target.director = raw["director"]
    if "reactions" in raw:
        reactions = raw["reactions"]
        if type(reactions) is not int or not 0 <= reactions <= MAX_REACTIONS:
            raise SceneError(f"scene.reactions must be an integer from 0 to {MAX_REACTIONS}")
        target.reactions = reactions


def checkHearing(target: Scene) -> None:
    known = {*target.cast, PLAYER}
    for m in target.cast.values():
        unknown = sorted((m.hears or frozenset()) - known)
        if unknown:
            raise SceneError(
                f"scene cast {m.characterId!r} hears {unknown[0]!r}, who is not in the scene"
            )


__all__ = [
    "DIRECTORS",
    "MAX_CAST",
    "PLAYER",
    "Member",
    "Scene",
    "SceneError",
    "checkHearing",
    "configureScene",
    "parseMember",
    "parseScene",
]
