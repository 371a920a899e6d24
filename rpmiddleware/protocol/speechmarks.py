"""
Speech marks: what a game asks for, and how they travel to its client.

A game asks for the kinds of marks it wants (C{configure {"speechMarks":
["sentence", "word", "viseme"]}}, or a turn's C{options}); the client
endpoint checks them (L{markKinds}) and puts them on each request's meta
(L{META}), where the speech-marks plugin reads them: a request without them
costs that plugin one dict lookup per envelope.

The plugin tells the client a line's marks with an envelope toward the game
of type L{MARKS_ENVELOPE} (C{requestId}, C{marks}, C{sampleRate}), which
passes the plugins between it and the game like the line's other envelopes
(a scene's plugin gives it the player's turn's request id), and which the
client's turn writes as the C{speech-marks} message (L{CLIENT_TYPE}) with
the turn's id and the line's speaker.  The engine end never sees one.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.protocol.clienterrors import InvalidMessage
from rpmiddleware.protocol.clientfields import jsonName

#: The kinds of marks, as Amazon Polly names them.
MARK_KINDS = ("sentence", "word", "viseme")
#: The request meta key with the kinds a client asked for (a tuple of
#: L{MARK_KINDS}); absent when it asked for none.
META = "speechMarks"
#: The envelope type that carries a line's marks toward the game.
MARKS_ENVELOPE = "x-speech.marks"
#: The client message that carries them.
CLIENT_TYPE = "speech-marks"


def markKinds(value: Any, where: str) -> tuple[str, ...] | None:
    """
    The kinds of marks in C{value} (a list of L{MARK_KINDS}; C{null} or an
    empty list: none), in L{MARK_KINDS}' order.

    @param where: the field, to name it (C{configure.speechMarks}).
    @raise InvalidMessage: naming the field and what is wrong.
    """
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidMessage(
            f"{where} must be a list of {', '.join(MARK_KINDS)} (or null), got {jsonName(value)}"
        )
    for kind in value:
        if kind not in MARK_KINDS:
            shown = repr(kind)[:64] if isinstance(kind, str) else jsonName(kind)
            raise InvalidMessage(
                f"{where} has unknown kind {shown} (known: {', '.join(MARK_KINDS)})"
            )
    kinds = tuple(kind for kind in MARK_KINDS if kind in value)
    return kinds or None


__all__ = ["CLIENT_TYPE", "MARKS_ENVELOPE", "MARK_KINDS", "META", "markKinds"]
