"""
Dynamic time warping of a sentence's audio onto a reference synthesis of it.

Both are cut into 20 ms frames described by mel-frequency cepstra (the
spectral envelope: what the mouth and tongue shape, largely apart from the
voice's pitch), each normalized over its own sentence so that loudness and
the voice's timbre count less.  The warping path between the two frame
sequences says, for every moment of the reference, when the same sound
happens in the real audio; the reference's phonemes, whose times are known,
are moved along it.

The cost is in two parts.  The reference's frames are computed once, in
C{prepare}, from the text alone.  The real audio's frames (resampled to
11025 Hz first: the mouth's shapes are all below 5.5 kHz) and the warping
path (C{dtaidistance}'s C implementation, in a band around the diagonal)
take a few milliseconds for a sentence of a few seconds.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy
import soxr
from dtaidistance import dtw_ndim
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

#: The rate features are computed at.
FEATURE_RATE = 11025
#: Seconds between frames.  20 ms, not 10: half the frames, a quarter of
#: the warping's work, about a third less CPU in align() (which stands
#: between a sentence's audio and the game), for 2-8 ms more error in word
#: onsets (bench/visemes.py, measured both ways).
HOP = 0.02
#: Samples in a frame's window (23 ms at L{FEATURE_RATE}).
WINDOW = 256
#: Mel-spaced bands and cepstral coefficients kept (the first: loudness).
BANDS = 20
CEPSTRA = 8
#: The lowest band edge, and the highest, Hz.
LOWEST = 80.0
HIGHEST = 5300.0
#: Band powers are floored at this fraction of the sentence's loudest (-40
#: dB): a synthesis's digital silence and a recording's noise floor then
#: look alike, instead of the silence being an outlier that pulls the
#: warping path.
FLOOR = 1e-4
#: The band the warping path keeps to around the diagonal, in frames (400
#: ms), beyond the difference of the two lengths.
BAND = 20

Floats = NDArray[numpy.float64]


@functools.cache
def _bandEdges() -> NDArray[numpy.intp]:
    """
    The spectrum bins where each mel-spaced band starts (and where the last
    ends): rectangular bands, summed with C{numpy.add.reduceat}, which is as
    good as triangular filters for warping and needs no matrix product
    (numpy's goes to a BLAS that may spin threads of its own).
    """

    def mel(hz: Floats) -> Floats:
        return 2595.0 * numpy.log10(1.0 + hz / 700.0)

    edges = 700.0 * (
        10.0
        ** (numpy.linspace(mel(numpy.array(LOWEST)), mel(numpy.array(HIGHEST)), BANDS + 1) / 2595.0)
        - 1.0
    )
    bins = numpy.searchsorted(numpy.fft.rfftfreq(WINDOW, 1.0 / FEATURE_RATE), edges)
    for index in range(1, len(bins)):
        bins[index] = max(bins[index], bins[index - 1] + 1)
    return bins.astype(numpy.intp)


@functools.cache
def _dct() -> Floats:
    band = numpy.arange(BANDS)
    order = numpy.arange(CEPSTRA)
    return numpy.cos(numpy.pi / BANDS * (band[:, None] + 0.5) * order[None, :])


@functools.cache
def _hann() -> NDArray[numpy.float32]:
    return numpy.hanning(WINDOW).astype(numpy.float32)


def toFeatureRate(samples: NDArray[numpy.int16], rate: int) -> NDArray[numpy.float32]:
    """Mono PCM16 at C{rate} -> floats at L{FEATURE_RATE}."""
    floats = samples.astype(numpy.float32) / 32768.0
    if rate == FEATURE_RATE:
        return floats
    resampled: NDArray[numpy.float32] = soxr.resample(
        floats, rate, FEATURE_RATE, quality="LQ"
    ).astype(numpy.float32, copy=False)
    return resampled


def frameCount(seconds: float) -> int:
    """How many frames C{seconds} of audio make."""
    return int(seconds / HOP)


def features(signal: NDArray[numpy.float32]) -> Floats:
    """
    One row per frame (L{HOP}) of C{signal} (at L{FEATURE_RATE}): its
    cepstra and their deltas, each column normalized to mean 0 and deviation
    1 over the sentence.
    """
    count = frameCount(len(signal) / FEATURE_RATE)
    if count <= 0:
        return numpy.zeros((0, 2 * CEPSTRA))
    padded = numpy.concatenate(
        [
            numpy.zeros(WINDOW // 2, numpy.float32),
            signal,
            numpy.zeros(WINDOW, numpy.float32),
        ]
    )
    starts = (numpy.arange(count) * (HOP * FEATURE_RATE)).astype(numpy.intp)
    frames = sliding_window_view(padded, WINDOW)[starts] * _hann()
    spectrum = numpy.fft.rfft(frames, axis=1)
    power = spectrum.real**2 + spectrum.imag**2
    edges = _bandEdges()
    bands = numpy.add.reduceat(power[:, : edges[-1]], edges[:-1], axis=1)
    bands = numpy.maximum(bands, bands.max() * FLOOR + 1e-12)
    cepstra = numpy.log(bands) @ _dct()
    normalized = _normalized(cepstra)
    # How the envelope moves (the slope over the frames either side): where
    # a sound starts or ends, which the envelope alone tells less well
    # across two voices (festival's voices: onset p90 93 -> 67 and 81 -> 76
    # ms with it).
    padded = numpy.pad(normalized, ((1, 1), (0, 0)), mode="edge")
    delta = _normalized((padded[2:] - padded[:-2]) / 2.0)
    return numpy.ascontiguousarray(numpy.hstack([normalized, delta]), dtype=numpy.float64)


def _normalized(columns: Floats) -> Floats:
    """Each column to mean 0 and deviation 1 over the sentence."""
    deviation = columns.std(axis=0)
    scaled: Floats = (columns - columns.mean(axis=0)) / numpy.maximum(deviation, 1e-6)
    return scaled


@dataclass(frozen=True)
class Warp:
    """
    A warping path, as knots of a piecewise-linear map from reference
    seconds to target seconds, and how well the two matched.
    """

    knots: Floats
    placed: Floats
    #: The path's summed distance over its number of steps: lower is a
    #: better fit, comparable between references of the same sentence.
    cost: float


def warp(reference: Floats, target: Floats) -> Warp:
    """
    The warping path between C{reference} and C{target} frames: each
    boundary between two reference frames goes to the boundary between the
    last target frame paired with the one and the first paired with the
    next (so a sound the target holds longer stretches its own frame, not
    its neighbours').
    """
    window = abs(len(reference) - len(target)) + BAND
    steps, distance = dtw_ndim.warping_path(
        reference, target, use_c=True, window=window, include_distance=True
    )
    # A list of (i, j) tuples: flattened without numpy's slow walk of tuples.
    path = numpy.fromiter(
        itertools.chain.from_iterable(steps), dtype=numpy.intp, count=2 * len(steps)
    ).reshape(-1, 2)
    count = len(reference)
    first = numpy.full(count, len(target), dtype=numpy.float64)
    last = numpy.zeros(count, dtype=numpy.float64)
    pairs = path[:, 1].astype(numpy.float64)
    numpy.minimum.at(first, path[:, 0], pairs)
    numpy.maximum.at(last, path[:, 0], pairs)
    # Frame k is centred on k * HOP: the boundary of frames k - 1 and k is
    # at (k - 0.5) * HOP, on both sides.
    knots = numpy.concatenate([[0.0], numpy.arange(1, count) - 0.5, [count - 0.5]])
    placed = numpy.concatenate([[0.0], (last[:-1] + first[1:]) / 2.0, [last[-1] + 0.5]])
    return Warp(knots * HOP, numpy.maximum.accumulate(placed) * HOP, float(distance) / len(path))


def moveTimes(times: Floats, mapping: Warp) -> Floats:
    """Seconds in the reference -> seconds in the target, through L{warp}'s map."""
    moved: Floats = numpy.interp(times, mapping.knots, mapping.placed)
    return moved
