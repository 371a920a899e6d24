"""
The player's microphone: an incoming WebRTC audio track as mono 16 kHz PCM16.

aiortc decodes Opus to 48 kHz PCM16 frames (stereo, whatever the browser
sent); L{MicrophoneReader} reads them as they arrive, downmixes by averaging
the channels and resamples with L{rpmiddleware.audio.pcm.StreamResampler} (the
same soxr path as the C{audio} message, so both kinds of turn sound the
same to RPEngine), and hands each piece to a callback: the voice activity
detector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from rpmiddleware.audio.pcm import StreamResampler, encodePcm, toMono

#: What RPEngine takes, and what the detector works at.
OUTPUT_RATE = 16000

PcmSink = Callable[[bytes], None]


def frameToMono(frame: Any) -> tuple[np.ndarray, int]:
    """
    One decoded audio frame as float32 mono samples (-1..1) and its rate.
    Accepts packed or planar PCM16 and float frames of any channel count.
    """
    array = frame.to_ndarray()
    channels = len(frame.layout.channels)
    name = frame.format.name
    if frame.format.is_planar:
        # (channels, samples): one row per channel.
        frames = array.T
    else:
        # (1, samples * channels): interleaved.
        frames = array.reshape(-1, channels)
    if name.startswith("s16"):
        samples = frames.astype(np.float32) / np.float32(32768.0)
    elif name.startswith("s32"):
        samples = frames.astype(np.float32) / np.float32(2147483648.0)
    else:
        samples = frames.astype(np.float32)
    if channels == 1:
        samples = samples.reshape(-1)
    return toMono(samples), int(frame.sample_rate)


class MicrophoneReader:
    """
    Reads one remote audio track until it ends, feeding C{sink} with mono
    16 kHz PCM16.  C{onEnded} is called once when the track ends or the
    reader is stopped.
    """

    def __init__(
        self,
        track: MediaStreamTrack,
        sink: PcmSink,
        onEnded: Callable[[], None] | None = None,
    ) -> None:
        self.track = track
        self.sink = sink
        self.onEnded = onEnded
        self._resampler: StreamResampler | None = None
        self._rate = 0
        #: Samples (at the track's rate) and frames read so far.
        self.framesRead = 0
        self.samplesOut = 0
        self._task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
        self._task = loop.create_task(self.run())
        return self._task

    async def run(self) -> None:
        try:
            while True:
                try:
                    frame = await self.track.recv()
                except MediaStreamError:
                    break
                self.accept(frame)
        finally:
            self.finish()

    def accept(self, frame: Any) -> None:
        """
        One decoded frame: resample and hand on.
        """
        samples, rate = frameToMono(frame)
        self.framesRead += 1
        if rate != self._rate or self._resampler is None:
            # A change of rate mid-stream (never seen from Opus) restarts the filter.
            self._rate = rate
            self._resampler = StreamResampler(rate, OUTPUT_RATE)
        out = self._resampler.feed(samples)
        if len(out):
            self.samplesOut += len(out)
            self.sink(encodePcm(out, "pcm_s16le"))

    def finish(self) -> None:
        if self._resampler is not None:
            tail = self._resampler.flush()
            self._resampler = None
            if len(tail):
                self.samplesOut += len(tail)
                self.sink(encodePcm(tail, "pcm_s16le"))
        callback, self.onEnded = self.onEnded, None
        if callback is not None:
            callback()

    async def stop(self) -> None:
        """
        Stop reading (the peer is closing); C{onEnded} is called.
        """
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
