"""
Every message type of RPEngine protocol v3, typed, and the rules that check them.

Each type's fields are a L{Body} schema (a msgspec Struct): the static type
of the message and what L{validate} checks it with, in L{MESSAGES}.  The rules
of the head and those across fields (the session, the ids, the ack's
reference) are written out in L{validate}.  This is the one place that names
RPEngine's fields: every name is the one RPEngine's own code writes or reads
(C{crates/rp-engine-core/src/app.rs}, C{json_core.rs}; docs/protocol-choices.md
cites each), so the next protocol change is an edit here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from types import MappingProxyType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import msgspec

from rpmiddleware.protocol.envelope import PROTOCOL, PROTOCOL_VERSION, Direction, Envelope
from rpmiddleware.protocol.schema import problemOf

_Type = type
_BodyType = type["Body"]

TO_ENGINE = frozenset({Direction.TO_ENGINE})
TO_GAME = frozenset({Direction.TO_GAME})
BOTH = frozenset({Direction.TO_ENGINE, Direction.TO_GAME})


class Body(msgspec.Struct, frozen=True):
    """
    The fields one message type carries beside the envelope's head: the
    schema L{validate} checks it with, and its static type.  Fields not
    named are kept in the envelope and not checked (a newer RPEngine may
    send more); an optional field may arrive as JSON null, as RPEngine
    writes absent values.  A C{float} field takes an integer too.
    """


# The message set and every field name below are RPEngine's own
# (crates/rp-engine-core/src/app.rs, the payloads of its `send` calls;
# src/socket-adapter.ts for audio chunks).


class Hello(Body, frozen=True):
    clientVersion: str | None = None


class Welcome(Body, frozen=True):
    sessionId: str
    serverVersion: str
    # File mode only (docs/file-transport-v1.md): the game process's
    # identity and the first audio slot RPEngine may write
    # (src/filesystem-mailbox-adapter.ts consume).
    peerInstanceId: str | None = None
    nextAudioSlot: int | None = None


class Ack(Body, frozen=True):
    acknowledgedMessageId: str | None = None
    duplicate: bool | None = None


class CharacterSync(Body, frozen=True):
    integrationId: str
    characterId: str
    #: The card transfer descriptor; its shape is RPEngine's to judge
    #: (L{rpmiddleware.protocol.rules.checkCardTransfer}).
    card: dict[str, Any]


class CharacterSynced(Body, frozen=True):
    sourceMessageId: str | None = None
    integrationId: str | None = None
    characterId: str | None = None
    targetHash: str | None = None


class _Turn(Body, frozen=True, kw_only=True):
    """
    What opens a turn: C{reply.request} and C{voice.capture.start}.  The
    objects' insides are RPEngine's rules (L{rpmiddleware.protocol.rules}).
    """

    requestId: str
    integrationId: str
    characterId: str
    card: dict[str, Any]
    eventId: str | None = None
    output: dict[str, Any] | None = None
    player: dict[str, Any] | None = None
    interactionMode: str | None = None
    promptScene: dict[str, Any] | None = None
    promptDirective: dict[str, Any] | None = None


class ReplyRequest(_Turn, frozen=True, kw_only=True):
    event: dict[str, Any]


class VoiceCaptureStart(_Turn, frozen=True, kw_only=True):
    returnTranscript: bool | None = None
    silenceBehavior: str | None = None


class RequestRef(Body, frozen=True):
    """
    A requestId and nothing more: C{request.cancel}, C{reply.completed}'s
    head, C{voice.capture.stop} and C{cancel}, the echoed recording.
    """

    requestId: str


class ReplyAccepted(RequestRef, frozen=True):
    eventId: str | None = None
    resolvedCardHash: str | None = None
    queueDepth: int | None = None


class ReplyTextDelta(RequestRef, frozen=True):
    sequence: int
    delta: str


class ReplyTextCompleted(RequestRef, frozen=True):
    text: str | None = None
    tokenCount: int | None = None
    elapsedMs: float | None = None
    extractedContent: dict[str, Any] | None = None


class ReplyAudioStart(RequestRef, frozen=True):
    format: str | None = None
    sampleRate: int | None = None
    channels: int | None = None


class ReplyAudioChunk(RequestRef, frozen=True):
    sequence: int
    segmentSequence: int
    data: str
    segmentChunkSequence: int | None = None
    segmentChunkCount: int | None = None


class ReplyAudioCompleted(RequestRef, frozen=True):
    chunkCount: int | None = None
    totalBytes: int | None = None
    durationSeconds: float | None = None
    elapsedMs: float | None = None
    segmentCount: int | None = None


class ReplyCompleted(RequestRef, frozen=True):
    modalities: list[Any] | None = None


class ReplyAudioSegment(RequestRef, frozen=True):
    """
    File transport v1: one synthesised phrase as a WAV in an audio slot,
    instead of reply.audio.start and chunks (src/filesystem-mailbox-adapter.ts
    sendAudioNow; tools/mock-game/server.mjs).
    """

    segmentSequence: int
    slotIndex: int
    path: str
    format: str
    sampleRate: int
    channels: int
    spokenText: str | None = None
    durationSeconds: float | None = None
    byteLength: int | None = None
    peerInstanceId: str | None = None


class ReplyAudioSegmentConsumed(Body, frozen=True):
    """
    File transport v1: the game read an audio slot (restoreSilence).
    """

    slotIndex: int
    requestId: str | None = None
    segmentSequence: int | None = None
    peerInstanceId: str | None = None


class ReplyCancelled(RequestRef, frozen=True):
    reason: str | None = None


class CapacityUpdate(Body, frozen=True):
    acceptingRequests: bool
    queueDepth: int
    queueLimit: int


class RequestError(Body, frozen=True):
    code: str
    requestId: str | None = None
    sourceMessageId: str | None = None
    message: str | None = None
    retryable: bool | None = None


class VoiceCaptureLevel(Body, frozen=True):
    requestId: str | None = None
    seconds: float | None = None
    peak: float | None = None
    rms: float | None = None


class VoiceCaptureState(Body, frozen=True):
    state: str
    requestId: str | None = None
    seconds: float | None = None
    autoEndEnabled: bool | None = None
    message: str | None = None


class VoiceCaptureTranscript(RequestRef, frozen=True):
    text: str
    language: str | None = None
    elapsedMs: float | None = None


def _pythonTypes(hint: Any) -> tuple[type, ...]:
    """
    The Python types a JSON value of a L{Body} field's type decodes to.
    """
    union = get_origin(hint) in (UnionType, Union)
    kinds = [t for t in get_args(hint) if t is not type(None)] if union else [hint]
    result: list[type] = []
    for kind in kinds:
        origin = get_origin(kind) or kind
        result.extend((int, float) if origin is float else (origin,))
    return tuple(result)


@dataclass(frozen=True)
class MessageSpec:
    """
    What one message type must carry, and which way it may travel.
    """

    type: str
    directions: frozenset[Direction]
    #: The schema of the fields beside the head.
    body: _BodyType = Body
    #: Whether this message starts work that ends with a terminal reply.
    opensRequest: bool = False
    #: Whether this message ends the request named by its requestId.
    terminal: bool = False
    #: Whether it exists only in file transport v1 (RPEngine's folder
    #: mailbox); a WebSocket peer that sends it breaks the protocol.
    fileModeOnly: bool = False

    @property
    def required(self) -> Mapping[str, tuple[_Type, ...]]:
        """
        The body's required fields and the Python types each may hold.
        """
        return _fieldTypes(self.body)[0]

    @property
    def optional(self) -> Mapping[str, tuple[_Type, ...]]:
        """
        The body's optional fields (null or absent allowed) and their types.
        """
        return _fieldTypes(self.body)[1]


@cache
def _fieldTypes(
    body: type[Body],
) -> tuple[Mapping[str, tuple[type, ...]], Mapping[str, tuple[type, ...]]]:
    hints = get_type_hints(body)
    required: dict[str, tuple[type, ...]] = {}
    optional: dict[str, tuple[type, ...]] = {}
    for info in msgspec.structs.fields(body):
        (required if info.required else optional)[info.name] = _pythonTypes(hints[info.name])
    return MappingProxyType(required), MappingProxyType(optional)


def _spec(type: str, directions: frozenset[Direction], **kw: Any) -> MessageSpec:
    return MessageSpec(type, directions, **kw)


MESSAGES: dict[str, MessageSpec] = {
    s.type: s
    for s in [
        _spec("hello", TO_GAME, body=Hello),
        _spec("welcome", TO_ENGINE, body=Welcome),
        _spec("ack", BOTH, body=Ack),
        _spec("character.sync", TO_ENGINE, body=CharacterSync),
        _spec("character.synced", TO_GAME, body=CharacterSynced),
        _spec("reply.request", TO_ENGINE, body=ReplyRequest, opensRequest=True),
        _spec("reply.accepted", TO_GAME, body=ReplyAccepted),
        _spec("reply.text.delta", TO_GAME, body=ReplyTextDelta),
        _spec("reply.text.completed", TO_GAME, body=ReplyTextCompleted),
        _spec("reply.audio.start", TO_GAME, body=ReplyAudioStart),
        _spec("reply.audio.chunk", TO_GAME, body=ReplyAudioChunk),
        _spec("reply.audio.completed", TO_GAME, body=ReplyAudioCompleted),
        _spec("reply.completed", TO_GAME, body=ReplyCompleted, terminal=True),
        _spec("reply.audio.segment", TO_GAME, body=ReplyAudioSegment, fileModeOnly=True),
        _spec(
            "reply.audio.segment.consumed",
            TO_ENGINE,
            body=ReplyAudioSegmentConsumed,
            fileModeOnly=True,
        ),
        _spec("request.cancel", TO_ENGINE, body=RequestRef),
        _spec("reply.cancelled", TO_GAME, body=ReplyCancelled, terminal=True),
        _spec("capacity.update", TO_GAME, body=CapacityUpdate),
        _spec("request.error", TO_GAME, body=RequestError, terminal=True),
        _spec("voice.capture.start", TO_ENGINE, body=VoiceCaptureStart, opensRequest=True),
        _spec("voice.capture.stop", TO_ENGINE, body=RequestRef),
        _spec("voice.capture.cancel", TO_ENGINE, body=RequestRef),
        _spec("voice.capture.level", TO_GAME, body=VoiceCaptureLevel),
        _spec("voice.capture.state", TO_GAME, body=VoiceCaptureState),
        _spec("voice.capture.transcript", TO_GAME, body=VoiceCaptureTranscript),
        # RPEngine echoes the recording only to its own mock game (app.rs
        # capture_completed); accepted so that such a frame is not an error.
        _spec("voice.capture.audio.start", TO_GAME, body=RequestRef),
        _spec("voice.capture.audio.chunk", TO_GAME, body=RequestRef),
        _spec("voice.capture.audio.completed", TO_GAME, body=RequestRef),
    ]
}

#: Where an ack names the message it acknowledges: RPEngine writes and reads
#: C{acknowledgedMessageId} (app.rs transport_message).  The others are read
#: only, for peers written to older drafts.
ACK_REFERENCE_FIELDS = ("acknowledgedMessageId", "sourceMessageId")

#: The messages that withdraw a request instead of asking for one (app.rs
#: stop_capture, cancel_request): each names only its requestId.
WITHDRAWING = frozenset({"request.cancel", "voice.capture.cancel", "voice.capture.stop"})
#: Those that call a request off whole (stopping a capture does not: its
#: reply follows).
CANCELLING = WITHDRAWING - {"voice.capture.stop"}
#: The types that open a request, and those that end one, for plugins that
#: follow requests.
OPENING = frozenset(kind for kind, spec in MESSAGES.items() if spec.opensRequest)
TERMINAL = frozenset(kind for kind, spec in MESSAGES.items() if spec.terminal)
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
        try:
            msgspec.convert(fields, spec.body, strict=True)
        except msgspec.ValidationError as e:
            problem = problemOf(e)
            if problem.kind == "missing":
                raise ProtocolViolation(f"{kind} is missing {problem.field}")
            raise ProtocolViolation(f"{problem.at(kind)} {problem.problem}")
        for name in ("requestId", "eventId"):
            _checkId(fields, name, required=False)
        if kind == "ack" and ackReference(fields) is None:
            raise ProtocolViolation("ack does not say which messageId it acknowledges")
        return spec
    except ProtocolViolation as e:
        e.messageId = messageId
        raise


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
