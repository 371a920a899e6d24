"""
Every message type of RPEngine protocol v3, typed, and the rules that check them.

Two views of one table: the C{TypedDict}s give code static types, and
L{MESSAGES} drives validation at run time.  Where the seed names a message but
not its fields (the payload of C{ack}, the statistics of a completed reply),
the choice is written down in C{docs/protocol-choices.md}; readers accept the
reasonable variants listed there and writers emit the first name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict

from rpmiddleware.envelope import PROTOCOL, PROTOCOL_VERSION, Direction

_Type = type

TO_ENGINE = frozenset({Direction.TO_ENGINE})
TO_GAME = frozenset({Direction.TO_GAME})
BOTH = frozenset({Direction.TO_ENGINE, Direction.TO_GAME})

_STR = (str,)
_INT = (int,)
_NUM = (int, float)
_BOOL = (bool,)
_DICT = (dict,)
_LIST = (list,)


@dataclass(frozen=True)
class MessageSpec:
    """
    What one message type must carry, and which way it may travel.
    """

    type: str
    directions: frozenset[Direction]
    required: Mapping[str, tuple[_Type, ...]] = field(default_factory=dict)
    optional: Mapping[str, tuple[_Type, ...]] = field(default_factory=dict)
    #: Whether this message starts work that ends with a terminal reply.
    opensRequest: bool = False
    #: Whether this message ends the request named by its requestId.
    terminal: bool = False


def _spec(type: str, directions: frozenset[Direction], **kw: Any) -> MessageSpec:
    return MessageSpec(type, directions, **kw)


_TURN_FIELDS = {
    "requestId": _STR,
    "integrationId": _STR,
    "characterId": _STR,
    "card": _DICT,
}
_TURN_OPTIONAL = {
    "eventId": _STR,
    "output": _DICT,
    "player": _DICT,
    "interactionMode": _STR,
    "promptScene": _DICT,
    "promptDirective": _DICT,
}

MESSAGES: dict[str, MessageSpec] = {
    s.type: s
    for s in [
        _spec("hello", TO_GAME),
        _spec("welcome", TO_ENGINE, required={"sessionId": _STR, "serverVersion": _STR}),
        _spec("ack", BOTH, optional={"duplicate": _BOOL}),
        _spec(
            "character.sync",
            TO_ENGINE,
            required={"integrationId": _STR, "characterId": _STR, "card": _DICT},
        ),
        _spec("character.synced", TO_GAME, optional={"targetHash": _STR, "characterId": _STR}),
        _spec(
            "reply.request",
            TO_ENGINE,
            required={**_TURN_FIELDS, "event": _DICT},
            optional=_TURN_OPTIONAL,
            opensRequest=True,
        ),
        _spec("reply.accepted", TO_GAME, required={"requestId": _STR}),
        _spec(
            "reply.text.delta",
            TO_GAME,
            required={"requestId": _STR, "sequence": _INT},
            optional={"text": _STR, "delta": _STR},
        ),
        _spec(
            "reply.text.completed",
            TO_GAME,
            required={"requestId": _STR},
            optional={"text": _STR, "stats": _DICT},
        ),
        _spec(
            "reply.audio.start",
            TO_GAME,
            required={"requestId": _STR},
            optional={"format": _STR, "sampleRate": _INT, "channels": _INT},
        ),
        _spec(
            "reply.audio.chunk",
            TO_GAME,
            required={"requestId": _STR, "sequence": _INT, "segmentSequence": _INT, "data": _STR},
        ),
        _spec("reply.audio.completed", TO_GAME, required={"requestId": _STR}),
        _spec("reply.completed", TO_GAME, required={"requestId": _STR}, terminal=True),
        _spec("request.cancel", TO_ENGINE, required={"requestId": _STR}),
        _spec("reply.cancelled", TO_GAME, required={"requestId": _STR}, terminal=True),
        _spec(
            "capacity.update",
            TO_GAME,
            required={"acceptingRequests": _BOOL, "queueDepth": _INT, "queueLimit": _INT},
        ),
        _spec(
            "request.error",
            TO_GAME,
            required={"code": _STR},
            optional={
                "requestId": _STR,
                "sourceMessageId": _STR,
                "message": _STR,
                "retryable": _BOOL,
            },
            terminal=True,
        ),
        _spec(
            "voice.capture.start",
            TO_ENGINE,
            required=_TURN_FIELDS,
            optional=_TURN_OPTIONAL,
            opensRequest=True,
        ),
        _spec("voice.capture.stop", TO_ENGINE, required={"requestId": _STR}),
        _spec("voice.capture.cancel", TO_ENGINE, required={"requestId": _STR}),
        _spec("voice.capture.level", TO_GAME, optional={"requestId": _STR, "level": _NUM}),
        _spec(
            "voice.capture.state", TO_GAME, required={"state": _STR}, optional={"requestId": _STR}
        ),
    ]
}

#: Names under which an ack may point at the message it acknowledges.  The
#: seed does not name the field; the first is what our side writes.
ACK_REFERENCE_FIELDS = (
    "sourceMessageId",
    "ackedMessageId",
    "ackMessageId",
    "acknowledgedMessageId",
    "replyTo",
    "inReplyTo",
    "refMessageId",
)

MAX_ID_LENGTH = 256


class ProtocolViolation(ValueError):
    """
    An envelope broke the protocol; C{reason} says how, for the log.
    """

    def __init__(self, reason: str, messageId: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.messageId = messageId


def ackReference(fields: Mapping[str, Any]) -> str | None:
    """
    The messageId an ack acknowledges, under whichever accepted name it came.
    """
    for name in ACK_REFERENCE_FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def textOfDelta(fields: Mapping[str, Any]) -> str:
    """
    The text piece of a C{reply.text.delta}, whichever accepted name it came
    under (C{text}, C{delta} or C{content}).
    """
    for name in ("text", "delta", "content"):
        value = fields.get(name)
        if isinstance(value, str):
            return value
    return ""


def _typeName(types: tuple[type, ...]) -> str:
    return " or ".join(
        {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            t.__name__, "object" if t is dict else "array" if t is list else t.__name__
        )
        for t in types
    )


def _isA(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _checkId(fields: Mapping[str, Any], name: str, required: bool) -> None:
    value = fields.get(name)
    if value is None and not required:
        return
    if not isinstance(value, str) or not value:
        raise ProtocolViolation(f"{name} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise ProtocolViolation(f"{name} is longer than {MAX_ID_LENGTH} characters")


def validate(
    fields: Any,
    direction: Direction,
    sessionId: str | None = None,
) -> MessageSpec:
    """
    Check one decoded envelope against the seed and return its spec.

    @param sessionId: the session this connection has established, or
        C{None} before C{welcome}; after it, every envelope must carry it.
    @raise ProtocolViolation: with a reason fit for the log.
    """
    if not isinstance(fields, dict):
        raise ProtocolViolation("an envelope must be a JSON object")
    messageId = fields.get("messageId") if isinstance(fields.get("messageId"), str) else None
    try:
        if fields.get("protocol") != PROTOCOL:
            raise ProtocolViolation(
                f"protocol must be {PROTOCOL!r}, got {fields.get('protocol')!r}"
            )
        version = fields.get("protocolVersion")
        # "3" as a string is a variant a careful reader accepts; 3.0 or True is not.
        if not (version == PROTOCOL_VERSION and type(version) is int) and version != "3":
            raise ProtocolViolation(f"protocolVersion must be {PROTOCOL_VERSION}, got {version!r}")
        kind = fields.get("type")
        if not isinstance(kind, str) or not kind:
            raise ProtocolViolation("type must be a non-empty string")
        spec = MESSAGES.get(kind)
        if spec is None:
            raise ProtocolViolation(f"unknown message type {kind!r}")
        if direction not in spec.directions:
            raise ProtocolViolation(f"{kind} may not be sent {direction.value.replace('_', ' ')}")
        _checkId(fields, "messageId", required=True)
        timestamp = fields.get("timestamp")
        if not isinstance(timestamp, str):
            raise ProtocolViolation("timestamp must be an ISO 8601 string")
        try:
            datetime.fromisoformat(timestamp)
        except ValueError:
            raise ProtocolViolation(f"timestamp {timestamp[:40]!r} is not ISO 8601")
        if sessionId is not None and kind != "hello":
            if fields.get("sessionId") != sessionId:
                raise ProtocolViolation(
                    f"sessionId {str(fields.get('sessionId'))[:64]!r} is not this session's"
                )
        elif "sessionId" in fields and kind != "hello":
            _checkId(fields, "sessionId", required=False)
        for name, types in spec.required.items():
            if name not in fields:
                raise ProtocolViolation(f"{kind} is missing {name}")
            if not _isA(fields[name], types):
                raise ProtocolViolation(f"{kind}.{name} must be {_typeName(types)}")
        for name, types in spec.optional.items():
            if fields.get(name) is not None and not _isA(fields[name], types):
                raise ProtocolViolation(f"{kind}.{name} must be {_typeName(types)}")
        for name in ("requestId", "eventId"):
            _checkId(fields, name, required=False)
        if kind == "ack" and ackReference(fields) is None:
            raise ProtocolViolation("ack does not say which messageId it acknowledges")
        return spec
    except ProtocolViolation as e:
        e.messageId = messageId
        raise


# Static types for code that builds or reads messages.  Every TypedDict is
# total=False past the common head: unknown fields are kept, so these describe
# what we read and write, not everything that may be present.


class EnvelopeHead(TypedDict):
    protocol: str
    protocolVersion: int
    type: str
    messageId: str
    timestamp: str
    sessionId: NotRequired[str]


class CardTransfer(TypedDict, total=False):
    format: Literal["chara_card_v2"]
    mode: Literal["snapshot", "patch", "reference"]
    targetHash: str
    baseHash: str
    card: dict[str, Any]
    patch: list[dict[str, Any]]


class AudioInput(TypedDict, total=False):
    format: Literal["pcm_s16le", "pcm_f32le"]
    sampleRate: int
    channels: int
    language: str
    data: str


class ReplyEvent(TypedDict, total=False):
    text: str
    audio: AudioInput


class OutputAudio(TypedDict, total=False):
    model: str
    voice: str
    format: str


class Output(TypedDict, total=False):
    modalities: list[str]
    language: str
    audio: OutputAudio


class Hello(EnvelopeHead, total=False):
    clientVersion: str


class Welcome(EnvelopeHead):
    serverVersion: str


class Ack(EnvelopeHead, total=False):
    sourceMessageId: str
    duplicate: bool


class CharacterSync(EnvelopeHead):
    integrationId: str
    characterId: str
    card: CardTransfer


class CharacterSynced(EnvelopeHead, total=False):
    characterId: str
    integrationId: str
    targetHash: str


class ReplyRequest(EnvelopeHead):
    requestId: str
    eventId: NotRequired[str]
    integrationId: str
    characterId: str
    event: ReplyEvent
    output: NotRequired[Output]
    player: NotRequired[dict[str, Any]]
    card: CardTransfer
    interactionMode: NotRequired[str]
    promptScene: NotRequired[dict[str, Any]]
    promptDirective: NotRequired[dict[str, Any]]


class VoiceCaptureStart(EnvelopeHead):
    requestId: str
    eventId: NotRequired[str]
    integrationId: str
    characterId: str
    output: NotRequired[Output]
    player: NotRequired[dict[str, Any]]
    card: CardTransfer


class RequestRef(EnvelopeHead):
    """reply.accepted, reply.completed, reply.cancelled, request.cancel,
    voice.capture.stop and voice.capture.cancel: a requestId and nothing more."""

    requestId: str


class ReplyTextDelta(EnvelopeHead):
    requestId: str
    sequence: int
    text: str


class ReplyTextCompleted(EnvelopeHead, total=False):
    requestId: str
    text: str
    stats: dict[str, Any]


class ReplyAudioStart(EnvelopeHead, total=False):
    requestId: str
    format: str
    sampleRate: int
    channels: int


class ReplyAudioChunk(EnvelopeHead):
    requestId: str
    sequence: int
    segmentSequence: int
    data: str


class ReplyAudioCompleted(EnvelopeHead, total=False):
    requestId: str
    segments: int
    chunks: int
    bytes: int
    durationMs: float
    synthesisMs: float


class CapacityUpdate(EnvelopeHead):
    acceptingRequests: bool
    queueDepth: int
    queueLimit: int


class RequestError(EnvelopeHead, total=False):
    requestId: str
    sourceMessageId: str
    code: str
    message: str
    retryable: bool


class VoiceCaptureLevel(EnvelopeHead, total=False):
    requestId: str
    level: float


class VoiceCaptureState(EnvelopeHead, total=False):
    requestId: str
    state: str


#: Error codes the seed names, plus the ones this middleware adds (documented).
ERROR_CODES = frozenset(
    {
        "card_resync_required",
        "invalid_character_card",
        "service_not_started",
        "capacity_exceeded",
        "duplicate_request",
        "microphone_not_enabled",
        "unsupported_language",
        "unsupported_voice",
        "request_failed",
        # Added by rpmiddleware for conditions only the middleware sees.
        "engine_disconnected",
        "engine_unavailable",
        "invalid_audio",
        "content_blocked",
    }
)

AUDIO_INPUT_LANGUAGES = frozenset({"en", "ar", "es", "ja", "ko", "vi", "uk", "zh"})
SPEECH_OUTPUT_LANGUAGES = frozenset(
    (
        "en ko es pt fr de it pl ru nl cs ar zh ja hu tr fi sk "
        "da hr el sv nb he uk id ms vi th ro bg"
    ).split()
)
VOICES = frozenset([f"F{i}" for i in range(1, 6)] + [f"M{i}" for i in range(1, 6)])
SPEECH_MODEL = "gemtavern-supertonic-3"
INPUT_AUDIO_FORMATS = frozenset({"pcm_s16le", "pcm_f32le"})
INPUT_SAMPLE_RATE = 16000
MAX_INPUT_AUDIO_SECONDS = 30.0
OUTPUT_SAMPLE_RATE = 44100
