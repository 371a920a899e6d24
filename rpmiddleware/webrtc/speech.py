"""
The character's voice as an outgoing WebRTC audio track.

RPEngine speaks 44.1 kHz mono PCM16 in chunks, grouped in sentence segments.
L{SpeechTrack} is what aiortc's sender reads from: one 20 ms frame at 48 kHz
(Opus's native rate) per C{recv()}, handed out at real-time pace.

  - Gap-free: one L{StreamResampler} carries the filter state across every
    chunk and segment of a turn, so chunk edges neither click nor drift;
    the turn's tail is flushed by L{SpeechTrack.finish}.
  - Silent between turns: when nothing is queued the track sends silence
    frames for C{idleAfter} (1 s), so speech always fades into silence the
    receiver has actually heard, then pauses sending until the next turn,
    as Opus DTX does.  The RTP timestamps jump by the pause (the timeline
    follows the clock), which receivers play as silence.  An idle peer
    then costs nothing to encode: that is most of its CPU.
  - Stopped at once: L{SpeechTrack.clear} drops everything queued, so the
    next frame is silence (barge-in, cancel).

Pacing uses an injectable clock and sleep, so tests count frames instead of
waiting for wall-clock time.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Awaitable, Callable

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from rpmiddleware.audio.pcm import Samples, StreamResampler, decodePcm

#: RPEngine's speech output rate.
INPUT_RATE = 44100
#: Opus works at 48 kHz; giving it that avoids a second resampling in aiortc.
TRACK_RATE = 48000
FRAME_SECONDS = 0.02
FRAME_SAMPLES = int(TRACK_RATE * FRAME_SECONDS)  # 960
#: Seconds of silence after speech before the track stops sending until the
#: next turn, as Opus DTX does: an idle peer then costs no encoding.
IDLE_AFTER = 1.0
#: Speech queued beyond this is dropped (and counted): a runaway producer
#: must not grow memory without bound.  Two minutes is longer than any reply.
MAX_QUEUED_SECONDS = 120.0

_TIME_BASE = fractions.Fraction(1, TRACK_RATE)


class SpeechTrack(MediaStreamTrack):
    """
    A live audio track fed with PCM16 speech; silence when there is none.
    """

    kind = "audio"

    def __init__(
        self,
        inputRate: int = INPUT_RATE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        idleAfter: float | None = IDLE_AFTER,
    ) -> None:
        super().__init__()
        self.inputRate = inputRate
        self._clock = clock
        self._sleep = sleep
        #: Silent frames after which sending pauses until speech is fed again.
        self.idleFrames = None if idleAfter is None else max(1, round(idleAfter / FRAME_SECONDS))
        self._silentRun = 0
        self._wake: asyncio.Event | None = None
        #: Whether the track is paused (idle), sending nothing.
        self.paused = False
        # Entries are (turn, samples at TRACK_RATE), or (turn, None): the
        # turn's end, reached when everything before it has been sent.
        self._queue: deque[tuple[int, np.ndarray | None]] = deque()
        self._queued = 0  # samples waiting in _queue
        self._head = 0  # samples of the first entry already sent
        self._resampler: StreamResampler | None = None
        self._start: float | None = None
        #: The turn being fed (0 before the first), and the last one heard.
        self.turn = 0
        self._sounding = 0
        #: Frames handed to the sender so far (speech or silence).
        self.frames = 0
        #: Samples of speech (not padding silence) handed out so far.
        self.speechSamples = 0
        #: Frames that were silence only.
        self.silentFrames = 0
        #: Samples of silence inserted inside a turn because speech came late.
        self.underrunSamples = 0
        #: Samples dropped by L{clear} or the queue bound.
        self.droppedSamples = 0
        #: Samples of speech handed out, by turn (the newest few turns).
        self._played: dict[int, int] = {}
        #: Called with (turn, frame index) when a turn's first sample is sent.
        self.onStarted: Callable[[int, int], None] | None = None
        #: Called with the turn when a finished turn has been sent completely.
        self.onDrained: Callable[[int], None] | None = None

    # Feeding (from the Twisted side; same thread, same loop).

    @property
    def feeding(self) -> bool:
        """
        Whether a turn is open (fed and not yet finished).
        """
        return self._resampler is not None

    @property
    def playing(self) -> bool:
        """
        Whether the character is talking: a turn is open or speech is queued.
        """
        return self.feeding or bool(self._queue)

    @property
    def sounding(self) -> int:
        """
        The turn whose speech was sent last (0 before any).
        """
        return self._sounding

    @property
    def queuedSeconds(self) -> float:
        """
        Speech queued and not yet sent.
        """
        return (self._queued - self._head) / TRACK_RATE

    def feed(self, pcm16: bytes, rate: int | None = None) -> int:
        """
        Queue the next chunk of the current turn, opening a turn if none is
        open.  Returns the turn number.

        @param rate: the chunk's sample rate (default L{inputRate}).  At
            48 kHz it is queued as it is; a change of rate within a turn
            flushes the filter and starts another.
        """
        if self.readyState != "live":
            return self.turn
        rate = rate or self.inputRate
        if self._resampler is None:
            self.turn += 1
        elif self._resampler.inRate != rate:
            self._push(self._resampler.flush())
            self._resampler = None
        if self._resampler is None:
            self._resampler = StreamResampler(rate, TRACK_RATE)
        self._push(self._resampler.feed(decodePcm(pcm16, "pcm_s16le")))
        if self._wake is not None:
            self._wake.set()
        return self.turn

    def finish(self) -> None:
        """
        The turn's speech is complete: flush the resampler's tail.  The queue
        plays out (then L{onDrained}), then silence.
        """
        if self._resampler is None:
            return
        self._push(self._resampler.flush())
        self._resampler = None
        self._queue.append((self.turn, None))
        self._markers()

    def clear(self) -> None:
        """
        Stop speaking now: drop the queue and the open turn.  The next frame
        is silence; no L{onDrained} for what was dropped.
        """
        self.droppedSamples += self._queued - self._head
        self._queue.clear()
        self._queued = 0
        self._head = 0
        self._resampler = None

    def _push(self, samples: Samples) -> None:
        if not len(samples):
            return
        room = int(MAX_QUEUED_SECONDS * TRACK_RATE) - self._queued
        if len(samples) > room:
            self.droppedSamples += len(samples) - max(0, room)
            samples = samples[: max(0, room)]
            if not len(samples):
                return
        scaled = np.clip(np.rint(samples.astype(np.float64) * 32768.0), -32768, 32767)
        self._queue.append((self.turn, scaled.astype(np.int16)))
        self._queued += len(samples)

    # Reading (aiortc's sender).

    def nextFrame(self) -> AudioFrame:
        """
        The next 20 ms frame, without pacing: what L{recv} returns once the
        frame is due.  Tests call this directly to count frames.
        """
        out = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        filled = 0
        self._markers()
        while filled < FRAME_SAMPLES and self._queue:
            turn, head = self._queue[0]
            assert head is not None
            if turn != self._sounding:
                self._sounding = turn
                if self.onStarted is not None:
                    self.onStarted(turn, self.frames)
            take = min(FRAME_SAMPLES - filled, len(head) - self._head)
            self._count(turn, take)
            out[filled : filled + take] = head[self._head : self._head + take]
            filled += take
            self._head += take
            if self._head == len(head):
                self._queue.popleft()
                self._queued -= len(head)
                self._head = 0
            self._markers()
        self.speechSamples += filled
        if filled:
            self._silentRun = 0
        else:
            self.silentFrames += 1
            self._silentRun += 1
        if filled < FRAME_SAMPLES and self.feeding and self._sounding == self.turn:
            # The open turn has started sounding but its next chunk is late.
            self.underrunSamples += FRAME_SAMPLES - filled
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(out.tobytes())
        frame.sample_rate = TRACK_RATE
        frame.pts = self.frames * FRAME_SAMPLES
        frame.time_base = _TIME_BASE
        self.frames += 1
        return frame

    def played(self, turn: int) -> int:
        """
        Samples (at L{TRACK_RATE}) of turn C{turn}'s speech handed to the
        sender so far: what the player has been played of it, the sender
        pacing frames in real time (a network's delay before they are heard).
        """
        return self._played.get(turn, 0)

    def _count(self, turn: int, samples: int) -> None:
        if turn not in self._played:
            for old in [t for t in self._played if t < turn - 8]:
                del self._played[old]
            self._played[turn] = 0
        self._played[turn] += samples

    def _markers(self) -> None:
        """
        Pass the end-of-turn markers at the head of the queue.
        """
        while self._queue and self._queue[0][1] is None:
            turn, _ = self._queue.popleft()
            if self.onDrained is not None:
                self.onDrained(turn)

    async def recv(self) -> AudioFrame:
        """
        The next frame when it is due: frame n at start + n * 20 ms.  A
        reader that falls behind gets the late frames at once (as aiortc's
        own tracks do) so the timeline never slips.
        """
        if self.readyState != "live":
            raise MediaStreamError
        if self.idleFrames is not None and self._silentRun >= self.idleFrames and not self.playing:
            await self._idle()
        now = self._clock()
        if self._start is None:
            self._start = now
        wait = self._start + self.frames * FRAME_SECONDS - now
        if wait > 0:
            await self._sleep(wait)
        if self.readyState != "live":
            raise MediaStreamError
        return self.nextFrame()

    async def _idle(self) -> None:
        """
        Send nothing until speech is fed (or the track stops).  The timeline
        then resumes at the present, so the RTP timestamps jump by the pause
        as they do after Opus DTX, and the receiver plays silence meanwhile.
        """
        self.paused = True
        if self._wake is None:
            self._wake = asyncio.Event()
        while not self.playing and self.readyState == "live":
            self._wake.clear()
            await self._wake.wait()
        self.paused = False
        self._silentRun = 0
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is not None:
            # The frame due now (a microsecond's slack for float rounding).
            due = int((self._clock() - self._start) / FRAME_SECONDS + 1e-6)
            self.frames = max(self.frames, due)

    def stop(self) -> None:
        self.clear()
        super().stop()
        if self._wake is not None:
            self._wake.set()
