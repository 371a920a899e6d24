"""
Samples: PCM decoding, encoding and resampling, with numpy and soxr, shared
by the audio-resample plugin, the client endpoint and WebRTC.

Imported where audio is first converted (the audio-resample plugin's first
conversion, a client's first recording, speech at a rate the client did
not ask for, a WebRTC peer), not when the daemon starts: numpy and soxr are
about 11 MB of an idle daemon's memory.  What audio needs without them is
L{rpmiddleware.audio.format}.

Samples travel between these functions as float32 arrays scaled to -1..1:
soxr works in float32 at no loss for 16-bit sources, and one representation
keeps every conversion a decode, an optional resample and an encode.  PCM16
is scaled by 32768 both ways so that a decode followed by an encode gives the
same bytes back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import soxr

from rpmiddleware.audio.format import SAMPLE_WIDTHS, AudioError, exactLength

Samples = npt.NDArray[np.float32]

_PCM16_SCALE = 32768.0
_PCM16_STEP = np.float32(1 / _PCM16_SCALE)
_PCM16_MAX = np.float32(32767)
_PCM16_MIN = np.float32(-32768)
_EMPTY: Samples = np.zeros(0, dtype=np.float32)
_FLOAT32 = np.dtype(np.float32)
#: No frames of one channel, in the shape soxr's streams take.
_EMPTY_FRAMES: Samples = np.zeros((0, 1), dtype=np.float32)


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
    # Two ufuncs rather than np.clip, whose Python wrapper took a quarter of
    # this function's time for a 100 ms chunk (5.9 against 6.7 us).
    np.minimum(scaled, _PCM16_MAX, out=scaled)
    np.maximum(scaled, _PCM16_MIN, out=scaled)
    return scaled.astype("<i2").tobytes()


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


class Pcm16Resampler:
    """
    A L{StreamResampler} for PCM16 bytes: one sentence of speech given in
    chunks of whole samples, given back as PCM16 at another rate.  What the
    audio-resample plugin and the client's speech output do with each chunk
    they convert, so that they need nothing of numpy themselves and import
    this module only when they make their first stream.
    """

    def __init__(self, inRate: int, outRate: int, quality: str = "HQ") -> None:
        self.inRate = inRate
        self.outRate = outRate
        self._stream = StreamResampler(inRate, outRate, quality)

    def feed(self, pcm: bytes, last: bool = False) -> bytes:
        """
        Resample the next chunk; returns what is ready (maybe nothing yet),
        and with C{last} the rest too (as L{flush}).

        @raise AudioError: when C{pcm} is not a whole number of samples.
        """
        stream = self._stream
        out = stream.feed(decodePcm(pcm, "pcm_s16le"))
        if last:
            out = np.concatenate([out, stream.flush()])
        return encodePcm(out, "pcm_s16le")

    def flush(self) -> bytes:
        """
        End the sentence: the rest of the output, making the total exact.
        """
        return encodePcm(self._stream.flush(), "pcm_s16le")
