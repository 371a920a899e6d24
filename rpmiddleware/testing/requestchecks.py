"""
The checks RPEngine's core makes of a turn after it accepted it, and the
shape of its errors.

The envelope itself was checked on arrival
(L{rpmiddleware.protocol.rules.checkEnvelope}, RPEngine's json_core.rs
C{validate_envelope_value}); what is left is decided when a reply becomes
active (crates/rp-engine-core/src/app.rs C{start_next_reply}): the output
language must be one speech synthesis knows and the voice one of its ten,
whatever the modalities, and a recording must decode (audio.rs
C{decode_audio_input_inner}).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import Any

# RPEngine checks the output language against the languages Supertonic 3
# speaks even for text-only replies (app.rs supported_tts_language), and the
# voice against its ten (supported_voice); ENGINE_RETRYABLE_CODES are the
# errors a game may retry as they are (request_error_code).
from rpmiddleware.protocol.messages import (
    ENGINE_RETRYABLE_CODES,
    INPUT_SAMPLE_RATE,
    SPEECH_OUTPUT_LANGUAGES,
    VOICES,
)

#: The voice when a request names none (app.rs start_next_reply).
DEFAULT_VOICE = "F4"
#: Speech recognition takes at most this much audio (audio.rs MAX_STT_SECONDS).
MAX_STT_SECONDS = 30
#: Names of the languages speech recognition has a model for (app.rs
#: language_name), for messages.
STT_LANGUAGE_NAMES = {
    "ar": "Arabic",
    "es": "Spanish",
    "ja": "Japanese",
    "ko": "Korean",
    "vi": "Vietnamese",
    "uk": "Ukrainian",
    "zh": "Chinese",
    "en": "English",
}


class RequestError(Exception):
    """
    A request RPEngine refuses or fails, with the fields of its
    C{request.error}; C{retryable} is RPEngine's rule unless given.
    """

    def __init__(self, code: str, message: str, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = code in ENGINE_RETRYABLE_CODES if retryable is None else retryable


def pointer(fields: Any, *path: str) -> Any:
    """
    The value at C{path} inside nested objects, or C{None}.
    """
    for name in path:
        if not isinstance(fields, dict):
            return None
        fields = fields.get(name)
    return fields


def checkSpeechOutput(fields: dict[str, Any]) -> None:
    """
    The output language and voice of an active reply.

    @raise RequestError: C{unsupported_language} or C{unsupported_voice}.
    """
    language = pointer(fields, "output", "language")
    language = language if isinstance(language, str) else "en"
    if language not in SPEECH_OUTPUT_LANGUAGES:
        raise RequestError("unsupported_language", f"speech output has no language {language!r}")
    voice = pointer(fields, "output", "audio", "voice")
    voice = voice if isinstance(voice, str) else DEFAULT_VOICE
    if voice not in VOICES:
        raise RequestError("unsupported_voice", f"there is no voice {voice!r}; use F1-F5 or M1-M5")


def wantsAudio(fields: dict[str, Any]) -> bool:
    modalities = pointer(fields, "output", "modalities")
    return isinstance(modalities, list) and "audio" in modalities


def recordingSeconds(audio: dict[str, Any]) -> float:
    """
    The length of an C{event.audio} recording, decoded as RPEngine decodes
    it for speech recognition.

    @raise RequestError: C{request_failed} if it does not decode.
    """
    if audio.get("sampleRate") != INPUT_SAMPLE_RATE or audio.get("channels") != 1:
        raise RequestError("request_failed", "speech recognition needs 16 kHz mono audio")
    try:
        data = base64.b64decode(str(audio.get("data", "")), validate=True)
    except (binascii.Error, ValueError):
        raise RequestError("request_failed", "the recording is not valid base64")
    width = 2 if audio.get("format") == "pcm_s16le" else 4
    if not data or len(data) % width:
        raise RequestError("request_failed", "the recording is not a whole number of samples")
    samples = len(data) // width
    if width == 4:
        for (value,) in struct.iter_unpack("<f", data):
            if not math.isfinite(value):
                raise RequestError("request_failed", "the recording has a non-finite sample")
    if samples > INPUT_SAMPLE_RATE * MAX_STT_SECONDS:
        raise RequestError("request_failed", f"the recording is longer than {MAX_STT_SECONDS} s")
    return samples / INPUT_SAMPLE_RATE
