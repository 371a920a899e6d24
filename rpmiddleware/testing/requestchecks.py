"""
The simulated RPEngine's checks of a turn's C{output} and C{event}.

Each check raises L{RequestError} with the error code RPEngine would put in its
C{request.error}; the order of the checks in the engine decides which of
several problems a request is rejected for.  The tables come from
L{rpmiddleware.messages}, which copies them from the seed.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from rpmiddleware.messages import (
    AUDIO_INPUT_LANGUAGES,
    INPUT_AUDIO_FORMATS,
    INPUT_SAMPLE_RATE,
    MAX_INPUT_AUDIO_SECONDS,
    SPEECH_MODEL,
    SPEECH_OUTPUT_LANGUAGES,
    VOICES,
)
from rpmiddleware.testing.tones import SAMPLE_WIDTHS, inputDuration

MODALITIES = ("text", "audio")


class RequestError(Exception):
    """
    A request RPEngine refuses, with the fields of its C{request.error}.
    """

    def __init__(self, code: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


def _failed(message: str) -> RequestError:
    return RequestError("request_failed", message)


def _nonEmptyString(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def checkIdentity(fields: Mapping[str, Any]) -> None:
    """
    A turn or sync names the integration and the character it is for.
    """
    for name in ("integrationId", "characterId"):
        if not _nonEmptyString(fields.get(name)):
            raise _failed(f"{name} must be a non-empty string")


def checkOutput(output: Any) -> bool:
    """
    Check C{output} and say whether speech was asked for.  A missing
    C{output} or C{modalities} means text only.
    """
    if output is None:
        return False
    if not isinstance(output, Mapping):
        raise _failed("output must be an object")
    modalities = output.get("modalities", ["text"])
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
        raise _failed("output.modalities must be an array of strings")
    unknown = [m for m in modalities if m not in MODALITIES]
    if unknown:
        raise _failed(f"output.modalities has unknown modality {unknown[0]!r}")
    if "text" not in modalities:
        raise _failed('output.modalities must be ["text"] or ["text", "audio"]')
    if "audio" not in modalities:
        return False
    language = output.get("language")
    if language not in SPEECH_OUTPUT_LANGUAGES:
        raise RequestError(
            "unsupported_language", f"output.language {language!r} is not a speech-output language"
        )
    audio = output.get("audio")
    if not isinstance(audio, Mapping):
        raise RequestError("unsupported_voice", "output.audio with a voice is required for speech")
    voice = audio.get("voice")
    if voice not in VOICES:
        raise RequestError(
            "unsupported_voice", f"output.audio.voice {voice!r} is not F1-F5 or M1-M5"
        )
    model = audio.get("model")
    if model is not None and model != SPEECH_MODEL:
        raise _failed(f"output.audio.model must be {SPEECH_MODEL!r}, got {model!r}")
    fmt = audio.get("format")
    if fmt is not None and fmt != "pcm_s16le":
        raise _failed(f"output.audio.format must be 'pcm_s16le', got {fmt!r}")
    return True


def checkEvent(event: Any) -> float | None:
    """
    Check C{event} and return the seconds of its recording, or C{None} if
    it has none.
    """
    if not isinstance(event, Mapping):
        raise _failed("event must be an object with text, audio or both")
    text = event.get("text")
    if text is not None and not isinstance(text, str):
        raise _failed("event.text must be a string")
    audio = event.get("audio")
    if not text and audio is None:
        raise _failed("event must have text or audio")
    if audio is None:
        return None
    return _checkAudio(audio)


def _checkAudio(audio: Any) -> float:
    if not isinstance(audio, Mapping):
        raise _failed("event.audio must be an object")
    fmt = audio.get("format")
    if fmt not in INPUT_AUDIO_FORMATS:
        raise _failed(f"event.audio.format must be pcm_s16le or pcm_f32le, got {fmt!r}")
    rate = audio.get("sampleRate")
    if rate != INPUT_SAMPLE_RATE or isinstance(rate, bool):
        raise _failed(f"event.audio.sampleRate must be {INPUT_SAMPLE_RATE}, got {rate!r}")
    channels = audio.get("channels")
    if channels != 1 or isinstance(channels, bool):
        raise _failed(f"event.audio.channels must be 1 (mono), got {channels!r}")
    data = audio.get("data")
    if not isinstance(data, str):
        raise _failed("event.audio.data must be a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _failed("event.audio.data is not valid base64")
    if not raw:
        raise _failed("event.audio.data is empty")
    if len(raw) % SAMPLE_WIDTHS[fmt]:
        raise _failed(f"event.audio.data is not a whole number of {fmt} samples")
    seconds = inputDuration(raw, fmt, INPUT_SAMPLE_RATE)
    if seconds > MAX_INPUT_AUDIO_SECONDS:
        raise _failed(f"audio longer than 30 s ({seconds:.2f} s)")
    language = audio.get("language")
    if language is not None and language not in AUDIO_INPUT_LANGUAGES:
        raise RequestError(
            "unsupported_language", f"event.audio.language {language!r} is not an input language"
        )
    return seconds
