"""
Tests for L{rpmiddleware.builtin.animation.alignment}: words and visemes
placed on a sentence's audio, and the even fallback for what cannot be.
"""

from __future__ import annotations

import numpy
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.animation import alignment
from rpmiddleware.builtin.animation.visemes import MOUTH, VISEMES


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

    def test_visemesAreNamed(self) -> None:
        """Every viseme is one of Polly's, with its jaw opening."""
        result = alignment.align(
            alignment.prepare("Quick brown foxes jump.", "en"), silence(1.0), 22050
        )
        self.assertTrue(result.visemes)
        for viseme in result.visemes:
            self.assertIn(viseme.value, VISEMES)
            self.assertEqual(viseme.mouth, MOUTH[viseme.value])
