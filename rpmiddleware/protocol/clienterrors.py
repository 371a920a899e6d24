"""
Error codes of the voice-client protocol, and how RPEngine's become them.

A client speaks only the seed's codes (WEBRTC_UNAVAILABLE ... RATE_LIMITED).
Every C{request.error} that reaches a client is mapped through
L{ENGINE_TO_CLIENT}, and the original code and C{retryable} travel along as
C{engineCode} and C{retryable}, so a client that knows RPEngine can still
tell C{unsupported_voice} from C{unsupported_language}.  The table is
context-free on purpose: the same RPEngine code always gives the same client
code, whatever the turn was.  C{docs/client-protocol.md} has it with reasons.
L{AudioDecodeError} is a client's recording refused, with its code.
"""

from __future__ import annotations

from typing import Any

WEBRTC_UNAVAILABLE = "WEBRTC_UNAVAILABLE"
CONNECTION_FAILED = "CONNECTION_FAILED"
SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
SESSION_EXPIRED = "SESSION_EXPIRED"
STT_ERROR = "STT_ERROR"
STT_TIMEOUT = "STT_TIMEOUT"
LLM_ERROR = "LLM_ERROR"
LLM_TIMEOUT = "LLM_TIMEOUT"
TTS_ERROR = "TTS_ERROR"
TTS_TIMEOUT = "TTS_TIMEOUT"
AUDIO_PROCESSING_ERROR = "AUDIO_PROCESSING_ERROR"
VAD_ERROR = "VAD_ERROR"
INVALID_MESSAGE = "INVALID_MESSAGE"
INVALID_AUDIO_FORMAT = "INVALID_AUDIO_FORMAT"
TOOL_ERROR = "TOOL_ERROR"
PLAYBOOK_ERROR = "PLAYBOOK_ERROR"
INTERNAL_ERROR = "INTERNAL_ERROR"
RATE_LIMITED = "RATE_LIMITED"

#: Every code the seed defines; nothing else is ever sent as C{code}.
CLIENT_CODES = frozenset(
    {
        WEBRTC_UNAVAILABLE,
        CONNECTION_FAILED,
        SESSION_NOT_FOUND,
        SESSION_EXPIRED,
        STT_ERROR,
        STT_TIMEOUT,
        LLM_ERROR,
        LLM_TIMEOUT,
        TTS_ERROR,
        TTS_TIMEOUT,
        AUDIO_PROCESSING_ERROR,
        VAD_ERROR,
        INVALID_MESSAGE,
        INVALID_AUDIO_FORMAT,
        TOOL_ERROR,
        PLAYBOOK_ERROR,
        INTERNAL_ERROR,
        RATE_LIMITED,
    }
)

#: RPEngine's C{request.error} codes (and the middleware's own) -> client codes.
#: RPEngine's codes are the ones C{crates/rp-engine-core/src/app.rs} emits
#: (C{preflight}, C{start_next_reply}, C{begin_gemma}, C{stt_completed},
#: C{tts_completed}, C{request_error}); C{retryable} is passed on as RPEngine
#: set it (true only for card_resync_required and capacity_exceeded).
ENGINE_TO_CLIENT: dict[str, str] = {
    # The request broke RPEngine's envelope rules.  The endpoint checks the
    # client's options with the same rules first (rpmiddleware.protocol.rules),
    # so this names something the client sent that slipped past them.
    "invalid_payload": INVALID_MESSAGE,
    # RPEngine refused the request's options when it began (today: its
    # output.responseProcessing rules), again what the client configured.
    "invalid_request": INVALID_MESSAGE,
    # The card and the turn's prompt fields do not fit the model's context:
    # the client must send a shorter card, scene or directive.
    "prompt_too_large": INVALID_MESSAGE,
    # Healed by the card-cache plugin; reaching a client means something is
    # wrong inside the middleware, not with the client.
    "card_resync_required": INTERNAL_ERROR,
    # The card the client sent (character message) was refused.
    "invalid_character_card": INVALID_MESSAGE,
    # RPEngine is open but its model service is not running.
    "service_not_started": LLM_ERROR,
    # RPEngine's queue (or the capacity gate's local one) is full.
    "capacity_exceeded": RATE_LIMITED,
    # requestIds are ours: a duplicate is a middleware fault.
    "duplicate_request": INTERNAL_ERROR,
    # voice-capture needs the microphone enabled in RPEngine, whose
    # voice-activity detection then drives the capture.
    "microphone_not_enabled": VAD_ERROR,
    # RPEngine has one microphone and it is taken by another capture.  The
    # endpoint refuses a client's second capture itself (INVALID_MESSAGE), so
    # this one is another client's or another game's: the microphone is busy,
    # the client's message was fine.
    "voice_capture_active": VAD_ERROR,
    # The client's configure asked for something RPEngine refuses; the same
    # code as when the endpoint refuses it locally.
    "unsupported_language": INVALID_MESSAGE,
    "unsupported_voice": INVALID_MESSAGE,
    # The speech-to-text model for the spoken language is not installed in
    # RPEngine (the player must install it there).
    "stt_model_not_installed": STT_ERROR,
    # The recording or capture held no words.
    "empty_speech": STT_ERROR,
    # The speech model answered at a rate RPEngine cannot send (not 44.1 kHz).
    "unsupported_sample_rate": TTS_ERROR,
    # RPEngine could not hand the synthesized speech to its transport.
    "audio_transport_failed": TTS_ERROR,
    # Generation failed (or RPEngine refused the request for another reason).
    "request_failed": LLM_ERROR,
    # The middleware's own codes (docs/protocol-choices.md).
    "engine_disconnected": LLM_ERROR,
    "engine_unavailable": RATE_LIMITED,
    "invalid_audio": INVALID_AUDIO_FORMAT,
    "content_blocked": LLM_ERROR,
    # RPEngine ended the turn with a terminal envelope that breaks protocol
    # v3 (rpmiddleware.engine.session.malformedEnding): its fault, not the
    # client's; the turn is over and may be asked again.
    "engine_protocol_error": LLM_ERROR,
    # File mode: RPEngine's tab stopped reading the mailbox folder (closed,
    # or frozen in the background) while the turn waited on it.
    "engine_not_reading": LLM_ERROR,
}

#: What a code RPEngine may add in a later version becomes.
UNKNOWN_ENGINE_CODE = INTERNAL_ERROR


class AudioDecodeError(ValueError):
    """
    A recording that cannot be used; C{code} is the client error code.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def clientCode(engineCode: str) -> str:
    """
    The seed's code for an RPEngine (or middleware) error code.
    """
    return ENGINE_TO_CLIENT.get(engineCode, UNKNOWN_ENGINE_CODE)


def errorMessage(code: str, message: str, retryable: bool = False, **extra: Any) -> dict[str, Any]:
    """
    A client C{error} message.  C{retryable} is always present: a client
    deciding whether to offer "try again" should not have to guess.
    """
    assert code in CLIENT_CODES, code
    return {"type": "error", "code": code, "message": message, "retryable": retryable, **extra}


def engineErrorMessage(fields: dict[str, Any], turnId: str | None = None) -> dict[str, Any]:
    """
    The client C{error} for a C{request.error} envelope's fields.
    """
    engineCode = str(fields.get("code") or "request_failed")
    message = fields.get("message")
    if not isinstance(message, str) or not message:
        message = f"RPEngine refused the turn ({engineCode})"
    extra: dict[str, Any] = {"engineCode": engineCode}
    if turnId is not None:
        extra["turnId"] = turnId
    return errorMessage(clientCode(engineCode), message, fields.get("retryable") is True, **extra)


class InvalidMessage(ValueError):
    """
    A client message that cannot be used; the text says why (it goes back to
    the client in an C{error} C{INVALID_MESSAGE}).
    """
