"""
WebRTC test peers and signals: an aiortc client that plays a voice client,
and speech-like audio to talk to the server with.

Needs the C{webrtc} extra; tests that import this skip without it.

    client = ClientPeer(loop, microphone=PcmTrack(conversation().pcm(48000)))
    answer = await sendOffer(await client.offer())   # over the WebSocket
    await client.accept(answer)
    await client.opened                               # the data channel
"""

from __future__ import annotations

import asyncio
import fractions
import io
import json
import math
import time
import wave
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from rpmiddleware.webrtc.microphone import frameToMono

FRAME_SECONDS = 0.02


def speechLike(
    seconds: float,
    rate: int = 16000,
    f0: float = 130.0,
    amplitude: float = 0.3,
    seed: int = 0,
) -> np.ndarray:
    """
    A voiced, speech-like sound as float samples: a harmonic series on a
    slightly wavering pitch C{f0}, shaped by three vowel formants and a
    4 Hz syllable rhythm, with 10 ms fades.  Voice detectors take it for
    speech where a pure tone may not pass.
    """
    n = max(0, int(round(seconds * rate)))
    t = np.arange(n) / rate
    rng = np.random.default_rng(seed)
    pitch = f0 * (1.0 + 0.05 * np.sin(2 * math.pi * 3.0 * t))
    phase = 2 * math.pi * np.cumsum(pitch) / rate
    formants = ((700.0, 130.0), (1220.0, 70.0), (2600.0, 160.0))
    out = np.zeros(n)
    for k in range(1, int(3800 / f0)):
        fk = k * f0
        gain = sum(math.exp(-(((fk - f) / (2 * b)) ** 2)) for f, b in formants) + 0.05
        out += gain / math.sqrt(k) * np.sin(k * phase + rng.uniform(0, 2 * math.pi))
    out *= 0.55 + 0.45 * np.sin(2 * math.pi * 4.0 * t - math.pi / 2)
    peak = float(np.max(np.abs(out))) if n else 0.0
    if peak:
        out *= amplitude / peak
    fade = min(n // 2, int(0.01 * rate))
    if fade:
        ramp = np.linspace(0.0, 1.0, fade)
        out[:fade] *= ramp
        out[n - fade :] *= ramp[::-1]
    return out


@dataclass
class Recording:
    """
    Speech-like bursts and silences, with where each burst is.
    """

    #: (kind, seconds): kind is "speech" or "silence".
    parts: Sequence[tuple[str, float]]

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.parts)

    def bursts(self) -> list[tuple[float, float]]:
        """
        (start, end) seconds of each speech burst.
        """
        found, at = [], 0.0
        for kind, seconds in self.parts:
            if kind == "speech":
                found.append((at, at + seconds))
            at += seconds
        return found

    def samples(self, rate: int) -> np.ndarray:
        pieces = []
        for i, (kind, seconds) in enumerate(self.parts):
            if kind == "speech":
                pieces.append(speechLike(seconds, rate, f0=120.0 + 40.0 * (i % 3), seed=i))
            else:
                pieces.append(np.zeros(int(round(seconds * rate))))
        return np.concatenate(pieces) if pieces else np.zeros(0)

    def pcm(self, rate: int) -> bytes:
        """
        Mono PCM16 little-endian at C{rate}.
        """
        return (np.clip(self.samples(rate), -1, 1) * 32767).astype("<i2").tobytes()

    def wav(self, rate: int = 48000, channels: int = 1) -> bytes:
        """
        A WAV file (PCM16), the same sound on every channel.
        """
        samples = (np.clip(self.samples(rate), -1, 1) * 32767).astype("<i2")
        if channels > 1:
            samples = np.repeat(samples[:, None], channels, axis=1).reshape(-1)
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(samples.tobytes())
        return out.getvalue()


def conversation(speech: float = 1.0, before: float = 0.5, after: float = 1.0) -> Recording:
    """
    One utterance with silence around it.
    """
    return Recording([("silence", before), ("speech", speech), ("silence", after)])


class PcmTrack(MediaStreamTrack):
    """
    A microphone for the test client: plays mono PCM16 at C{rate} in 20 ms
    frames at real-time pace, then silence until stopped.  L{say} queues
    more speech.
    """

    kind = "audio"

    def __init__(self, pcm: bytes = b"", rate: int = 48000) -> None:
        super().__init__()
        self.rate = rate
        self.frameSamples = int(rate * FRAME_SECONDS)
        self._pending = bytearray(pcm)
        self._start: float | None = None
        self.frames = 0
        #: Set when the queued speech has all been sent.
        self.spoken: asyncio.Event | None = None

    def say(self, pcm: bytes) -> None:
        self._pending.extend(pcm)

    @property
    def idle(self) -> bool:
        return not self._pending

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        wait = self._start + self.frames * FRAME_SECONDS - now
        if wait > 0:
            await asyncio.sleep(wait)
        size = self.frameSamples * 2
        chunk = bytes(self._pending[:size])
        del self._pending[:size]
        chunk += bytes(size - len(chunk))
        frame = AudioFrame(format="s16", layout="mono", samples=self.frameSamples)
        frame.planes[0].update(chunk)
        frame.sample_rate = self.rate
        frame.pts = self.frames * self.frameSamples
        frame.time_base = fractions.Fraction(1, self.rate)
        self.frames += 1
        return frame


class TrackListener:
    """
    Reads the server's speech track on the client: counts samples and how
    many of them are sound (above a small threshold), and when sound first
    and last arrived.
    """

    def __init__(self, track: MediaStreamTrack, threshold: float = 0.01) -> None:
        self.track = track
        self.threshold = threshold
        self.samples = 0
        self.rate = 0
        self.soundSamples = 0
        self.firstSound: float | None = None
        self.lastSound: float | None = None
        self.peak = 0.0
        self.soundHeard: asyncio.Event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                frame = await self.track.recv()
            except MediaStreamError:
                return
            samples, self.rate = frameToMono(frame)
            self.samples += len(samples)
            loud = np.abs(samples) > self.threshold
            if loud.any():
                now = time.monotonic()
                self.soundSamples += int(loud.sum())
                self.peak = max(self.peak, float(np.abs(samples).max()))
                if self.firstSound is None:
                    self.firstSound = now
                self.lastSound = now
                self.soundHeard.set()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


class ClientPeer:
    """
    An aiortc peer that behaves like the LLMRTC web client: it offers with
    a data channel named C{data} (and, optionally or later, a microphone
    track), does not trickle, and reads the server's speech track.
    """

    def __init__(self, microphone: MediaStreamTrack | None = None) -> None:
        self.pc = RTCPeerConnection()
        self.channel = self.pc.createDataChannel("data", ordered=True)
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.received: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.channel.on("open", self._opened)
        self.channel.on("message", self._message)
        self.listener: TrackListener | None = None
        self.trackArrived: asyncio.Future[TrackListener] = loop.create_future()
        self.pc.on("track", self._track)
        self.microphone = microphone
        if microphone is not None:
            self.pc.addTrack(microphone)

    def _opened(self) -> None:
        if not self.opened.done():
            self.opened.set_result(None)

    def _message(self, data: str | bytes) -> None:
        message = json.loads(data)
        self.received.append(message)
        self.messages.put_nowait(message)

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self.listener is None:
            self.listener = TrackListener(track)
            self.listener.start()
            self.trackArrived.set_result(self.listener)

    def addMicrophone(self, track: MediaStreamTrack) -> None:
        self.microphone = track
        self.pc.addTrack(track)

    async def offer(self) -> dict[str, str]:
        """
        A complete offer (candidates gathered), as the C{signal} of C{offer}.
        """
        await self.pc.setLocalDescription(await self.pc.createOffer())
        local = self.pc.localDescription
        return {"type": local.type, "sdp": local.sdp}

    async def accept(self, answer: dict[str, str]) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))

    async def negotiate(
        self, exchange: Callable[[dict[str, str]], Awaitable[dict[str, str]]]
    ) -> dict[str, str]:
        """
        Offer, have C{exchange} deliver it and return the answer, accept it.
        """
        answer = await exchange(await self.offer())
        await self.accept(answer)
        return answer

    def send(self, message: dict[str, Any]) -> None:
        self.channel.send(json.dumps(message))

    async def nextOfType(self, *types: str, timeout: float = 10.0) -> dict[str, Any]:
        """
        The next data-channel message of one of C{types}, skipping others.
        """

        async def find() -> dict[str, Any]:
            while True:
                message = await self.messages.get()
                if message.get("type") in types:
                    return message

        return await asyncio.wait_for(find(), timeout)

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        if self.microphone is not None:
            self.microphone.stop()
        await self.pc.close()
