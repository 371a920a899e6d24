"""
Tests for L{rpmiddleware.builtin.animation.alignment}: words and visemes
placed on a sentence's audio, and the even fallback for what cannot be.
"""

from __future__ import annotations

import threading

import numpy
import soxr
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rpmiddleware.builtin.animation import align_espeak, alignment, phonemes
from rpmiddleware.builtin.animation.align_words import blankTags
from rpmiddleware.builtin.animation.visemes import MOUTH, VISEMES, letterVisemes, visemeOf

#: Why the tests that synthesise speech are skipped without espeak-ng.
NO_ESPEAK = "libespeak-ng is not installed (Debian: libespeak-ng1 espeak-ng-data); CI installs it"


def silence(seconds: float, rate: int = 22050) -> numpy.ndarray:
    """PCM16 silence of C{seconds}."""
    return numpy.zeros(int(seconds * rate), dtype=numpy.int16)


class FallbackTests(SynchronousTestCase):
    """
    Input that cannot be aligned falls back to spreading evenly
    (method C{"even"}) and never raises.
    """

    def test_emptyText(self) -> None:
        """A sentence with no words aligns to nothing, evenly."""
        result = alignment.align(alignment.prepare("", "en"), silence(1.0), 22050)
        self.assertEqual((result.words, result.visemes, result.method), ((), (), "even"))

    def test_onlyTags(self) -> None:
        """A sentence that is only expression tags has no words."""
        result = alignment.align(alignment.prepare("<laugh> <sigh>", "en"), silence(1.0), 22050)
        self.assertEqual(result.words, ())
        self.assertEqual(result.method, "even")

    def test_silence(self) -> None:
        """
        Silent audio cannot be aligned: the words are spread over it evenly,
        in order, covering it.
        """
        text = "Nothing at all is heard here."
        result = alignment.align(alignment.prepare(text, "en"), silence(2.0), 22050)
        self.assertEqual(result.method, "even")
        self.assertEqual(
            [word.value for word in result.words],
            ["Nothing", "at", "all", "is", "heard", "here"],
        )
        self.assertAlmostEqual(result.words[-1].end, 2.0, places=3)
        starts = [word.start for word in result.words]
        self.assertEqual(starts, sorted(starts))

    def test_wrongRate(self) -> None:
        """A rate that is not a positive number falls back, never raises."""
        for rate in (0, -8000):
            result = alignment.align(alignment.prepare("Hello there.", "en"), silence(1.0), rate)
            self.assertEqual(result.method, "even")
            self.assertEqual([word.value for word in result.words], ["Hello", "there"])

    def test_noAudio(self) -> None:
        """No samples at all: nothing to place anything on."""
        result = alignment.align(alignment.prepare("Hello.", "en"), b"", 44100)
        self.assertEqual((result.words, result.method), ((), "even"))

    def test_notPrepared(self) -> None:
        """Something that is not L{prepare}'s result aligns to nothing."""
        result = alignment.align(object(), silence(1.0), 22050)
        self.assertEqual((result.words, result.method), ((), "even"))

    def test_bytes(self) -> None:
        """Samples given as s16le bytes are measured like an array."""
        prepared = alignment.prepare("One two.", "en")
        result = alignment.align(prepared, silence(1.5).tobytes(), 22050)
        self.assertAlmostEqual(result.words[-1].end, 1.5, places=3)


class TextTests(SynchronousTestCase):
    """Words, tags and offsets."""

    def test_tagsAreNotWords(self) -> None:
        """
        An expression tag is no word, and the words after it keep their
        offsets in the text given.
        """
        text = "Ha <laugh> that is rich."
        result = alignment.align(alignment.prepare(text, "en"), silence(1.0), 22050)
        self.assertEqual(
            [(word.value, text[word.textStart : word.textEnd]) for word in result.words],
            [("Ha", "Ha"), ("that", "that"), ("is", "is"), ("rich", "rich")],
        )

    def test_codePoints(self) -> None:
        """
        Offsets count code points, not UTF-8 bytes or UTF-16 units: a word
        after an emoji and accented letters points at itself.
        """
        text = "Café 🐉 naïve señor."
        result = alignment.align(alignment.prepare(text, "fr"), silence(1.0), 22050)
        self.assertEqual(
            [text[word.textStart : word.textEnd] for word in result.words],
            ["Café", "naïve", "señor"],
        )
        for viseme in result.visemes:
            self.assertIn(text[viseme.textStart : viseme.textEnd], ["Café", "naïve", "señor"])

    def test_combiningMarks(self) -> None:
        """
        A word goes on through combining marks (an accent typed apart, Arabic
        vowel marks, Thai vowels above the line), which are no letters to
        Python's regular expressions.
        """
        for text, words in (
            ("Cafe\u0301 naive", ["Cafe\u0301", "naive"]),
            ("مَرْحَبًا كَيْفَ", ["مَرْحَبًا", "كَيْفَ"]),
            ("สวัสดีครับ วันนี้", ["สวัสดีครับ", "วันนี้"]),
        ):
            result = alignment.align(alignment.prepare(text, "xx"), silence(1.0) + 500, 22050)
            self.assertEqual([text[word.textStart : word.textEnd] for word in result.words], words)

    def test_ideographs(self) -> None:
        """
        Chinese and Japanese, written without spaces and without phonemes
        here, get a word mark for every character, spread evenly.
        """
        text = "你好，今天好吗？"
        result = alignment.align(alignment.prepare(text, "zh"), silence(1.0) + 500, 22050)
        self.assertEqual(result.method, "even")
        self.assertEqual(
            [text[word.textStart : word.textEnd] for word in result.words],
            ["你", "好", "今", "天", "好", "吗"],
        )

    def test_visemesAreNamed(self) -> None:
        """Every viseme is one of Polly's, with its jaw opening."""
        result = alignment.align(
            alignment.prepare("Quick brown foxes jump.", "en"), silence(1.0), 22050
        )
        self.assertTrue(result.visemes)
        for viseme in result.visemes:
            self.assertIn(viseme.value, VISEMES)
            self.assertEqual(viseme.mouth, MOUTH[viseme.value])


def spoken(
    text: str, voice: str, lead: float = 0.1, rate: int = 44100
) -> tuple[numpy.ndarray, list[float]]:
    """
    C{text} spoken by an espeak-ng voice that is none of the references'
    (the C{f4} variant, slower and higher; the references are the default
    and f3), after C{lead} seconds of silence, at C{rate}; with each word's
    onset (its first phoneme), seconds, from espeak-ng's own events.
    """
    synthesis = align_espeak.synthesize(blankTags(text), f"{voice}+f4", 150, 75, 70)
    pad = numpy.zeros(int(lead * synthesis.rate), numpy.float32)
    signal = numpy.concatenate([pad, synthesis.samples.astype(numpy.float32)]) / 32768.0
    pcm = numpy.round(soxr.resample(signal, synthesis.rate, rate) * 32767).astype(numpy.int16)
    onsets: dict[int, float] = {}
    for sample, name, word in phonemes.attribute(text, synthesis, voice).phonemes:
        if name:
            onsets.setdefault(word, lead + sample / synthesis.rate)
    return pcm, [onsets[word] for word in sorted(onsets)]


class ForcedTests(SynchronousTestCase):
    """
    Speech whose word positions are known is aligned within tolerance
    (method C{"forced"}).
    """

    def setUp(self) -> None:
        if not align_espeak.available():
            raise SkipTest(NO_ESPEAK)

    def assertOnsets(
        self, text: str, language: str, voice: str
    ) -> tuple[alignment.Alignment, float]:
        """
        Align C{text} spoken by C{voice}'s other variant: each word near its
        onset.  Returns the alignment and the audio's length, seconds.
        """
        pcm, truth = spoken(text, voice)
        result = alignment.align(alignment.prepare(text, language), pcm, 44100)
        self.assertEqual((result.method, result.reason), ("forced", ""))
        self.assertEqual(len(result.words), len(truth))
        errors = sorted(
            abs(word.start - onset) for word, onset in zip(result.words, truth, strict=True)
        )
        # The benchmark's goals: median within 40 ms, and no word off by as
        # much as spreading evenly misses by (161 ms at the median).
        self.assertLess(errors[len(errors) // 2], 0.04, errors)
        self.assertLess(errors[-1], 0.15, errors)
        return result, len(pcm) / 44100

    def test_english(self) -> None:
        """
        An English sentence in another voice, speed and pitch than the
        reference's, after silence: every word near its onset, the visemes
        in order, within the audio, and a pause's viseme is "sil".
        """
        text = "Bring me the map, the compass and a lantern; we leave at first light."
        result, seconds = self.assertOnsets(text, "en", "en-us")
        starts = [viseme.start for viseme in result.visemes]
        self.assertEqual(starts, sorted(starts))
        for viseme in result.visemes:
            self.assertLess(viseme.start, viseme.end)
            self.assertIn(viseme.value, VISEMES)
            self.assertEqual(viseme.mouth, MOUTH[viseme.value])
        self.assertLessEqual(result.visemes[-1].end, seconds)
        self.assertIn("sil", [viseme.value for viseme in result.visemes])
        self.assertIn("p", [viseme.value for viseme in result.visemes if viseme.textStart == 6])

    def test_references(self) -> None:
        """
        prepare() makes a reference in each of the variants (a man's and a
        woman's voice), with the same phonemes, for align() to choose from.
        """
        prepared = alignment.prepare("Who goes there?", "en")
        assert isinstance(prepared, alignment.Prepared)
        assert prepared.reference is not None
        self.assertEqual(len(prepared.alternatives), len(alignment.REFERENCE_VARIANTS) - 1)
        for other in prepared.alternatives:
            self.assertEqual(other.visemes, prepared.reference.visemes)
            self.assertNotEqual(other.features.tobytes(), prepared.reference.features.tobytes())

    def test_voiceHint(self) -> None:
        """
        Told which RPEngine voice speaks (F1-F5 a woman's, M1-M5 a man's),
        prepare() makes only the reference of its kind, and the woman's
        voice is still placed within tolerance.
        """
        self.assertEqual(alignment.variantsFor("F4"), ("f3",))
        self.assertEqual(alignment.variantsFor("m2"), ("",))
        for unknown in (None, "", "F", "X1", "Fable", 4):
            self.assertEqual(
                alignment.variantsFor(unknown),  # type: ignore[arg-type]
                alignment.REFERENCE_VARIANTS,
            )
        text = "Is that blood on your sleeve, or just wine from the tavern?"
        prepared = alignment.prepare(text, "en", "F4")
        assert isinstance(prepared, alignment.Prepared)
        self.assertEqual(prepared.alternatives, ())
        pcm, truth = spoken(text, "en-us")
        result = alignment.align(prepared, pcm, 44100)
        self.assertEqual(result.method, "forced")
        errors = sorted(
            abs(word.start - onset) for word, onset in zip(result.words, truth, strict=True)
        )
        self.assertLess(errors[len(errors) // 2], 0.04, errors)
        self.assertLess(errors[-1], 0.15, errors)

    def test_joinedWords(self) -> None:
        """
        espeak-ng speaks "from the" as one word (one word event); each of
        the two still gets its own phonemes, time and visemes.
        """
        text = "Just wine from the tavern."
        spokenText = phonemes.phonemize(text, "en")
        assert spokenText is not None
        owners = [owner for _, name, owner in spokenText.phonemes if name]
        self.assertEqual(sorted(set(owners)), list(range(len(spokenText.words))))
        self.assertEqual(owners, sorted(owners))
        self.assertEqual(owners.count(3), 2)  # "the": ð ə
        result, _ = self.assertOnsets(text, "en", "en-us")
        the = result.words[3]
        self.assertEqual(text[the.textStart : the.textEnd], "the")
        self.assertLess(the.start, the.end)
        self.assertIn("T", [v.value for v in result.visemes if v.textStart == the.textStart])

    def test_german(self) -> None:
        """A second language aligns as well."""
        self.assertOnsets("Warte, was hast du gerade über meine Schwester gesagt?", "de", "de")

    def test_codePoints(self) -> None:
        """
        Aligned words and visemes point into the text given by code points,
        tags and non-ASCII letters included.
        """
        text = "Ha <laugh> ce café est naïf, señor."
        pcm, _ = spoken(text, "fr")
        result = alignment.align(alignment.prepare(text, "fr"), pcm, 44100)
        self.assertEqual(result.method, "forced")
        self.assertEqual(
            [text[word.textStart : word.textEnd] for word in result.words],
            ["Ha", "ce", "café", "est", "naïf", "señor"],
        )
        self.assertEqual(
            {text[viseme.textStart : viseme.textEnd] for viseme in result.visemes},
            {"Ha", "ce", "café", "est", "naïf", "señor"},
        )

    def test_bytesAndRates(self) -> None:
        """
        The same speech as s16le bytes, or at 24 kHz, lands on the same
        words.
        """
        text = "Keep your voice down."
        prepared = alignment.prepare(text, "en")
        pcm, truth = spoken(text, "en-us")
        fromBytes = alignment.align(prepared, pcm.tobytes(), 44100)
        fromArray = alignment.align(prepared, pcm, 44100)
        self.assertEqual(fromBytes, fromArray)
        slower, _ = spoken(text, "en-us", rate=24000)
        at24 = alignment.align(prepared, slower, 24000)
        self.assertEqual(at24.method, "forced")
        for word, onset in zip(at24.words, truth, strict=True):
            self.assertLess(abs(word.start - onset), 0.1)

    def test_threads(self) -> None:
        """
        prepare() and align() on several threads at once (as the speech-marks
        plugin's pool runs them) give what they give one at a time: espeak-ng's
        global state is used by one synthesis at a time, so no sentence gets
        another's audio or phonemes.
        """
        texts = ["Halt.", "Who goes there?", "Keep your voice down.", "Fine. Go, then."]
        audio = {text: spoken(text, "en-us")[0] for text in texts}

        def both(text: str) -> alignment.Alignment:
            return alignment.align(alignment.prepare(text, "en"), audio[text], 44100)

        alone = {text: both(text) for text in texts}
        together: dict[str, list[alignment.Alignment]] = {text: [] for text in texts}

        def worker(text: str) -> None:
            for _ in range(3):
                together[text].append(both(text))

        threads = [threading.Thread(target=worker, args=(text,)) for text in texts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # espeak-ng's synthesis is not the same to the sample from one call to
        # the next (its wave generator keeps state between sentences), and a
        # word's end before a pause sits in a fading sound the warping path
        # may cut a few frames either way: compare the words, their starts
        # within 30 ms and their ends within 150 ms, not bit for bit.  Another
        # sentence's audio or phonemes would miss by far more.
        for text in texts:
            self.assertEqual(alone[text].method, "forced")
            for result in together[text]:
                self.assertEqual(result.method, "forced")
                self.assertEqual(
                    [(w.value, w.textStart, w.textEnd) for w in result.words],
                    [(w.value, w.textStart, w.textEnd) for w in alone[text].words],
                )
                for word, single in zip(result.words, alone[text].words, strict=True):
                    self.assertLess(abs(word.start - single.start), 0.03)
                    self.assertLess(abs(word.end - single.end), 0.15)

    def test_oddText(self) -> None:
        """
        Text espeak-ng may choke on (a lone surrogate, a NUL, control and
        direction marks, one very long word, symbols only) never raises:
        it is aligned or spread evenly, its words pointing into the text.
        """
        noise = numpy.random.default_rng(7).integers(-3000, 3000, 22050, dtype=numpy.int16)
        for text in (
            "bad \ud800 surrogate",
            "nul\x00inside",
            "tab\tand\u200fmarks\u202e here",
            "a" * 400,
            "$%& *** ###",
            "<emotion>angry</emotion> Fine.",
        ):
            result = alignment.align(alignment.prepare(text, "en"), noise, 22050)
            self.assertIn(result.method, ("forced", "even"))
            for word in result.words:
                self.assertEqual(text[word.textStart : word.textEnd], word.value)

    def test_silenceForAWord(self) -> None:
        """Silence where speech was expected falls back and says why."""
        result = alignment.align(alignment.prepare("Who goes there?", "en"), silence(1.0), 22050)
        self.assertEqual(result.method, "even")
        self.assertIn("silent", result.reason)

    def test_implausibleLength(self) -> None:
        """
        Audio many times longer than the sentence could be (a segment
        matched to the wrong text) is not warped onto it.
        """
        pcm, _ = spoken("Halt.", "en-us")
        long = numpy.tile(pcm, 12)
        result = alignment.align(alignment.prepare("Halt.", "en"), long, 44100)
        self.assertEqual(result.method, "even")
        self.assertIn("times the reference", result.reason)

    def test_regionalVoices(self) -> None:
        """
        A language code with a region reads with espeak-ng's voice for it
        where there is one (its British English is plain "en", its
        American the default for "en"), else the language's.
        """
        self.assertEqual(
            [phonemes.voiceFor(code) for code in ("en", "en-GB", "pt_BR", "de-AT", "zh-CN")],
            ["en-us", "en", "pt-br", "de", None],
        )

    def test_languages(self) -> None:
        """
        English and German get phonemes; Chinese and Japanese, which
        espeak-ng 1.51 cannot read, fall back to letters.
        """
        found = alignment.languages()
        self.assertEqual(
            (found["en"], found["de"], found["zh"], found["ja"]),
            ("phonemes", "phonemes", "letters", "letters"),
        )
        self.assertEqual(set(found), set(phonemes.SPEECH_LANGUAGES))


class NoPhonemesTests(SynchronousTestCase):
    """A language without phonemes is spread evenly, letters for visemes."""

    def test_unknownLanguage(self) -> None:
        """An unknown language code prepares without phonemes."""
        prepared = alignment.prepare("Hello there.", "xx")
        result = alignment.align(prepared, numpy.full(22050, 1000, numpy.int16), 22050)
        self.assertEqual(result.method, "even")
        self.assertIn("no phonemes", result.reason)
        self.assertEqual(
            [viseme.value for viseme in result.visemes],
            letterVisemes("Hello") + letterVisemes("there"),
        )


class VisemeTests(SynchronousTestCase):
    """Phonemes and letters to Polly's visemes."""

    def test_phonemes(self) -> None:
        """
        IPA phonemes as espeak-ng names them map by their mouth shape,
        stress and length marks ignored, a pause to "sil".
        """
        self.assertEqual(
            [visemeOf(p) for p in ("p", "m", "f", "θ", "n", "ʃ", "tʃ", "s", "k", "ɹ")],
            ["p", "p", "f", "T", "t", "S", "S", "s", "k", "r"],
        )
        self.assertEqual(
            [visemeOf(p) for p in ("iː", "ˈuː", "ə", "ɑː", "eɪ", "ɛ", "oʊ", "ɔɪ", "")],
            ["i", "u", "@", "a", "e", "E", "o", "O", "sil"],
        )

    def test_mouth(self) -> None:
        """Every viseme has a jaw opening in 0..1: shut for p and sil."""
        self.assertEqual(set(MOUTH), set(VISEMES))
        self.assertTrue(all(0.0 <= value <= 1.0 for value in MOUTH.values()))
        self.assertEqual((MOUTH["p"], MOUTH["sil"]), (0.0, 0.0))
        self.assertEqual(max(MOUTH, key=MOUTH.__getitem__), "a")
