"""
The simulated RPEngine's checks of an envelope's head, before anything else.

These decide whether a message from the game is valid at all (and so is
acknowledged) or is answered with C{request_failed} and logged as a protocol
error.  They are written here from the seed rather than taken from
L{rpmiddleware.messages.validate}, so the simulator does not share the
middleware's mistakes; it is stricter where the seed is explicit (for
example C{protocolVersion} must be the number 3).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rpmiddleware.envelope import PROTOCOL, PROTOCOL_VERSION

#: What the game may send, and which of those name a request.
GAME_TYPES = frozenset(
    {
        "welcome",
        "ack",
        "character.sync",
        "reply.request",
        "request.cancel",
        "voice.capture.start",
        "voice.capture.stop",
        "voice.capture.cancel",
    }
)
REQUEST_TYPES = frozenset(GAME_TYPES - {"welcome", "ack", "character.sync"})
#: What only RPEngine sends: a game sending one of these is confused.
ENGINE_TYPES = frozenset(
    {
        "hello",
        "character.synced",
        "reply.accepted",
        "reply.text.delta",
        "reply.text.completed",
        "reply.audio.start",
        "reply.audio.chunk",
        "reply.audio.completed",
        "reply.completed",
        "reply.cancelled",
        "capacity.update",
        "request.error",
        "voice.capture.level",
        "voice.capture.state",
    }
)
#: Where an ack names the message it acknowledges; we write the first.
ACK_REFERENCES = ("sourceMessageId", "ackedMessageId", "acknowledgedMessageId", "replyTo")


def text(value: Any) -> str | None:
    """
    C{value} if it is a non-empty string, else C{None}.
    """
    return value if isinstance(value, str) and value else None


def ackReference(fields: dict[str, Any]) -> str | None:
    return next((fields[n] for n in ACK_REFERENCES if text(fields.get(n))), None)


def headProblem(fields: Any, sessionId: str | None) -> str | None:
    """
    What is wrong with an envelope's common fields, or C{None}.

    @param sessionId: the established session, or C{None} before welcome.
    """
    if not isinstance(fields, dict):
        return "an envelope must be a JSON object"
    if fields.get("protocol") != PROTOCOL:
        return f"protocol must be {PROTOCOL!r}, got {fields.get('protocol')!r}"
    version = fields.get("protocolVersion")
    if type(version) is not int or version != PROTOCOL_VERSION:
        return f"protocolVersion must be {PROTOCOL_VERSION}, got {version!r}"
    if "messageId" not in fields:
        return "messageId is missing"
    if text(fields["messageId"]) is None:
        return "messageId must be a non-empty string"
    timestamp = fields.get("timestamp")
    if timestamp is None:
        return "timestamp is missing"
    try:
        datetime.fromisoformat(str(timestamp))
    except ValueError:
        return f"timestamp must be ISO 8601, got {str(timestamp)[:40]!r}"
    kind = fields.get("type")
    if kind in ENGINE_TYPES:
        return f"{kind} is sent by RPEngine, not by the game"
    if kind not in GAME_TYPES:
        return f"unknown message type {kind!r}"
    if sessionId is None:
        if kind != "welcome":
            return f"{kind} before welcome"
    elif fields.get("sessionId") != sessionId:
        return f"sessionId {fields.get('sessionId')!r} is not this session's {sessionId!r}"
    if kind in REQUEST_TYPES and text(fields.get("requestId")) is None:
        return f"{kind} needs a requestId"
    return None


def welcomeProblem(fields: dict[str, Any], sessionId: str | None) -> str | None:
    """
    What is wrong with a (new, not duplicate) welcome, or C{None}.
    """
    if sessionId is not None:
        return "welcome repeated on an established session"
    if text(fields.get("sessionId")) is None:
        return "welcome needs a sessionId"
    if not isinstance(fields.get("serverVersion"), str):
        return "welcome needs a serverVersion"
    return None
