"""
Voice activity detection: speech-start and speech-end at the right places
on known signals, the hangover, the pre-roll and trail, the 30 s bound.

The state machine is checked with a scripted classifier (exact frame
arithmetic); the real detector (webrtcvad) on speech-like bursts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.config.settings import VadSettings
from rpmiddleware.webrtc.vad import (
    SAMPLE_RATE,
    SpeechEnded,
    SpeechStarted,
    VadEvent,
    VoiceActivityDetector,
)

FRAME = 320  # 20 ms at 16 kHz


class Scripted:
    """
    A classifier that reads each frame's first sample: nonzero is speech.
    """

    def isSpeech(self, frame: bytes, sampleRate: int) -> bool:
        assert sampleRate == SAMPLE_RATE
        assert len(frame) == FRAME * 2
        return frame[:2] != b"\x00\x00"


def frames(pattern: str) -> bytes:
    """
    One 20 ms frame per character: C{#} speech, C{.} silence; each frame's
    samples hold its index so slices can be traced back.
    """
    out = bytearray()
    for i, c in enumerate(pattern):
        value = (i + 1) if c == "#" else 0
        out += value.to_bytes(2, "little", signed=True) * FRAME
    return bytes(out)


def framesOf(pcm: bytes) -> list[int]:
    """
    The index of each frame of an utterance (-1 for silence).
    """
    return [
        int.from_bytes(pcm[i : i + 2], "little", signed=True) - 1
        for i in range(0, len(pcm), FRAME * 2)
    ]


class StateMachineTests(SynchronousTestCase):
    settings = VadSettings(start_ms=60, hangover_ms=100, pre_roll_ms=40, trail_ms=20)

    def detect(self, pattern: str, chunk: int | None = None, **overrides: Any) -> list[VadEvent]:
        settings = VadSettings(**{**self.settings.__dict__, **overrides})  # type: ignore[arg-type]
        vad = VoiceActivityDetector(settings, Scripted())
        pcm = frames(pattern)
        step = chunk or len(pcm)
        events: list[VadEvent] = []
        for i in range(0, len(pcm), step):
            events += vad.feed(pcm[i : i + step])
        return events + vad.flush()

    def test_startAfterStartMs(self) -> None:
        """
        Three speech frames (60 ms) start speech, dated from the first of them.
        """
        events = self.detect("....###" + "." * 10)
        started = events[0]
        assert isinstance(started, SpeechStarted)
        self.assertEqual(started.sample, 4 * FRAME)

    def test_shortSoundsIgnored(self) -> None:
        """
        Two speech frames are a click, not speech.
        """
        self.assertEqual(self.detect("..##....##......"), [])

    def test_hangoverBridgesPauses(self) -> None:
        """
        A pause shorter than the hangover (100 ms = 5 frames) does not end
        speech; a longer one does, and the utterance runs from the pre-roll
        to the trail.
        """
        #        0123456789012345678901234567
        pattern = "....#####....####.........."
        events = self.detect(pattern)
        self.assertEqual([type(e) for e in events], [SpeechStarted, SpeechEnded])
        ended = events[1]
        assert isinstance(ended, SpeechEnded)
        # Pre-roll 40 ms = frames 2-3; speech 4-16; trail 20 ms = frame 17.
        self.assertEqual(ended.startSample, 2 * FRAME)
        self.assertEqual(ended.sample, 18 * FRAME)
        self.assertEqual(framesOf(ended.pcm), [-1, -1] + [4, 5, 6, 7, 8, -1, -1, -1, -1]
                         + [13, 14, 15, 16, -1])  # fmt: skip
        self.assertFalse(ended.truncated)

    def test_twoUtterances(self) -> None:
        pattern = "..#####......" + "..####......"
        events = self.detect(pattern)
        self.assertEqual(
            [type(e) for e in events], [SpeechStarted, SpeechEnded, SpeechStarted, SpeechEnded]
        )
        second = events[2]
        assert isinstance(second, SpeechStarted)
        self.assertEqual(second.sample, 15 * FRAME)

    def test_piecesOfAnySize(self) -> None:
        """
        Feeding 7 bytes at a time gives the same events as all at once.
        """
        pattern = "...######.......####........"
        self.assertEqual(self.detect(pattern, chunk=7), self.detect(pattern))

    def test_flushEndsSpeech(self) -> None:
        """
        A track that ends mid-speech ends the utterance.
        """
        events = self.detect("..######")
        self.assertEqual([type(e) for e in events], [SpeechStarted, SpeechEnded])

    def test_maxLength(self) -> None:
        """
        An utterance ends at max_seconds (pre-roll included), marked
        truncated; speech that goes on starts the next one.
        """
        events = self.detect(".." + "#" * 80 + "......", max_seconds=1.0)
        self.assertEqual(
            [type(e) for e in events], [SpeechStarted, SpeechEnded, SpeechStarted, SpeechEnded]
        )
        first = events[1]
        assert isinstance(first, SpeechEnded)
        self.assertTrue(first.truncated)
        self.assertEqual(len(first.pcm), SAMPLE_RATE * 2)  # exactly 1 s
        self.assertEqual(first.seconds, 1.0)

    def test_reset(self) -> None:
        vad = VoiceActivityDetector(self.settings, Scripted())
        vad.feed(frames("..#####"))
        self.assertTrue(vad.speaking)
        vad.reset()
        self.assertEqual(vad.flush(), [])

    def test_badSettings(self) -> None:
        for bad in (
            VadSettings(aggressiveness=4),
            VadSettings(frame_ms=25),
            VadSettings(trail_ms=700, hangover_ms=600),
            VadSettings(max_seconds=31),
            VadSettings(start_ms=-1),
        ):
            self.assertRaises(ValueError, VoiceActivityDetector, bad, Scripted())


class WebRtcVadTests(SynchronousTestCase):
    """
    The real detector on speech-like bursts between silences.
    """

    def setUp(self) -> None:
        try:
            import webrtcvad  # noqa: F401
        except ImportError:
            self.skipTest("the optional webrtc extra (webrtcvad-wheels) is not installed")

    def events(self, parts: Sequence[tuple[str, float]], noise: float = 0.0) -> list[VadEvent]:
        import numpy as np

        from rpmiddleware.testing.webrtc import Recording

        samples = Recording(parts).samples(SAMPLE_RATE)
        if noise:
            samples = samples + np.random.default_rng(7).normal(0, noise, len(samples))
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
        vad = VoiceActivityDetector()
        return vad.feed(pcm) + vad.flush()

    def assertBoundaries(self, events: list[VadEvent], bursts: list[tuple[float, float]]) -> None:
        self.assertEqual(len(events), 2 * len(bursts), events)
        settings = VadSettings()
        for (start, end), began, ended in zip(bursts, events[::2], events[1::2], strict=True):
            assert isinstance(began, SpeechStarted) and isinstance(ended, SpeechEnded)
            # Starts within 100 ms of the burst (the syllable rhythm's quiet onset).
            self.assertTrue(start <= began.sample / SAMPLE_RATE <= start + 0.1, (start, began))
            # Ends at the burst's end plus the trail, within 100 ms.
            trailEnd = end + settings.trail_ms / 1000
            self.assertTrue(
                trailEnd - 0.1 <= ended.sample / SAMPLE_RATE <= trailEnd + 0.1, (end, ended)
            )
            self.assertEqual(ended.startSample, began.sample - 3200)  # 200 ms pre-roll
            self.assertEqual(len(ended.pcm), 2 * (ended.sample - ended.startSample))

    def test_burstsBetweenSilences(self) -> None:
        parts = [("silence", 0.5), ("speech", 1.0), ("silence", 1.0), ("speech", 0.8),
                 ("silence", 1.0)]  # fmt: skip
        from rpmiddleware.testing.webrtc import Recording

        self.assertBoundaries(self.events(parts), Recording(parts).bursts())

    def test_quietNoiseIsNotSpeech(self) -> None:
        parts = [("silence", 0.5), ("speech", 0.6), ("silence", 1.0)]
        from rpmiddleware.testing.webrtc import Recording

        self.assertBoundaries(self.events(parts, noise=0.002), Recording(parts).bursts())
        self.assertEqual(self.events([("silence", 2.0)], noise=0.002), [])

    def test_shortPauseKeepsOneUtterance(self) -> None:
        """
        A 300 ms pause inside a sentence is under the 600 ms hangover.
        """
        events = self.events(
            [
                ("silence", 0.3),
                ("speech", 0.5),
                ("silence", 0.3),
                ("speech", 0.5),
                ("silence", 1.0),
            ]  # fmt: skip
        )
        self.assertEqual([type(e) for e in events], [SpeechStarted, SpeechEnded])
