"""
Simulated speech whose words are known: for testing what a game does with
speech marks.

With C{SimulatorOptions(speech="words")} the simulated RPEngine speaks each
sentence as one voiced burst per word (a buzz of a low fundamental and its
harmonics, as a voice's vowels are) with silence between words, instead of
one sine tone per sentence.  Where every word starts and ends is known to
the sample, so a test can check marks against the truth: the marks the
speech-marks plugin sends (an alignment on this signal should find each
onset), or a game's own animation driven by them.

The simulator keeps what it spoke on each reply stream
(C{ReplyStream.knownSpeech}, one L{KnownSpeech} per segment, in order);
L{knownWordMarks} turns them into the word marks a line should get
(Polly's shape: milliseconds from the line's first sample, code-point
offsets into the sentence text).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rpmiddleware.testing.tones import OUTPUT_SAMPLE_RATE, sampleCount

#: Silence before the first word and after the last.
EDGE_SECONDS = 0.06
#: Silence between two words.
GAP_SECONDS = 0.09
#: The shortest word.
MIN_WORD_SECONDS = 0.12
#: The voice's fundamental, in Hz.
FUNDAMENTAL = 130.0

_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")
_TAG = re.compile(r"<[^>]*>")


@dataclass(frozen=True)
class KnownWord:
    """One spoken word: where it is in the audio and in the text."""

    #: Seconds from the sentence's first sample.
    start: float
    end: float
    value: str
    #: Code-point offsets into the sentence's text (L{KnownSpeech.text}).
    textStart: int
    textEnd: int


@dataclass(frozen=True)
class KnownSpeech:
    """One sentence's audio and its words."""

    text: str
    pcm: bytes
    sampleRate: int
    words: tuple[KnownWord, ...]

    @property
    def samples(self) -> int:
        return len(self.pcm) // 2


def _burst(seconds: float, sampleRate: int, pitch: float) -> np.ndarray:
    count = sampleCount(seconds, sampleRate)
    t = np.arange(count, dtype=np.float64) / sampleRate
    wave = np.zeros(count)
    for harmonic, weight in ((1, 1.0), (2, 0.6), (3, 0.45), (5, 0.3), (7, 0.2)):
        wave += weight * np.sin(2.0 * math.pi * pitch * harmonic * t)
    ramp = min(count // 2, sampleCount(0.015, sampleRate))
    if ramp > 0:
        rise = np.linspace(0.0, 1.0, ramp, endpoint=False)
        wave[:ramp] *= rise
        wave[count - ramp :] *= rise[::-1]
    return 0.12 * wave


def spokenWords(
    text: str, sampleRate: int = OUTPUT_SAMPLE_RATE, secondsPerCharacter: float = 0.06
) -> KnownSpeech:
    """
    C{text} (a sentence; tags in angle brackets are not words) spoken as one
    voiced burst per word, each as long as its letters take
    (C{secondsPerCharacter}, at least L{MIN_WORD_SECONDS}), with known times.
    """
    pieces: list[np.ndarray] = [np.zeros(sampleCount(EDGE_SECONDS, sampleRate))]
    at = len(pieces[0])
    words: list[KnownWord] = []
    hidden = _TAG.sub(lambda m: " " * len(m.group(0)), text)
    for index, match in enumerate(_WORD.finditer(hidden)):
        if words:
            gap = np.zeros(sampleCount(GAP_SECONDS, sampleRate))
            pieces.append(gap)
            at += len(gap)
        seconds = max(MIN_WORD_SECONDS, len(match.group(0)) * secondsPerCharacter)
        burst = _burst(seconds, sampleRate, FUNDAMENTAL * (1.0 + 0.04 * (index % 3)))
        words.append(
            KnownWord(
                at / sampleRate,
                (at + len(burst)) / sampleRate,
                match.group(0),
                match.start(),
                match.end(),
            )
        )
        pieces.append(burst)
        at += len(burst)
    pieces.append(np.zeros(sampleCount(EDGE_SECONDS, sampleRate)))
    wave = np.concatenate(pieces)
    pcm = (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    return KnownSpeech(text, pcm, sampleRate, tuple(words))


def knownWordMarks(segments: Sequence[KnownSpeech]) -> list[dict[str, object]]:
    """
    The word marks of a line whose segments were C{segments}: C{time} in
    milliseconds from the line's first sample (at the speech's own rate),
    C{value}, and C{start}/C{end} offsets into each segment's sentence text.
    """
    marks: list[dict[str, object]] = []
    first = 0
    for speech in segments:
        for word in speech.words:
            marks.append(
                {
                    "time": round((first / speech.sampleRate + word.start) * 1000),
                    "type": "word",
                    "start": word.textStart,
                    "end": word.textEnd,
                    "value": word.value,
                }
            )
        first += speech.samples
    return marks


__all__ = ["KnownSpeech", "KnownWord", "knownWordMarks", "spokenWords"]
