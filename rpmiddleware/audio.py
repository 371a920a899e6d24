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
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pybase64
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
_PCM16_STEP = np.float32(1 / _PCM16_SCALE)
_EMPTY: Samples = np.zeros(0, dtype=np.float32)
_FLOAT32 = np.dtype(np.float32)
#: No frames of one channel, in the shape soxr's streams take.
_EMPTY_FRAMES: Samples = np.zeros((0, 1), dtype=np.float32)


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
        # One pass, straight to float32 (both steps are exact for 16-bit input).
        samples = np.multiply(np.frombuffer(data, dtype="<i2"), _PCM16_STEP, dtype=np.float32)
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
    samples = np.asarray(samples)
    if samples.dtype != np.float32:
        samples = samples.astype(np.float64)
    # Scaling by a power of two is exact in float32 as in float64, so float32
    # samples round to the same integers without the float64 copy; the
    # scaled array is the only one made, rounded and clipped in place.
    scaled = np.multiply(samples, samples.dtype.type(_PCM16_SCALE))
    np.rint(scaled, out=scaled)
    np.clip(scaled, -32768, 32767, out=scaled)
    return scaled.astype("<i2").tobytes()


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

    Setting up soxr's stream (designing its filter) costs about as much as
    resampling 100 ms of speech, so a caller that knows a signal is coming
    makes the resampler ahead of it rather than on its first piece.  Per
    piece the work is soxr's own, a count in integers, and views: nothing is
    copied unless soxr got ahead of the promised count.
    """

    def __init__(self, inRate: int, outRate: int, quality: str = "HQ") -> None:
        self.inRate = inRate
        self.outRate = outRate
        self.samplesIn = 0
        self.samplesOut = 0
        self._surplus: Samples | None = None
        #: The last piece given out that was not empty (its last sample pads
        #: a short tail).
        self._lastPiece: Samples = _EMPTY
        self._flushed = False
        self._process: Callable[[Samples, bool], Samples] | None = None
        if inRate != outRate:
            stream = soxr.ResampleStream(inRate, outRate, 1, dtype="float32", quality=quality)
            # python-soxr's resample_chunk checks its argument's type, dtype
            # and shape in Python, then calls this bound C++ method; the
            # pieces here are float32 (frames, 1) arrays already, and its
            # per-call cost is half of what a piece costs beyond soxr's work.
            self._process = getattr(stream, "_process", None) or stream.resample_chunk

    def feed(self, samples: Samples) -> Samples:
        """
        Resample the next piece; returns what is ready (maybe nothing yet).
        """
        if self._flushed:
            raise RuntimeError("this stream was flushed; start a new one")
        if type(samples) is not np.ndarray or samples.dtype is not _FLOAT32:
            samples = np.asarray(samples, dtype=np.float32)
        count = len(samples)
        samplesIn = self.samplesIn = self.samplesIn + count
        process = self._process
        if process is None:
            return self._emit(samples)
        # soxr takes (frames, channels) and gives its output in that shape.
        out = process(samples.reshape(count, 1), False).reshape(-1) if count else _EMPTY
        surplus = self._surplus
        if surplus is not None:
            out = np.concatenate([surplus, out])
            self._surplus = None
        # soxr's output lags its input by the filter's delay, so it is nearly
        # always under the floor of the promised count; only near it is the
        # count rounded exactly.
        if self.samplesOut + len(out) > samplesIn * self.outRate // self.inRate:
            allowed = exactLength(samplesIn, self.inRate, self.outRate) - self.samplesOut
            if len(out) > allowed:
                self._surplus = out[allowed:]
                out = out[:allowed]
        return self._emit(out)

    def flush(self) -> Samples:
        """
        End the signal: the rest of the output, making the total exact.
        """
        if self._flushed:
            return _EMPTY
        self._flushed = True
        tail = self._surplus if self._surplus is not None else _EMPTY
        self._surplus = None
        if self._process is not None:
            end = self._process(_EMPTY_FRAMES, True).reshape(-1)
            tail = np.concatenate([tail, end]) if len(tail) else end
        need = exactLength(self.samplesIn, self.inRate, self.outRate) - self.samplesOut
        last = float(self._lastPiece[-1]) if len(self._lastPiece) else 0.0
        return self._emit(fitLength(tail, need, last))

    def _emit(self, samples: Samples) -> Samples:
        if len(samples):
            self.samplesOut += len(samples)
            self._lastPiece = samples
        return samples


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
