"""
Where each word and each mouth shape of a spoken sentence falls in its audio.

The speech-marks plugin calls L{prepare} as soon as a sentence's text is
known (the text streams long before its audio is synthesised) and L{align}
once the sentence's audio segment is complete; both run on a worker thread,
never the reactor.  All text-only work is done in L{prepare}, so that
L{align}, which stands between the audio and the game, stays cheap.

L{prepare} phonemizes the sentence with espeak-ng and synthesises it: a
reference whose every phoneme has a known time (L{phonemes}), described
frame by frame (L{align_dtw}).  L{align} describes the real audio the same
way, warps the reference onto it, and moves the phonemes along (method
C{"forced"}).  What cannot be aligned (no phonemes for the language, no
espeak-ng, silent or implausible audio) is spread evenly instead (method
C{"even"}), and L{Alignment.reason} says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy
from numpy.typing import NDArray
from twisted.logger import Logger

from rpmiddleware.builtin.animation import align_dtw, phonemes
from rpmiddleware.builtin.animation.align_words import Word, wordsOf
from rpmiddleware.builtin.animation.visemes import MOUTH, letterVisemes, visemeOf

log = Logger()

#: The rate assumed when the rate given is not a positive number: RPEngine's.
DEFAULT_RATE = 44100
#: Audio whose loudest sample is below this (of 32768) is silence: there is
#: nothing to align on.
SILENT_PEAK = 64
#: Silence added before and after the reference synthesis, seconds: espeak-ng
#: starts speaking at once, a real voice's segment often after a pause, and
#: without silence of its own to pair that pause with the warping path
#: stretches the first sound over it.
REFERENCE_PAD = 0.2
#: The espeak-ng voice variants the sentence is synthesised in as references
#: (C{""}: the language's default, a man's voice; C{"f3"}: a woman's, higher
#: and with other formants).  L{align} warps each onto the audio and keeps
#: the one that fits it best, so a woman's voice (RPEngine's default, F4) is
#: not read through a man's formants.  Each costs its synthesis in prepare()
#: and a warping in align().
REFERENCE_VARIANTS: tuple[str, ...] = ("", "f3")
#: The reference variant for RPEngine's voices by their first letter.
VOICE_KINDS: dict[str, str] = {"M": "", "F": "f3"}
#: How much longer or shorter than the reference the real audio may be and
#: still be aligned (a voice speaking at a third or three times espeak-ng's
#: pace is more likely a mismatched segment than speech).
MOST_STRETCH = 3.0


@dataclass(frozen=True)
class Timed:
    """One word or one viseme, placed on a sentence's audio."""

    #: Seconds from the sentence's first audio sample.
    start: float
    end: float
    #: A word as written, or a viseme name (L{visemes.VISEMES}).
    value: str
    #: Code-point offsets into the sentence text given to L{prepare} (a
    #: viseme: its word's; a pause: the word before it).
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
    #: Why the fallback was taken (C{""} when aligned), for logs.
    reason: str = ""


@dataclass(frozen=True)
class Reference:
    """A synthesis of the sentence, ready to be warped onto its audio."""

    #: Its frames' features (L{align_dtw.features}).
    features: NDArray[numpy.float64]
    #: Its length, seconds, with L{REFERENCE_PAD} before and after.
    duration: float
    #: Each phoneme's start, seconds (from the start of the padding).
    starts: NDArray[numpy.float64]
    #: Each phoneme's viseme, and its word's index (-1: a pause).
    visemes: tuple[str, ...]
    owners: tuple[int, ...]


@dataclass(frozen=True)
class Prepared:
    """The text-only work for one sentence, done by L{prepare}."""

    text: str
    language: str
    words: tuple[Word, ...]
    #: The visemes of each word, in order (for spreading evenly).
    shapes: tuple[tuple[str, ...], ...]
    #: L{None} when the sentence cannot be aligned, and why.
    reference: Reference | None
    reason: str = ""
    #: Other syntheses of the same phonemes (other voices), tried as well.
    alternatives: tuple[Reference, ...] = ()


def languages() -> dict[str, str]:
    """
    RPEngine's speech languages, each with C{"phonemes"} (phonemized by
    espeak-ng and aligned to the audio) or C{"letters"} (visemes read off
    the letters, spread evenly).
    """
    return phonemes.languages()


def variantsFor(voice: str | None) -> tuple[str, ...]:
    """
    The reference variants worth synthesising for an RPEngine voice: its
    voices are named C{F1}-C{F5} (women's) and C{M1}-C{M5} (men's), so a
    known one needs only the reference of its kind; any other (or none)
    gets every variant, and L{align} chooses.
    """
    if isinstance(voice, str) and len(voice) >= 2 and voice[1:].isdigit():
        kind = VOICE_KINDS.get(voice[0].upper())
        if kind is not None:
            return (kind,)
    return REFERENCE_VARIANTS


def prepare(text: str, language: str, voice: str | None = None) -> object:
    """
    Text-only work, done as soon as a sentence's text is known, usually long
    before its audio arrives: phonemes, a reference synthesis and its
    features.  Thread-safe, CPU only; never raises (what cannot be prepared
    is spread evenly by L{align}).

    @param voice: the RPEngine voice that speaks it (the request's
        C{output.audio.voice}, RPEngine's default C{F4}), if known: a
        woman's or a man's voice is then given only the reference of its
        kind, half the work here and in L{align}.
    """
    if not isinstance(text, str):
        text = ""
    language = language if isinstance(language, str) else ""
    words = tuple(wordsOf(text))
    letters = tuple(tuple(letterVisemes(word.text)) for word in words)
    if not words:
        return Prepared(text, language, words, letters, None, "no words")
    variants = variantsFor(voice)
    try:
        spoken = phonemes.phonemize(text, language, variants[0])
    except Exception as error:
        log.failure(
            "phonemizing a sentence failed ({language})",
            language=language,
        )
        return Prepared(text, language, words, letters, None, f"no phonemes: {error}")
    if spoken is None:
        return Prepared(
            text, language, words, letters, None, f"no phonemes for language {language!r}"
        )
    if not any(name for _, name, _ in spoken.phonemes):
        return Prepared(text, language, words, letters, None, "espeak-ng spoke no phonemes")
    try:
        reference = _reference(spoken)
    except Exception as error:
        log.failure("describing a reference synthesis failed")
        return Prepared(text, language, words, letters, None, f"no reference: {error}")
    alternatives = []
    for variant in variants[1:]:
        try:
            other = phonemes.phonemize(text, language, variant)
            candidate = None if other is None else _reference(other)
        except Exception:
            log.failure("synthesising a sentence in variant {variant} failed", variant=variant)
            continue
        # Only the same phonemes line up with the first reference's words.
        if candidate is not None and (candidate.visemes, candidate.owners) == (
            reference.visemes,
            reference.owners,
        ):
            alternatives.append(candidate)
    shapes = tuple(
        tuple(
            viseme
            for viseme, owner in zip(reference.visemes, reference.owners, strict=True)
            if owner == index and viseme != "sil"
        )
        or letters[index]
        for index in range(len(words))
    )
    return Prepared(text, language, words, shapes, reference, "", tuple(alternatives))


def _reference(spoken: phonemes.Spoken) -> Reference:
    """A synthesis padded with silence, its features and phoneme times."""
    synthesis = spoken.synthesis
    rate = synthesis.rate
    pad = numpy.zeros(int(REFERENCE_PAD * rate), numpy.int16)
    padded = numpy.concatenate([pad, synthesis.samples, pad])
    return Reference(
        features=align_dtw.features(align_dtw.toFeatureRate(padded, rate)),
        duration=len(padded) / rate,
        starts=numpy.array([(len(pad) + sample) / rate for sample, _, _ in spoken.phonemes]),
        visemes=tuple(visemeOf(name) if name else "sil" for _, name, _ in spoken.phonemes),
        owners=tuple(owner for _, _, owner in spoken.phonemes),
    )


def align(prepared: object, samples: NDArray[numpy.int16] | bytes, sampleRate: int) -> Alignment:
    """
    Place the prepared sentence on its audio (mono PCM16, as an array or as
    s16le bytes).  Thread-safe, CPU only; never raises for bad audio or
    text: it falls back to spreading evenly (method C{"even"}) and says why
    (L{Alignment.reason}).
    """
    if not isinstance(prepared, Prepared):
        return Alignment((), (), "even", "not prepared by prepare()")
    audio = _pcm(samples)
    if audio is None:
        return Alignment((), (), "even", "samples are neither PCM16 bytes nor an array")
    if not isinstance(sampleRate, int) or isinstance(sampleRate, bool) or sampleRate <= 0:
        return spreadEvenly(
            prepared, len(audio) / DEFAULT_RATE, f"sample rate {sampleRate!r} is not positive"
        )
    duration = len(audio) / sampleRate
    reference = prepared.reference
    if reference is None:
        return spreadEvenly(prepared, duration, prepared.reason)
    if duration <= 0 or int(numpy.abs(audio).max(initial=0)) < SILENT_PEAK:
        return spreadEvenly(prepared, duration, "the audio is silent")
    stretch = duration / max(reference.duration, 1e-3)
    if not 1 / MOST_STRETCH <= stretch <= MOST_STRETCH:
        return spreadEvenly(
            prepared,
            duration,
            f"the audio lasts {stretch:.2f} times the reference synthesis",
        )
    try:
        return _placed(prepared, reference, audio, sampleRate, duration)
    except Exception as error:
        log.failure("aligning a sentence failed")
        return spreadEvenly(prepared, duration, f"alignment failed: {error}")


def _pcm(samples: object) -> NDArray[numpy.int16] | None:
    """The samples as a 1-D int16 array, or L{None} if they are neither."""
    if isinstance(samples, (bytes, bytearray, memoryview)):
        raw = bytes(samples)
        return numpy.frombuffer(raw[: len(raw) // 2 * 2], dtype="<i2").astype(numpy.int16)
    if isinstance(samples, numpy.ndarray) and samples.ndim == 1:
        if samples.dtype == numpy.int16:
            return samples
        if numpy.issubdtype(samples.dtype, numpy.integer):
            return numpy.clip(samples, -32768, 32767).astype(numpy.int16)
    return None


def _placed(
    prepared: Prepared,
    reference: Reference,
    audio: NDArray[numpy.int16],
    rate: int,
    duration: float,
) -> Alignment:
    """
    Warp each reference onto the audio and move the phonemes of the one that
    fits best (the lowest cost per step of its warping path) along.
    """
    target = align_dtw.features(align_dtw.toFeatureRate(audio, rate))
    if len(target) < 2 or len(reference.features) < 2:
        return spreadEvenly(prepared, duration, "too short to align")
    best = align_dtw.warp(reference.features, target)
    for other in prepared.alternatives:
        warped = align_dtw.warp(other.features, target)
        if warped.cost < best.cost:
            best, reference = warped, other
    times = numpy.clip(align_dtw.moveTimes(reference.starts, best), 0.0, duration)
    times = numpy.maximum.accumulate(times)
    ends = numpy.append(times[1:], duration)
    words = prepared.words
    visemes: list[Timed] = []
    firsts: dict[int, float] = {}
    lasts: dict[int, float] = {}
    spoken = -1
    for start, end, viseme, owner in zip(
        times.tolist(), ends.tolist(), reference.visemes, reference.owners, strict=True
    ):
        if owner >= 0:
            spoken = owner
            firsts.setdefault(owner, start)
            lasts[owner] = end
        word = words[max(spoken, 0)]
        if end <= start:
            continue
        previous = visemes[-1] if visemes else None
        if (
            previous is not None
            and previous.value == viseme
            and previous.textStart == word.start
            and abs(previous.end - start) < 1e-9
        ):
            visemes[-1] = Timed(previous.start, end, viseme, word.start, word.end, MOUTH[viseme])
        else:
            visemes.append(Timed(start, end, viseme, word.start, word.end, MOUTH[viseme]))
    placed: list[Timed] = []
    at = 0.0
    for index, word in enumerate(words):
        start = firsts.get(index, at)
        end = lasts.get(index, start)
        placed.append(Timed(start, end, word.text, word.start, word.end))
        at = end
    return Alignment(tuple(placed), tuple(visemes), "forced")


def spreadEvenly(prepared: Prepared, duration: float, reason: str = "") -> Alignment:
    """
    Words and visemes spread evenly over C{duration} seconds, each word in
    proportion to its number of visemes: the fallback, and the baseline the
    benchmark measures alignment against.
    """
    total = sum(len(shapes) for shapes in prepared.shapes)
    if total == 0 or duration <= 0:
        return Alignment((), (), "even", reason or "nothing to place")
    step = duration / total
    words: list[Timed] = []
    visemes: list[Timed] = []
    at = 0
    for word, shapes in zip(prepared.words, prepared.shapes, strict=True):
        start = at * step
        for shape in shapes:
            visemes.append(
                Timed(at * step, (at + 1) * step, shape, word.start, word.end, MOUTH[shape])
            )
            at += 1
        words.append(Timed(start, at * step, word.text, word.start, word.end))
    return Alignment(tuple(words), tuple(visemes), "even", reason)
