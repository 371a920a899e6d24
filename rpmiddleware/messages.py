"""
Every message type of RPEngine protocol v3, typed, and the rules that check them.

Two views of one table: the C{TypedDict}s give code static types, and
L{MESSAGES} drives validation at run time.  This is the one place that names
RPEngine's fields: every name is the one RPEngine's own code writes or reads
(C{crates/rp-engine-core/src/app.rs}, C{json_core.rs}; docs/protocol-choices.md
cites each), so the next protocol change is an edit here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict

from rpmiddleware.envelope import PROTOCOL, PROTOCOL_VERSION, Direction, Envelope

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
    #: Whether it exists only in file transport v1 (RPEngine's folder
    #: mailbox); a WebSocket peer that sends it breaks the protocol.
    fileModeOnly: bool = False


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
        # The message set and every field name below are RPEngine's own
        # (crates/rp-engine-core/src/app.rs, the payloads of its `send`
        # calls; src/socket-adapter.ts for audio chunks).  Optional fields
        # may arrive as JSON null: RPEngine writes absent values that way.
        _spec("hello", TO_GAME, optional={"clientVersion": _STR}),
        _spec(
            "welcome",
            TO_ENGINE,
            required={"sessionId": _STR, "serverVersion": _STR},
            # File mode only (docs/file-transport-v1.md): the game process's
            # identity and the first audio slot RPEngine may write
            # (src/filesystem-mailbox-adapter.ts consume).
            optional={"peerInstanceId": _STR, "nextAudioSlot": _INT},
        ),
        _spec("ack", BOTH, optional={"acknowledgedMessageId": _STR, "duplicate": _BOOL}),
        _spec(
            "character.sync",
            TO_ENGINE,
            required={"integrationId": _STR, "characterId": _STR, "card": _DICT},
        ),
        _spec(
            "character.synced",
            TO_GAME,
            optional={
                "sourceMessageId": _STR,
                "integrationId": _STR,
                "characterId": _STR,
                "targetHash": _STR,
            },
        ),
        _spec(
            "reply.request",
            TO_ENGINE,
            required={**_TURN_FIELDS, "event": _DICT},
            optional=_TURN_OPTIONAL,
            opensRequest=True,
        ),
        _spec(
            "reply.accepted",
            TO_GAME,
            required={"requestId": _STR},
            optional={"eventId": _STR, "resolvedCardHash": _STR, "queueDepth": _INT},
        ),
        _spec(
            "reply.text.delta",
            TO_GAME,
            required={"requestId": _STR, "sequence": _INT, "delta": _STR},
        ),
        _spec(
            "reply.text.completed",
            TO_GAME,
            required={"requestId": _STR},
            optional={
                "text": _STR,
                "tokenCount": _INT,
                "elapsedMs": _NUM,
                "extractedContent": _DICT,
            },
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
            optional={"segmentChunkSequence": _INT, "segmentChunkCount": _INT},
        ),
        _spec(
            "reply.audio.completed",
            TO_GAME,
            required={"requestId": _STR},
            optional={
                "chunkCount": _INT,
                "totalBytes": _INT,
                "durationSeconds": _NUM,
                "elapsedMs": _NUM,
                "segmentCount": _INT,
            },
        ),
        _spec(
            "reply.completed",
            TO_GAME,
            required={"requestId": _STR},
            optional={"modalities": _LIST},
            terminal=True,
        ),
        # File transport v1: one synthesised phrase as a WAV in an audio
        # slot, instead of reply.audio.start and chunks; the game answers
        # that it read the slot (src/filesystem-mailbox-adapter.ts
        # sendAudioNow, restoreSilence; tools/mock-game/server.mjs).
        _spec(
            "reply.audio.segment",
            TO_GAME,
            required={
                "requestId": _STR,
                "segmentSequence": _INT,
                "slotIndex": _INT,
                "path": _STR,
                "format": _STR,
                "sampleRate": _INT,
                "channels": _INT,
            },
            optional={
                "spokenText": _STR,
                "durationSeconds": _NUM,
                "byteLength": _INT,
                "peerInstanceId": _STR,
            },
            fileModeOnly=True,
        ),
        _spec(
            "reply.audio.segment.consumed",
            TO_ENGINE,
            required={"slotIndex": _INT},
            optional={"requestId": _STR, "segmentSequence": _INT, "peerInstanceId": _STR},
            fileModeOnly=True,
        ),
        _spec("request.cancel", TO_ENGINE, required={"requestId": _STR}),
        _spec(
            "reply.cancelled",
            TO_GAME,
            required={"requestId": _STR},
            optional={"reason": _STR},
            terminal=True,
        ),
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
            optional={**_TURN_OPTIONAL, "returnTranscript": _BOOL, "silenceBehavior": _STR},
            opensRequest=True,
        ),
        _spec("voice.capture.stop", TO_ENGINE, required={"requestId": _STR}),
        _spec("voice.capture.cancel", TO_ENGINE, required={"requestId": _STR}),
        _spec(
            "voice.capture.level",
            TO_GAME,
            optional={"requestId": _STR, "seconds": _NUM, "peak": _NUM, "rms": _NUM},
        ),
        _spec(
            "voice.capture.state",
            TO_GAME,
            required={"state": _STR},
            optional={
                "requestId": _STR,
                "seconds": _NUM,
                "autoEndEnabled": _BOOL,
                "message": _STR,
            },
        ),
        _spec(
            "voice.capture.transcript",
            TO_GAME,
            required={"requestId": _STR, "text": _STR},
            optional={"language": _STR, "elapsedMs": _NUM},
        ),
        # RPEngine echoes the recording only to its own mock game (app.rs
        # capture_completed); accepted so that such a frame is not an error.
        _spec("voice.capture.audio.start", TO_GAME, required={"requestId": _STR}),
        _spec("voice.capture.audio.chunk", TO_GAME, required={"requestId": _STR}),
        _spec("voice.capture.audio.completed", TO_GAME, required={"requestId": _STR}),
    ]
}

#: Where an ack names the message it acknowledges: RPEngine writes and reads
#: C{acknowledgedMessageId} (app.rs transport_message).  The others are read
#: only, for peers written to older drafts.
ACK_REFERENCE_FIELDS = ("acknowledgedMessageId", "sourceMessageId")

#: The messages that withdraw a request instead of asking for one (app.rs
#: stop_capture, cancel_request): each names only its requestId.
WITHDRAWING = frozenset({"request.cancel", "voice.capture.cancel", "voice.capture.stop"})
#: RPEngine's queue limit (app.rs QUEUE_LIMIT).
ENGINE_QUEUE_LIMIT = 20
#: RPEngine remembers this many messageIds for duplicates, across reconnects
#: of the same tab (app.rs transport_message).
ENGINE_DEDUP_WINDOW = 2000
#: The largest message either side reads (json_core.rs MAX_MESSAGE_BYTES).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: PCM bytes per reply.audio.chunk as RPEngine cuts a phrase
#: (src/socket-adapter.ts, app.rs PCM_CHUNK_BYTES).
PCM_CHUNK_BYTES = 32 * 1024

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
    The text piece of a C{reply.text.delta}: RPEngine writes C{delta}
    (app.rs gemma_delta); C{text} and C{content} are read for older peers.
    """
    for name in ("delta", "text", "content"):
        value = fields.get(name)
        if isinstance(value, str):
            return value
    return ""


@dataclass(frozen=True)
class Capacity:
    """
    RPEngine's room for work, as its C{capacity.update} says it (app.rs
    publish_capacity): whether it takes requests, how many replies it holds
    and how many it would.  The default is what a session that has said
    nothing yet, or no RPEngine, has: no room.
    """

    acceptingRequests: bool = False
    queueDepth: int = 0
    queueLimit: int = 0

    @classmethod
    def fromEnvelope(cls, envelope: Envelope, previous: Capacity | None = None) -> Capacity | None:
        """
        The one reader of C{capacity.update}: what C{envelope} says, or
        C{None} when it is another type.

        A field that is missing or not of its type (a plugin's own update
        may be partial; RPEngine's is checked on arrival) keeps its value in
        C{previous} (default: the empty capacity); a negative count reads as 0.
        """
        if envelope.type != "capacity.update":
            return None
        base = previous if previous is not None else cls()
        accepting = envelope.get("acceptingRequests")
        depth = envelope.get("queueDepth")
        limit = envelope.get("queueLimit")
        return cls(
            accepting if isinstance(accepting, bool) else base.acceptingRequests,
            max(0, depth) if type(depth) is int else base.queueDepth,
            max(0, limit) if type(limit) is int else base.queueLimit,
        )


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
        # RPEngine acknowledges welcome before it adopts the session, so that
        # one ack carries sessionId null (app.rs transport_message).
        unsessioned = kind == "hello" or (kind == "ack" and fields.get("sessionId") is None)
        if sessionId is not None and not unsessioned:
            if fields.get("sessionId") != sessionId:
                raise ProtocolViolation(
                    f"sessionId {str(fields.get('sessionId'))[:64]!r} is not this session's"
                )
        elif "sessionId" in fields and not unsessioned:
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
    snapshot: dict[str, Any]
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
    processing: dict[str, Any]


class Output(TypedDict, total=False):
    modalities: list[str]
    language: str
    audio: OutputAudio
    responseProcessing: dict[str, Any]


class Hello(EnvelopeHead, total=False):
    clientVersion: str


class Welcome(EnvelopeHead):
    serverVersion: str


class Ack(EnvelopeHead, total=False):
    acknowledgedMessageId: str
    duplicate: bool


class CharacterSync(EnvelopeHead):
    integrationId: str
    characterId: str
    card: CardTransfer


class CharacterSynced(EnvelopeHead, total=False):
    sourceMessageId: str
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
    returnTranscript: NotRequired[bool]
    silenceBehavior: NotRequired[Literal["error", "restart"]]


class RequestRef(EnvelopeHead):
    """reply.accepted, reply.completed, reply.cancelled, request.cancel,
    voice.capture.stop and voice.capture.cancel: a requestId and nothing more."""

    requestId: str


class ReplyTextDelta(EnvelopeHead):
    requestId: str
    sequence: int
    delta: str


class ReplyTextCompleted(EnvelopeHead, total=False):
    requestId: str
    text: str
    tokenCount: int
    elapsedMs: float
    extractedContent: dict[str, list[str]]


class ReplyAudioStart(EnvelopeHead, total=False):
    requestId: str
    format: str
    sampleRate: int
    channels: int


class ReplyAudioChunk(EnvelopeHead):
    requestId: str
    sequence: int
    segmentSequence: int
    segmentChunkSequence: int
    segmentChunkCount: int
    data: str


class ReplyAudioSegment(EnvelopeHead, total=False):
    """File transport v1 only: one phrase as a WAV in an audio slot."""

    requestId: str
    segmentSequence: int
    spokenText: str
    slotIndex: int
    path: str
    format: str
    sampleRate: int
    channels: int
    durationSeconds: float
    byteLength: int
    peerInstanceId: str


class ReplyAudioCompleted(EnvelopeHead, total=False):
    requestId: str
    chunkCount: int
    totalBytes: int
    durationSeconds: float
    elapsedMs: float
    segmentCount: int


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
    seconds: float
    peak: float
    rms: float


class VoiceCaptureState(EnvelopeHead, total=False):
    requestId: str
    state: Literal["listening", "speech_started", "speech_ended"]
    seconds: float
    autoEndEnabled: bool
    message: str | None


class VoiceCaptureTranscript(EnvelopeHead, total=False):
    requestId: str
    text: str
    language: str
    elapsedMs: float


#: Every C{request.error} code RPEngine emits (app.rs preflight,
#: start_next_reply, stt_completed, request_error; json_core.rs and session.rs
#: through invalid_payload, card_resync_required, invalid_character_card;
#: src/app-host.ts audio_transport_failed), and the middleware's own.
ENGINE_ERROR_CODES = frozenset(
    {
        "invalid_payload",
        "card_resync_required",
        "invalid_character_card",
        "prompt_too_large",
        "service_not_started",
        "capacity_exceeded",
        "duplicate_request",
        "microphone_not_enabled",
        "voice_capture_active",
        "unsupported_language",
        "unsupported_voice",
        "invalid_request",
        "stt_model_not_installed",
        "empty_speech",
        "unsupported_sample_rate",
        "request_failed",
        "audio_transport_failed",
    }
)
#: The codes RPEngine marks retryable (app.rs request_error_code).
ENGINE_RETRYABLE_CODES = frozenset({"card_resync_required", "capacity_exceeded"})
#: Added by rpmiddleware for conditions only the middleware sees.
MIDDLEWARE_ERROR_CODES = frozenset(
    {
        "engine_disconnected",
        "engine_unavailable",
        "invalid_audio",
        "content_blocked",
        # Issue 21: RPEngine ended a turn with a malformed terminal envelope;
        # RPEngine's tab stopped reading the file mailbox.
        "engine_protocol_error",
        "engine_not_reading",
    }
)
ERROR_CODES = ENGINE_ERROR_CODES | MIDDLEWARE_ERROR_CODES

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
