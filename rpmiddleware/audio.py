"""
PCM decoding, encoding and resampling shared by the audio-resample plugin and
the client endpoint.

Samples travel between these functions as float32 arrays scaled to -1..1:
soxr works in float32 at no loss for 16-bit sources, and one representation
keeps every conversion a decode, an optional resample and an encode.  PCM16
is scaled by 32768 both ways so that a decode followed by an encode gives the
same bytes back.
"""

from __future__ import annotations

import base64
import binascii
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr

Samples = npt.NDArray[np.float32]

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

_PCM16_SCALE = 32768.0
_EMPTY: Samples = np.zeros(0, dtype=np.float32)


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


def decodeBase64(text: Any) -> bytes:
    """
    Strict base64: a stray character is an error rather than silently
    skipped, because skipping shifts every later sample by a byte.
    """
    if not isinstance(text, str):
        raise AudioError("data must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioError("data is not valid base64")


def encodeBase64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decodePcm(data: bytes, format: str, channels: int = 1) -> Samples:
    """
    Raw PCM bytes as float32 frames: shape C{(n,)} for mono, C{(n, channels)}
    otherwise.

    @raise AudioError: when the bytes are not a whole number of frames, or
        float samples are not finite.
    """
    width = SAMPLE_WIDTHS[format]
    frame = width * channels
    if len(data) % frame:
        raise AudioError(
            f"data has {len(data)} bytes, not a whole number of {frame}-byte frames "
            f"({format}, {channels} channel{'s' if channels > 1 else ''})"
        )
    if format == "pcm_s16le":
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(_PCM16_SCALE)
    else:
        samples = np.frombuffer(data, dtype="<f4").astype(np.float32)
        if not np.all(np.isfinite(samples)):
            raise AudioError("data holds NaN or infinite pcm_f32le samples")
    if channels > 1:
        return samples.reshape(-1, channels)
    return samples


def toMono(frames: Samples) -> Samples:
    """
    Downmix by averaging the channels: the average cannot clip, where a sum
    could.
    """
    if frames.ndim == 1:
        return frames
    return frames.mean(axis=1, dtype=np.float32)


def encodePcm(samples: Samples, format: str) -> bytes:
    """
    Float samples as PCM bytes; PCM16 is rounded to nearest and clipped.
    """
    if format == "pcm_f32le":
        return np.asarray(samples, dtype="<f4").tobytes()
    scaled = np.rint(np.asarray(samples, dtype=np.float64) * _PCM16_SCALE)
    return np.clip(scaled, -32768, 32767).astype("<i2").tobytes()


def exactLength(inputSamples: int, inRate: int, outRate: int) -> int:
    """
    C{round(inputSamples * outRate / inRate)} computed exactly, with Python's
    rounding (halves to even): the length every conversion here promises.
    """
    return round(Fraction(inputSamples * outRate, inRate))


def fitLength(samples: Samples, length: int, hold: float = 0.0) -> Samples:
    """
    Trim, or pad by holding the last value (a held value does not click
    where zeros could), to exactly C{length} samples.

    @param hold: the value to pad with when C{samples} is empty.
    """
    have = len(samples)
    if have >= length:
        return samples[:length]
    last = samples[-1] if have else np.float32(hold)
    return np.concatenate([samples, np.full(length - have, last, dtype=np.float32)])


def resample(samples: Samples, inRate: int, outRate: int, quality: str = "HQ") -> Samples:
    """
    One-shot resampling of a whole mono signal to exactly
    L{exactLength} samples.
    """
    if inRate == outRate:
        return samples
    if not len(samples):
        return _EMPTY
    out = soxr.resample(samples, inRate, outRate, quality=quality)
    return fitLength(np.asarray(out, dtype=np.float32), exactLength(len(samples), inRate, outRate))


class StreamResampler:
    """
    Resamples one continuous mono signal given in pieces, so that piece edges
    leave no click or gap: the filter state carries from one piece to the next.

    The total output is exactly L{exactLength} of the total input once
    L{flush} is called: soxr rounds the last fraction of a sample its own
    way, so the flushed tail is trimmed or padded to the promised count, and
    output is never let ahead of that count while streaming (any surplus
    waits for the next piece).  Counting from the whole input rather than
    per piece is what keeps a long reply from drifting.
    """

    def __init__(self, inRate: int, outRate: int, quality: str = "HQ") -> None:
        self.inRate = inRate
        self.outRate = outRate
        self.samplesIn = 0
        self.samplesOut = 0
        self._surplus = _EMPTY
        self._last = np.float32(0.0)
        self._flushed = False
        self._stream = (
            soxr.ResampleStream(inRate, outRate, 1, dtype="float32", quality=quality)
            if inRate != outRate
            else None
        )

    def feed(self, samples: Samples) -> Samples:
        """
        Resample the next piece; returns what is ready (maybe nothing yet).
        """
        if self._flushed:
            raise RuntimeError("this stream was flushed; start a new one")
        samples = np.asarray(samples, dtype=np.float32)
        self.samplesIn += len(samples)
        if self._stream is None:
            return self._emit(samples)
        out = self._stream.resample_chunk(samples) if len(samples) else _EMPTY
        if len(self._surplus):
            out = np.concatenate([self._surplus, out])
        allowed = exactLength(self.samplesIn, self.inRate, self.outRate) - self.samplesOut
        self._surplus = out[allowed:] if len(out) > allowed else _EMPTY
        return self._emit(out[:allowed])

    def flush(self) -> Samples:
        """
        End the signal: the rest of the output, making the total exact.
        """
        if self._flushed:
            return _EMPTY
        self._flushed = True
        tail = self._surplus
        if self._stream is not None:
            end = self._stream.resample_chunk(_EMPTY, last=True)
            tail = np.concatenate([tail, np.asarray(end, dtype=np.float32)])
        need = exactLength(self.samplesIn, self.inRate, self.outRate) - self.samplesOut
        return self._emit(fitLength(tail, need, float(self._last)))

    def _emit(self, samples: Samples) -> Samples:
        self.samplesOut += len(samples)
        if len(samples):
            self._last = samples[-1]
        return samples
