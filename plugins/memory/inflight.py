"""
What the memory plugin keeps of a turn while it plays: the request in
flight (L{Turn}) and a completed spoken reply the player may still be
hearing (L{Completed}).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rpmiddleware.builtin.memory.conversation import Key
from rpmiddleware.plugin import Speech


@dataclass
class Turn:
    """One request in flight: what it will add to its conversation."""

    key: Key
    player: tuple[str, str, str, str] | None
    character: str
    parts: list[str] = field(default_factory=list)
    completed: str | None = None
    #: The client session that asked (told when its turn cannot be kept).
    client: str = "api"
    #: Lines the character heard while this turn played (an action's
    #: outcome, a refused call, another's line): remembered after it.
    after: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: The reply's speech as it passed toward the client, segment by
    #: segment (for what the player heard of it when it is cut off).
    speech: Speech | None = None
    requestId: str = ""
    #: The request id of the line this turn opens with (L{SAID}'s
    #: C{lineId}: a scene's line its character reacts to), heard whole.
    heardLine: str | None = None


@dataclass
class Completed:
    """
    A spoken reply remembered whole when RPEngine completed it, while the
    player may still be hearing it: what a late cut (L{TURN_PLAYED}) needs.
    """

    requestId: str
    key: Key
    #: The character's entry the reply made.
    seq: int
    reply: str
    speech: Speech
    client: str
