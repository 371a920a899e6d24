"""
What every audio path needs that costs nothing to import: the PCM formats
and soxr qualities the middleware takes, strict base64, the exact length a
conversion promises, where a speech segment ends, and the WAV header.

What needs numpy and soxr (decoding, encoding and resampling samples) is
L{rpmiddleware.audio.pcm}, imported where audio is first converted, so that an
idle daemon never loads them.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping
from typing import Any

import pybase64

#: Accepted spellings of the two PCM formats -> the seed's name.
FORMAT_ALIASES = {
    "pcm_s16le": "pcm_s16le",
    "s16le": "pcm_s16le",
    "s16": "pcm_s16le",
    "pcm_s16": "pcm_s16le",
    "pcm_f32le": "pcm_f32le",
    "f32le": "pcm_f32le",
    "f32": "pcm_f32le",
    "pcm_f32": "pcm_f32le",
}
#: Bytes per sample of each format.
SAMPLE_WIDTHS = {"pcm_s16le": 2, "pcm_f32le": 4}
#: soxr's quality recipes, lowest to highest.
QUALITIES = ("QQ", "LQ", "MQ", "HQ", "VHQ")


class AudioError(ValueError):
    """
    Audio that cannot be converted; the message says exactly why and is fit
    to show to the game.
    """


def canonicalFormat(name: Any) -> str:
    """
    The seed's name for a PCM format given under any accepted spelling.

    @raise AudioError: for anything that is not 16-bit integer or 32-bit
        float little-endian PCM.
    """
    canonical = FORMAT_ALIASES.get(name.lower()) if isinstance(name, str) else None
    if canonical is None:
        raise AudioError(
            f"format {name!r} is not supported (expected pcm_s16le or pcm_f32le, or s16/f32)"
        )
    return canonical


def strictBase64(text: str | bytes) -> bytes:
    """
    Strict base64 decoding: what C{base64.b64decode(text, validate=True)}
    accepts and gives, by C{pybase64} (SIMD: about twenty times CPython's
    speed, which counts for every speech chunk and recording that passes).

    @raise ValueError: (C{binascii.Error}) for anything but the base64
        alphabet with correct padding.
    """
    try:
        return pybase64.b64decode(text, validate=True)
    except ValueError:
        # pybase64 also refuses padding after a whole group ("AAAA="), which
        # the standard library's strict mode lets pass: it has the last word.
        return base64.b64decode(text, validate=True)


def decodeBase64(text: Any) -> bytes:
    """
    Strict base64: a stray character is an error rather than silently
    skipped, because skipping shifts every later sample by a byte.
    """
    if not isinstance(text, str):
        raise AudioError("data must be a base64 string")
    try:
        return strictBase64(text)
    except ValueError:
        raise AudioError("data is not valid base64")


def encodeBase64(data: bytes) -> str:
    return pybase64.b64encode_as_string(data)


def base64Bytes(text: str) -> int:
    """
    How many bytes a padded base64 string decodes to, without decoding it.
    """
    return len(text) // 4 * 3 - text[-2:].count("=") if text else 0


def exactLength(inputSamples: int, inRate: int, outRate: int) -> int:
    """
    C{round(inputSamples * outRate / inRate)} computed exactly, with Python's
    rounding (halves to even): the length every conversion here promises.
    Integer arithmetic: it runs for every streamed piece.
    """
    whole, rest = divmod(inputSamples * outRate, inRate)
    twice = 2 * rest
    if twice > inRate or (twice == inRate and whole & 1):
        whole += 1
    return whole


def endsSegment(fields: Mapping[str, Any]) -> bool:
    """
    Whether a C{reply.audio.chunk} is its segment's last: RPEngine numbers
    each segment's chunks (C{segmentChunkSequence} of C{segmentChunkCount},
    src/socket-adapter.ts), so the last is known when it arrives, and a
    segment's resampler can be flushed with it.  C{final} is read for older
    peers.
    """
    index, count = fields.get("segmentChunkSequence"), fields.get("segmentChunkCount")
    if type(index) is int and type(count) is int:
        return index == count - 1
    return fields.get("final") is True


_WAV_HEADER = struct.Struct("<4sI4s4sIHHIIHH4sI")


def pcm16Wav(pcm: bytes, sampleRate: int, channels: int = 1) -> bytes:
    """
    A canonical 44-byte-header PCM16 WAV: what RPEngine writes into a
    mailbox slot (src/filesystem-mailbox-adapter.ts pcm16Wav), and what a
    client asking for one WAV per reply gets.
    """
    header = _WAV_HEADER.pack(
        b"RIFF",
        36 + len(pcm),
        b"WAVE",
        b"fmt ",
        16,
        1,
        channels,
        sampleRate,
        sampleRate * channels * 2,
        channels * 2,
        16,
        b"data",
        len(pcm),
    )
    return header + pcm
