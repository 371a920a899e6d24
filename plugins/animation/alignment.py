"""
Where each word and each mouth shape of a spoken sentence falls in its audio.

The speech-marks plugin calls L{prepare} as soon as a sentence's text is
known (the text streams long before its audio is synthesised) and L{align}
once the sentence's audio segment is complete; both run on a worker thread,
never the reactor.  All text-only work is done in L{prepare}, so that
L{align}, which stands between the audio and the game, stays cheap.

This first version spreads words evenly over the audio (method C{"even"}),
weighted by how many mouth shapes each word has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy

from rpmiddleware.builtin.animation.align_words import Word, wordsOf
from rpmiddleware.builtin.animation.visemes import MOUTH, letterVisemes

if TYPE_CHECKING:
    from numpy.typing import NDArray

#: The rate assumed when the rate given is not a positive number: RPEngine's.
DEFAULT_RATE = 44100


@dataclass(frozen=True)
class Timed:
    """One word or one viseme, placed on a sentence's audio."""

    #: Seconds from the sentence's first audio sample.
    start: float
    end: float
    #: A word as written, or a viseme name (L{visemes.VISEMES}).
    value: str
    #: Code-point offsets into the sentence text given to L{prepare} (a
    #: viseme: its word's).
    textStart: int
    textEnd: int
    #: Visemes: how open the jaw is, 0..1 (words: 0).
    mouth: float = 0.0


@dataclass(frozen=True)
class Alignment:
    """A sentence's words and visemes on its audio, and how they were placed."""

    words: tuple[Timed, ...]
    visemes: tuple[Timed, ...]
    #: C{"forced"}: placed on the audio; C{"even"}: spread evenly (the
    #: fallback, for audio or text that could not be aligned).
    method: str


@dataclass(frozen=True)
class Prepared:
    """The text-only work for one sentence, done by L{prepare}."""

    text: str
    language: str
    words: tuple[Word, ...]
    #: The visemes of each word, in order.
    shapes: tuple[tuple[str, ...], ...]


def languages() -> dict[str, str]:
    """
    Which languages get phonemes from a G2P (C{"phonemes"}) and which fall
    back to letters (C{"letters"}).  This version has no G2P yet.
    """
    return {}


def prepare(text: str, language: str) -> object:
    """
    Text-only work, done as soon as a sentence's text is known, usually long
    before its audio arrives.  Thread-safe, CPU only; never raises for odd
    text (a sentence with no words aligns to nothing).
    """
    if not isinstance(text, str):
        text = ""
    words = tuple(wordsOf(text))
    shapes = tuple(tuple(letterVisemes(word.text)) for word in words)
    return Prepared(text, str(language), words, shapes)


def align(prepared: object, samples: NDArray[numpy.int16] | bytes, sampleRate: int) -> Alignment:
    """
    Place the prepared sentence on its audio (mono PCM16, as an array or as
    s16le bytes).  Thread-safe, CPU only; never raises for bad audio or
    text: it falls back to spreading evenly (method C{"even"}).
    """
    if not isinstance(prepared, Prepared):
        return Alignment((), (), "even")
    rate = sampleRate if isinstance(sampleRate, int) and sampleRate > 0 else DEFAULT_RATE
    count = _sampleCount(samples)
    return spreadEvenly(prepared, count / rate)


def _sampleCount(samples: object) -> int:
    if isinstance(samples, (bytes, bytearray, memoryview)):
        return len(samples) // 2
    if isinstance(samples, numpy.ndarray):
        return int(samples.shape[0]) if samples.ndim >= 1 else 0
    return 0


def spreadEvenly(prepared: Prepared, duration: float) -> Alignment:
    """
    Words and visemes spread evenly over C{duration} seconds, each word in
    proportion to its number of visemes: the fallback, and the baseline the
    benchmark measures alignment against.
    """
    total = sum(len(shapes) for shapes in prepared.shapes)
    if total == 0 or duration <= 0:
        return Alignment((), (), "even")
    step = duration / total
    words: list[Timed] = []
    visemes: list[Timed] = []
    at = 0
    for word, shapes in zip(prepared.words, prepared.shapes, strict=True):
        start = at * step
        for shape in shapes:
            visemes.append(
                Timed(
                    at * step,
                    (at + 1) * step,
                    shape,
                    word.start,
                    word.end,
                    MOUTH[shape],
                )
            )
            at += 1
        words.append(Timed(start, at * step, word.text, word.start, word.end))
    return Alignment(tuple(words), tuple(visemes), "even")
