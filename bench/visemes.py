"""
Benchmark: visemes from the voice (issue 35, part 2).

Aligns speech whose phoneme timings are known and measures how far the
aligned words and visemes are from them, beside spreading evenly.

The test speech is espeak-ng's, its word and phoneme positions taken from
espeak-ng's own events; the alignment's reference syntheses are espeak-ng's
too, so the test speech is made to differ from them in everything a voice can
change there: the references are the language's default voice and its f3
variant (175 words a minute, pitch 50, range 50); each test condition uses
another voice variant (another formant set, two of them another
synthesizer: Klatt), another speed (150-215 words a minute), pitch and pitch
range, starts after 150 ms of silence, carries white noise at -55 dBFS and is
resampled to RPEngine's 44.1 kHz.  A harder test uses festival's voices
(another synthesizer, built from people's recordings) where festival is
installed.  What neither can show is RPEngine's own neural voice: see
docs/animation.md.

    python -m bench visemes           # writes its section of docs/benchmarks.md
    python bench/visemes.py           # prints the section
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import wave
from dataclasses import dataclass

import numpy
import soxr

from bench.common import Section, median, percentile, table
from rpmiddleware.builtin.animation import align_espeak, alignment, phonemes
from rpmiddleware.builtin.animation.align_words import blankTags
from rpmiddleware.builtin.animation.visemes import visemeOf

#: The corpus: sentences written for this benchmark, short to long, with
#: questions, numbers, names, an interjection and an expression tag.
CORPUS: dict[str, tuple[str, ...]] = {
    "en": (
        "Halt.",
        "Who goes there?",
        "The north gate stays shut after dark.",
        "Mr. Brennan paid us three fifty for the old lantern.",
        "Wait, what did you just say about my sister?",
        "Ha <laugh> that is rich, coming from a thief.",
        "I never thought the castle would fall so quickly, but here we are, standing in its ruins.",
        "Bring me the map, the compass and a lantern; we leave at first light.",
        "Nobody in this village has seen a dragon for a hundred years.",
        "Is that blood on your sleeve, or just wine from the tavern?",
        "Keep your voice down.",
        "The merchant from Valmora owes me forty gold pieces and a favour, and "
        "I intend to collect both before the winter festival begins.",
        "Fine. Go, then.",
        "Do you really believe the old stories about the lake?",
        "My father built this forge with his own hands.",
        "Quiet! Something is moving behind the wall.",
    ),
    "de": (
        "Halt.",
        "Wer ist da?",
        "Das Nordtor bleibt nach Einbruch der Dunkelheit geschlossen.",
        "Herr Brenner hat uns drei Goldstücke für die alte Laterne bezahlt.",
        "Warte, was hast du gerade über meine Schwester gesagt?",
        "Ich hätte nie gedacht, dass die Burg so schnell fällt, aber hier stehen "
        "wir nun in ihren Ruinen.",
        "Bring mir die Karte und den Kompass, wir brechen im Morgengrauen auf.",
        "Niemand in diesem Dorf hat seit hundert Jahren einen Drachen gesehen.",
        "Sei leise.",
        "Glaubst du wirklich an die alten Geschichten über den See?",
    ),
}

#: The reference syntheses prepare() makes: the language's default voice and
#: its f3 variant (alignment.REFERENCE_VARIANTS); no test condition uses
#: either variant.
REFERENCE = "default variant and +f3, 175 wpm, pitch 50, range 50"


@dataclass(frozen=True)
class Condition:
    """How a test voice differs from the reference."""

    variant: str
    rate: int
    pitch: int
    range: int

    def describe(self) -> str:
        return f"+{self.variant}, {self.rate} wpm, pitch {self.pitch}, range {self.range}"


CONDITIONS = (
    Condition("f4", 150, 75, 70),
    Condition("m3", 215, 30, 30),
    Condition("klatt4", 170, 60, 80),
    Condition("klatt2", 195, 40, 60),
)
#: Silence before the speech, seconds, and the noise under it, dBFS.
LEAD = 0.15
NOISE_DBFS = -55.0
#: The rate the test speech is handed over at (RPEngine's).
OUTPUT_RATE = 44100
#: Frames the viseme share is counted in.
FRAME = 0.01
#: The numbers issue 35 quotes for spreading evenly, and the goals.
ISSUE_EVEN = (161.0, 387.0, 28.0)
GOALS = (40.0, 100.0, 65.0)


@dataclass
class Tally:
    """What one language's alignments measured."""

    onsets: list[float]
    evenOnsets: list[float]
    frames: int = 0
    matched: int = 0
    evenMatched: int = 0
    speechFrames: int = 0
    speechMatched: int = 0
    forced: int = 0
    runs: int = 0
    prepareCpu: float = 0.0
    alignCpu: float = 0.0
    audioSeconds: float = 0.0
    referenceSeconds: float = 0.0
    #: Sentences whose words the test voice's could not be paired with.
    unmatched: int = 0


def truth(
    text: str, synthesis: align_espeak.Synthesis, voice: str, lead: float
) -> tuple[dict[int, float], list[tuple[float, str]]]:
    """
    Each word's onset (its first phoneme, seconds) and the visemes' starts,
    from a test synthesis's own phoneme events (each phoneme given to its
    word as prepare() gives a reference's, words espeak-ng joined shared out
    by their phoneme counts).
    """
    onsets: dict[int, float] = {}
    starts: list[tuple[float, str]] = []
    for sample, name, word in phonemes.attribute(text, synthesis, voice).phonemes:
        at = lead + sample / synthesis.rate
        starts.append((at, visemeOf(name) if name else "sil"))
        if name and word >= 0:
            onsets.setdefault(word, at)
    return onsets, starts


def grid(starts: list[tuple[float, str]], seconds: float) -> list[str]:
    """The viseme at the middle of every 10 ms frame of C{seconds}."""
    frames = int(seconds / FRAME)
    shapes = ["sil"] * frames
    ordered = sorted(starts)
    for index, (start, viseme) in enumerate(ordered):
        end = ordered[index + 1][0] if index + 1 < len(ordered) else seconds
        first = max(0, int(numpy.ceil(start / FRAME - 0.5)))
        last = min(frames, int(numpy.ceil(end / FRAME - 0.5)))
        for frame in range(first, last):
            shapes[frame] = viseme
    return shapes


def placedGrid(result: alignment.Alignment, seconds: float) -> list[str]:
    """The viseme an alignment shows at the middle of every 10 ms frame."""
    frames = int(seconds / FRAME)
    shapes = ["sil"] * frames
    for viseme in result.visemes:
        first = max(0, int(numpy.ceil(viseme.start / FRAME - 0.5)))
        last = min(frames, int(numpy.ceil(viseme.end / FRAME - 0.5)))
        for frame in range(first, last):
            shapes[frame] = viseme.value
    return shapes


def testSpeech(
    text: str, voice: str, condition: Condition, seed: int
) -> tuple[numpy.ndarray, align_espeak.Synthesis]:
    """The test speech: another voice, lead-in silence, noise, 44.1 kHz."""
    plain = blankTags(text)
    synthesis = align_espeak.synthesize(
        plain, f"{voice}+{condition.variant}", condition.rate, condition.pitch, condition.range
    )
    return _asSent(synthesis.samples, synthesis.rate, seed), synthesis


def _asSent(samples: numpy.ndarray, rate: int, seed: int) -> numpy.ndarray:
    """
    PCM16 C{samples} at C{rate} as the test sends them: after LEAD seconds
    of silence, with noise at NOISE_DBFS (seeded, so every run hears the
    same), at RPEngine's 44.1 kHz.
    """
    lead = numpy.zeros(int(LEAD * rate), numpy.float32)
    signal = numpy.concatenate([lead, samples.astype(numpy.float32)])
    noise = numpy.random.default_rng(seed).standard_normal(len(signal))
    signal = signal + noise * 32768.0 * 10 ** (NOISE_DBFS / 20)
    resampled = soxr.resample(signal / 32768.0, rate, OUTPUT_RATE)
    return numpy.clip(numpy.round(resampled * 32767.0), -32768, 32767).astype(numpy.int16)


#: Festival's voices (Debian festival, festvox-us-slt-hts, festvox-kallpc16k):
#: another synthesizer altogether, from recordings of people.  slt: an HMM
#: (HTS) voice trained on a woman's recordings, 32 kHz; kal: a man's
#: diphones, concatenated, 16 kHz.  English only (festival reads ASCII).
FESTIVAL_VOICES = {"slt (HTS)": "cmu_us_slt_arctic_hts", "kal (diphones)": "kal_diphone"}

#: Festival's US phone set -> IPA, for the viseme map.
RADIO = {
    "aa": "ɑ",
    "ae": "æ",
    "ah": "ʌ",
    "ao": "ɔ",
    "aw": "aʊ",
    "ax": "ə",
    "axr": "ɚ",
    "ay": "aɪ",
    "b": "b",
    "ch": "tʃ",
    "d": "d",
    "dh": "ð",
    "dx": "ɾ",
    "eh": "ɛ",
    "el": "l",
    "em": "m",
    "en": "n",
    "er": "ɝ",
    "ey": "eɪ",
    "f": "f",
    "g": "g",
    "hh": "h",
    "ih": "ɪ",
    "ix": "ɨ",
    "iy": "i",
    "jh": "dʒ",
    "k": "k",
    "l": "l",
    "m": "m",
    "n": "n",
    "nx": "n",
    "ng": "ŋ",
    "ow": "oʊ",
    "oy": "ɔɪ",
    "p": "p",
    "r": "ɹ",
    "s": "s",
    "sh": "ʃ",
    "t": "t",
    "th": "θ",
    "uh": "ʊ",
    "uw": "u",
    "v": "v",
    "w": "w",
    "y": "j",
    "z": "z",
    "zh": "ʒ",
}

_SCRIPT = """
(voice_{voice})
(define (speak n text)
  (set! utt (SynthText text))
  (utt.save.wave utt (format nil "{folder}/%d.wav" n) 'riff)
  (format t "SENTENCE %d\\n" n)
  (set! tok (utt.relation.first utt 'Token))
  (while tok
    (if (item.daughters tok)
      (format t "TOKEN %s %s\\n" (item.name tok) (item.feat (item.daughter1 tok) "word_start")))
    (set! tok (item.next tok)))
  (mapcar
    (lambda (s) (format t "SEG %s %s\\n" (item.name s) (item.feat s "segment_start")))
    (utt.relation.items utt 'Segment)))
"""


@dataclass(frozen=True)
class Recorded:
    """A sentence festival spoke, with its tokens' and phones' times."""

    pcm: numpy.ndarray
    rate: int
    #: (token as festival names it, its first word's start, s).
    tokens: tuple[tuple[str, float], ...]
    #: (start s, viseme).
    visemes: tuple[tuple[float, str], ...]


def festivalSpeech(sentences: tuple[str, ...], voice: str) -> list[Recorded] | None:
    """
    Every sentence spoken by a festival voice, in one festival process, or
    L{None} when festival or the voice is not installed.
    """
    binary = shutil.which("festival")
    if binary is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        script = _SCRIPT.format(voice=voice, folder=folder)
        for number, text in enumerate(sentences):
            plain = " ".join(blankTags(text).split()).replace("\\", " ").replace('"', " ")
            script += f'(speak {number} "{plain}")\n'
        done = subprocess.run(
            [binary, "--pipe"], input=script, capture_output=True, text=True, timeout=300
        )
        if "SENTENCE" not in done.stdout:
            return None
        spoken: list[Recorded] = []
        tokens: list[tuple[str, float]] = []
        shapes: list[tuple[float, str]] = []
        for line in done.stdout.splitlines() + ["SENTENCE end"]:
            kind, _, rest = line.partition(" ")
            if kind == "SENTENCE":
                if rest != "0":
                    with wave.open(os.path.join(folder, f"{len(spoken)}.wav")) as f:
                        rate = f.getframerate()
                        pcm = numpy.frombuffer(f.readframes(f.getnframes()), "<i2")
                    spoken.append(Recorded(pcm, rate, tuple(tokens), tuple(shapes)))
                tokens, shapes = [], []
            elif kind == "TOKEN":
                name, _, start = rest.rpartition(" ")
                tokens.append((name, float(start)))
            elif kind == "SEG":
                name, _, start = rest.rpartition(" ")
                viseme = visemeOf(RADIO[name]) if name in RADIO else "sil"
                shapes.append((float(start), viseme))
        return spoken if len(spoken) == len(sentences) else None


def measureFestival(name: str, voice: str, quick: bool = False) -> Tally | None:
    """Align English sentences festival spoke; L{None} without festival."""
    sentences = CORPUS["en"][:6] if quick else CORPUS["en"]
    recorded = festivalSpeech(sentences, voice)
    if recorded is None:
        return None
    tally = Tally([], [])
    for number, (text, speech) in enumerate(zip(sentences, recorded, strict=True)):
        prepared = alignment.prepare(text, "en")
        assert isinstance(prepared, alignment.Prepared)
        pcm = _asSent(speech.pcm, speech.rate, number)
        result, even, seconds = _aligned(tally, prepared, pcm)
        # festival's tokens are the text's words, punctuation stripped.
        names = [token for token, _ in speech.tokens]
        if [word.text.lower() for word in prepared.words] == [n.lower() for n in names]:
            for index, (_, onset) in enumerate(speech.tokens):
                tally.onsets.append(abs(result.words[index].start - onset - LEAD) * 1000)
                tally.evenOnsets.append(abs(even.words[index].start - onset - LEAD) * 1000)
        else:
            tally.unmatched += 1
        starts = [(LEAD + start, viseme) for start, viseme in speech.visemes]
        _countFrames(tally, grid(starts, seconds), result, even, seconds)
    return tally


def _aligned(
    tally: Tally, prepared: alignment.Prepared, pcm: numpy.ndarray
) -> tuple[alignment.Alignment, alignment.Alignment, float]:
    """
    The alignment of one recording, its even spread and its length in
    seconds, with the alignment's CPU time, the audio and the run counted in
    C{tally}: both corpora (festival's and espeak-ng's) are measured alike.
    """
    seconds = len(pcm) / OUTPUT_RATE
    started = time.thread_time()
    result = alignment.align(prepared, pcm, OUTPUT_RATE)
    tally.alignCpu += time.thread_time() - started
    tally.audioSeconds += seconds
    tally.runs += 1
    tally.forced += result.method == "forced"
    return result, alignment.spreadEvenly(prepared, seconds), seconds


def _countFrames(
    tally: Tally,
    expected: list[str],
    result: alignment.Alignment,
    even: alignment.Alignment,
    seconds: float,
) -> None:
    mine = placedGrid(result, seconds)
    spread = placedGrid(even, seconds)
    tally.frames += len(expected)
    for want, got, guess in zip(expected, mine, spread, strict=True):
        tally.matched += want == got
        tally.evenMatched += want == guess
        if want != "sil":
            tally.speechFrames += 1
            tally.speechMatched += want == got


def measure(language: str, quick: bool = False) -> Tally:
    """Align every sentence of a language's corpus in every condition."""
    voice = phonemes.voiceFor(language)
    if voice is None:
        raise RuntimeError(f"espeak-ng has no voice for {language!r}")
    tally = Tally([], [])
    sentences = CORPUS[language][:6] if quick else CORPUS[language]
    for number, text in enumerate(sentences):
        started = time.thread_time()
        prepared = alignment.prepare(text, language)
        tally.prepareCpu += time.thread_time() - started
        assert isinstance(prepared, alignment.Prepared)
        assert prepared.reference is not None, prepared.reason
        tally.referenceSeconds += prepared.reference.duration
        for index, condition in enumerate(CONDITIONS):
            pcm, synthesis = testSpeech(text, voice, condition, number * 10 + index)
            onsets, starts = truth(text, synthesis, voice, LEAD)
            result, even, seconds = _aligned(tally, prepared, pcm)
            for word, onset in onsets.items():
                tally.onsets.append(abs(result.words[word].start - onset) * 1000)
                tally.evenOnsets.append(abs(even.words[word].start - onset) * 1000)
            _countFrames(tally, grid(starts, seconds), result, even, seconds)
    return tally


def _rows(label: str, voices: str, tally: Tally) -> list[tuple[str, ...]]:
    """A table's two rows for one tally: aligned, and spread evenly."""
    share = 100.0 * tally.matched / max(tally.frames, 1)
    speech = 100.0 * tally.speechMatched / max(tally.speechFrames, 1)
    counted = f"{len(tally.onsets)} words, {tally.runs} sentences"
    if tally.unmatched:
        counted += f" ({tally.unmatched} without onsets: words not paired)"
    return [
        (
            label,
            voices,
            "aligned",
            f"{median(tally.onsets):.0f}",
            f"{percentile(tally.onsets, 90):.0f}",
            f"{share:.0f}% ({speech:.0f}%)",
            f"{tally.forced}/{tally.runs} forced; {counted}",
        ),
        (
            label,
            voices,
            "even spreading",
            f"{median(tally.evenOnsets):.0f}",
            f"{percentile(tally.evenOnsets, 90):.0f}",
            f"{100.0 * tally.evenMatched / max(tally.frames, 1):.0f}%",
            "",
        ),
    ]


def run(quick: bool = False) -> Section:
    """The section: a table of quality per language and voice, and CPU."""
    if not align_espeak.available():
        return Section(
            "Visemes from the voice (issue 35)",
            "Not measured: libespeak-ng is not installed (Debian: libespeak-ng1).\n",
            [("visemes: espeak-ng installed", "missing", False)],
        )
    rows: list[tuple[str, ...]] = []
    cpuRows = []
    goals: list[tuple[str, str, bool]] = []
    for language in CORPUS:
        tally = measure(language, quick)
        rows.extend(_rows(language, "espeak-ng, 4 conditions", tally))
        cpuRows.append(
            (
                language,
                f"{1000 * tally.prepareCpu / tally.referenceSeconds:.1f}",
                f"{1000 * tally.alignCpu / tally.audioSeconds:.1f}",
                f"{tally.audioSeconds / tally.runs:.2f}",
                f"{1000 * tally.alignCpu / tally.runs:.1f}",
                f"{tally.runs} sentences",
            )
        )
        if language == "en":
            onsetMedian = median(tally.onsets)
            onsetP90 = percentile(tally.onsets, 90)
            share = 100.0 * tally.matched / max(tally.frames, 1)
            goals.append(
                (
                    "visemes (en, espeak-ng speech): word onset median <= 40 ms, p90 <= 100 ms",
                    f"{onsetMedian:.0f} ms, {onsetP90:.0f} ms",
                    onsetMedian <= GOALS[0] and onsetP90 <= GOALS[1],
                )
            )
            goals.append(
                (
                    "visemes (en, espeak-ng speech): viseme frames >= 65% matching",
                    f"{share:.0f}%",
                    share >= GOALS[2],
                )
            )
    festival: list[str] = []
    for name, voice in FESTIVAL_VOICES.items():
        heard = measureFestival(name, voice, quick)
        if heard is None:
            festival.append(f"festival's {name} voice is not installed: not measured.")
            continue
        rows.extend(_rows("en", f"festival {name}", heard))
    rows.append(
        (
            "en",
            "issue 35's figures",
            "even spreading",
            f"{ISSUE_EVEN[0]:.0f}",
            f"{ISSUE_EVEN[1]:.0f}",
            f"{ISSUE_EVEN[2]:.0f}%",
            "",
        )
    )
    conditions = "\n".join(f"- {condition.describe()}" for condition in CONDITIONS)
    body = (
        "Aligning synthetic speech whose word and phoneme positions are known "
        "(`python -m bench visemes`, `bench/visemes.py`; a fixed corpus of "
        f"{len(CORPUS['en'])} English and {len(CORPUS['de'])} German sentences written for "
        "it, one to twenty-five words). The reference syntheses that `prepare()` makes are "
        f"the language's espeak-ng voice ({REFERENCE}; `align()` keeps the one that fits "
        "best). The espeak-ng test speech differs from them in voice variant, speed, "
        "pitch and pitch range (positions from espeak-ng's own phoneme events), four "
        "conditions:\n\n"
        f"{conditions}\n\n"
        "A harder test: the same English sentences spoken by festival (another synthesizer, "
        "from recordings of people; positions from its own segment timings, its phone set "
        "mapped to the same visemes): slt, an HMM voice trained on a woman's recordings, and "
        "kal, a man's diphones. Every test sentence starts after "
        f"{LEAD * 1000:.0f} ms of silence, carries white noise at {NOISE_DBFS:.0f} dBFS and "
        "is resampled to 44.1 kHz, as RPEngine sends it.\n\n"
        "Word onset error: |aligned start - the word's first phoneme|, every word. Viseme "
        "frames: the share of 10 ms frames (the whole audio, pauses included; in brackets "
        "only frames where a phoneme sounds) whose viseme is the test speech's own. Even "
        "spreading is measured in the same run on the same audio. The goals (word onset "
        "median <= 40 ms, p90 <= 100 ms, viseme frames >= 65%) are issue 35's, on "
        "espeak-ng speech.\n\n"
        + table(
            (
                "language",
                "test voices",
                "method",
                "onset median ms",
                "onset p90 ms",
                "viseme frames",
                "",
            ),
            rows,
        )
        + ("\n\n" + " ".join(festival) if festival else "")
        + "\n\nCPU (this thread's time, `time.thread_time()`), per second of audio: "
        "`prepare()` per second of its reference synthesis (espeak-ng synthesis and its "
        "features), `align()` per second of the sentence's 44.1 kHz audio (resampling to "
        "11025 Hz, features and DTW), over the espeak-ng test speech.\n\n"
        + table(
            (
                "language",
                "prepare ms/s",
                "align ms/s",
                "mean sentence s",
                "align ms per sentence",
                "measured over",
            ),
            cpuRows,
        )
        + "\n\nWhat it does not show: RPEngine's voice is a neural TTS (Supertonic) that "
        "none of these voices is; festival's rows are the nearer guide to what a real voice "
        "gets.\n"
    )
    return Section("Visemes from the voice (issue 35)", body, goals)


if __name__ == "__main__":
    section = run()
    print(section.body)
    for goal, measured, met in section.goals:
        print(f"{goal}: {measured} ({'met' if met else 'NOT met'})")
