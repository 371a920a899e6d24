"""
The speech track: 20 ms frames at 48 kHz, the right number of speech
samples for what was fed, gap-free across chunks and segments, silence
between turns, an immediate stop on clear(), and real-time pacing, all
checked by counting frames against a fake clock, never by waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np
from twisted.trial.unittest import SynchronousTestCase

from tests.support.webrtc import missingExtra

RATE_IN = 44100
T = TypeVar("T")


def inFreshLoop(coro: Coroutine[Any, Any, T]) -> T:
    """
    Run a coroutine in a loop of its own, leaving the thread's event loop
    (the asyncio reactor's, when the suite runs on it) alone.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def runSync(coro: Coroutine[Any, Any, T]) -> T:
    """
    Run a coroutine that never really suspends (its sleep is fake) to its
    end, without an event loop: asyncio.run would replace the loop the
    asyncio reactor runs on when the suite runs on it.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the coroutine suspended")


def sine(seconds: float, frequency: float = 440.0, start: int = 0) -> np.ndarray:
    t = (np.arange(int(round(seconds * RATE_IN))) + start) / RATE_IN
    return 0.4 * np.sin(2 * np.pi * frequency * t)


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


class SpeechTrackTests(SynchronousTestCase):
    def setUp(self) -> None:
        missing = missingExtra()
        if missing is not None:
            self.skipTest(missing)
        from rpmiddleware.webrtc.speech import SpeechTrack

        self.started: list[tuple[int, int]] = []
        self.drained: list[int] = []
        self.track = SpeechTrack()
        self.track.onStarted = lambda turn, frame: self.started.append((turn, frame))
        self.track.onDrained = self.drained.append

    def play(self, count: int) -> np.ndarray:
        """
        The next C{count} frames as int16 samples, checking each frame's shape.
        """
        out = []
        for _ in range(count):
            frame = self.track.nextFrame()
            self.assertEqual(frame.sample_rate, 48000)
            self.assertEqual(frame.samples, 960)
            self.assertEqual(frame.layout.name, "mono")
            self.assertEqual(frame.pts, (self.track.frames - 1) * 960)
            out.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(out)

    def test_silenceWhenIdle(self) -> None:
        played = self.play(5)
        self.assertFalse(played.any())
        self.assertEqual(self.track.silentFrames, 5)
        self.assertFalse(self.track.playing)

    def test_oneSecondIsFiftyFrames(self) -> None:
        """
        One second at 44.1 kHz in 100 ms chunks is exactly 48000 samples:
        50 frames of speech, then silence; started and drained once each.
        """
        signal = sine(1.0)
        for i in range(0, len(signal), 4410):
            self.track.feed(pcm16(signal[i : i + 4410]))
        self.track.finish()
        played = self.play(52)
        self.assertEqual(self.track.speechSamples, 48000)
        self.assertTrue(np.abs(played[:48000]).max() > 10000)
        self.assertFalse(played[48000:].any())
        self.assertEqual(self.started, [(1, 0)])
        self.assertEqual(self.drained, [1])
        self.assertFalse(self.track.playing)

    def test_gapFreeAcrossChunksAndSegments(self) -> None:
        """
        Chunks of odd sizes across two segments play the same samples as
        the whole signal resampled at once: no gap, no click, no drift.
        """
        from rpmiddleware.audio.pcm import resample

        signal = sine(0.6, 300.0)
        cuts = [0, 1234, 4410, 9999, 13230, 20000, len(signal)]  # 13230: a segment boundary
        for a, b in zip(cuts, cuts[1:], strict=False):
            self.track.feed(pcm16(signal[a:b]))
        self.track.finish()
        played = self.play(31).astype(np.float64) / 32768
        original = np.frombuffer(pcm16(signal), "<i2").astype(np.float32) / np.float32(32768)
        whole = resample(original, RATE_IN, 48000)
        self.assertEqual(self.track.speechSamples, len(whole))
        self.assertEqual(len(whole), 28800)
        # Streaming and one-shot soxr agree to within rounding away from the edges.
        self.assertLess(np.abs(played[200:28600] - whole[200:28600]).max(), 2e-3)
        self.assertEqual(self.track.underrunSamples, 0)

    def test_silenceBetweenTurns(self) -> None:
        self.track.feed(pcm16(sine(0.1)))
        self.track.finish()
        self.play(10)
        self.track.feed(pcm16(sine(0.1)))
        self.track.finish()
        self.play(10)
        self.assertEqual(self.started, [(1, 0), (2, 10)])
        self.assertEqual(self.drained, [1, 2])
        self.assertEqual(self.track.speechSamples, 9600)
        self.assertEqual(self.track.silentFrames, 10)

    def test_nextTurnWhileOneDrains(self) -> None:
        """
        A reply that ends upstream while its speech is still queued, then
        the next: the second starts when its own first sample plays.
        """
        self.track.feed(pcm16(sine(0.1)))  # 5 frames
        self.track.finish()
        self.track.feed(pcm16(sine(0.1)))
        self.track.finish()
        self.play(12)
        self.assertEqual(self.started, [(1, 0), (2, 5)])
        self.assertEqual(self.drained, [1, 2])

    def test_clearStopsAtOnce(self) -> None:
        """
        clear() mid-turn: the very next frame is silence; what was queued
        is counted as dropped and never drained.
        """
        self.track.feed(pcm16(sine(1.0)))
        self.play(10)
        self.assertTrue(self.track.playing)
        pending = round(self.track.queuedSeconds * 48000)
        self.track.clear()
        self.assertFalse(self.track.playing)
        played = self.play(3)
        self.assertFalse(played.any())
        self.assertEqual(self.track.droppedSamples, pending)
        self.assertEqual(self.track.queuedSeconds, 0)
        self.assertEqual(self.drained, [])

    def test_underrunCounted(self) -> None:
        """
        An open turn whose next chunk is late plays silence and counts it.
        """
        self.track.feed(pcm16(sine(0.1)))
        self.play(8)
        self.assertGreaterEqual(self.track.underrunSamples, 3 * 960)

    def test_stoppedTrackIgnoresFeed(self) -> None:
        self.track.stop()
        self.track.feed(pcm16(sine(0.1)))
        self.assertEqual(self.track.queuedSeconds, 0)
        self.assertFalse(self.track.playing)

    def test_pacing(self) -> None:
        """
        recv() hands frame n out at start + n * 20 ms: with a clock that
        only the fake sleep advances, 50 frames take exactly one second,
        and a reader that fell behind gets the late frames without sleeping.
        """
        from rpmiddleware.webrtc.speech import SpeechTrack

        now = [100.0]
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)
            now[0] += seconds

        track = SpeechTrack(clock=lambda: now[0], sleep=sleep, idleAfter=None)

        async def read(count: int) -> list[Any]:
            return [await track.recv() for _ in range(count)]

        frames = runSync(read(50))
        self.assertEqual(len(frames), 50)
        self.assertAlmostEqual(now[0] - 100.0, 0.98)  # frame 49 is due at 0.98 s
        self.assertEqual(len(slept), 49)
        now[0] += 1.0  # the reader stalls for a second
        slept.clear()
        runSync(read(50))
        self.assertEqual(slept, [])  # catching up: no sleeping
        runSync(read(1))
        self.assertEqual(len(slept), 1)

    def test_pausesWhenIdle(self) -> None:
        """
        After idleAfter of silence the track stops sending (recv waits)
        until speech is fed; the timeline then resumes at the present, so
        the pts jump by the pause.
        """
        from rpmiddleware.webrtc.speech import SpeechTrack

        now = [0.0]

        async def sleep(seconds: float) -> None:
            now[0] += seconds

        track = SpeechTrack(clock=lambda: now[0], sleep=sleep, idleAfter=0.1)

        async def scenario() -> Any:
            track.feed(pcm16(sine(0.1)))
            track.finish()
            for _ in range(10):  # 5 frames of speech, 5 of silence
                await track.recv()
            waiting = asyncio.ensure_future(track.recv())
            for _ in range(5):
                await asyncio.sleep(0)
            self.assertFalse(waiting.done())  # nothing is sent while idle
            self.assertTrue(track.paused)
            now[0] += 10.0  # ten seconds pass in silence
            track.feed(pcm16(sine(0.1)))
            return await waiting

        frame = inFreshLoop(scenario())
        self.assertFalse(track.paused)
        # The last frame was due at 0.18 s; 10.18 s is frame 509.
        self.assertEqual(frame.pts, 509 * 960)
        self.assertTrue(frame.to_ndarray().any())

    def test_stopEndsAPausedTrack(self) -> None:
        from aiortc.mediastreams import MediaStreamError

        from rpmiddleware.webrtc.speech import SpeechTrack

        track = SpeechTrack(idleAfter=0.02)
        track.nextFrame()

        async def scenario() -> None:
            waiting = asyncio.ensure_future(track.recv())
            for _ in range(5):
                await asyncio.sleep(0)
            self.assertTrue(track.paused)
            track.stop()
            with self.assertRaises(MediaStreamError):
                await waiting

        inFreshLoop(scenario())
