"""
Benchmarks 1 and 2: what the middleware adds to each hop.

The middleware (default plugin chain, client endpoint) runs in a process of
its own pinned to one CPU; so does the floor, a bare Autobahn relay
(L{bench.relay}).  This process, pinned to the other CPU, plays RPEngine
(a minimal v3 peer that sends exactly the frames measured) and the client,
so both ends of a hop read the same clock.

1. Hop overhead: RPEngine sends C{reply.text.delta} (or a 100 ms
   C{reply.audio.chunk}) and the time until the client has the C{llm-chunk}
   (C{tts-chunk}) is taken, one message in flight at a time; p50 and p99.
   Audio is measured with the client asking for 44.1 kHz (no resampling:
   framing, JSON and base64 only) and for 24 kHz (the audio-resample
   plugin's streaming soxr as well).
2. Time to first audio: (a) a 3 s WAV, 48 kHz stereo, from the client's
   C{audio} message to RPEngine holding the C{reply.request} with 16 kHz mono
   PCM (decode, downmix, resample, card, chain); (b) a turn's first
   C{reply.audio.chunk} to the client's first C{tts-chunk}.
"""

from __future__ import annotations

import base64
import io
import math
import time
import wave
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol, connectWS
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.task import deferLater

from bench.common import Section, median, percentile, pin, table
from bench.peers import Peer
from bench.wire import WholeFrames
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.web.websocket import QuietFraming

ORIGIN = "https://rpengine.gemtavern.com"
HOP_HEADERS = [
    "hop",
    "relay p50",
    "relay p99",
    "middleware p50",
    "middleware p99",
    "p50 ratio",
    "p99 ratio",
]
CHUNK_SAMPLES = 4410


# Autobahn's own bases disagree on the types of peer and _transport_details,
# which mypy checks in any class with a second base.
class _Protocol(WholeFrames, QuietFraming, WebSocketClientProtocol):  # type: ignore[misc]
    factory: _Factory

    def connectionMade(self) -> None:
        super().connectionMade()
        tcp = ITCPTransport(self.transport, None)
        if tcp is not None:
            tcp.setTcpNoDelay(True)

    def onOpen(self) -> None:
        self.factory.peer = self
        self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        now = time.perf_counter()
        self.factory.handler(orjson.loads(payload), now)


class _Factory(WebSocketClientFactory):
    protocol = _Protocol  # type: ignore[assignment]

    def __init__(self, url: str, origin: str | None, reactor: Any) -> None:
        super().__init__(url, origin=origin, reactor=reactor)
        # The driver reads as cheaply as it can, so that its own CPU (it plays
        # RPEngine and every client of the load on one core) is not the
        # limit: orjson checks UTF-8 as it parses, so Autobahn's per-frame
        # validator is off (at 250 heavy streams it was 7% of the driver,
        # stdlib json's encoder 13%, Autobahn's debug arguments 8%).
        self.setProtocolOptions(
            maxMessagePayloadSize=16 * 1024 * 1024,
            maxFramePayloadSize=16 * 1024 * 1024,
            utf8validateIncoming=False,
        )
        self.opened: Deferred[_Protocol] = Deferred()
        self.peer: _Protocol | None = None
        self.handler: Callable[[dict[str, Any], float], None] = lambda m, t: None


class Socket:
    """
    A WebSocket end for the benchmark: send dicts, receive (dict, time) in
    a handler, or wait for the next message that matches.
    """

    def __init__(self, reactor: Any, url: str, origin: str | None) -> None:
        self.factory = _Factory(url, origin, reactor)
        self.factory.handler = self._received
        self._waiting: list[tuple[Callable[[dict[str, Any]], bool], Deferred[Any]]] = []
        self.onMessage: Callable[[dict[str, Any], float], None] | None = None
        connectWS(self.factory)

    async def opened(self) -> None:
        await self.factory.opened

    def send(self, message: dict[str, Any]) -> float:
        assert self.factory.peer is not None
        payload = orjson.dumps(message)
        started = time.perf_counter()
        self.factory.peer.sendText(payload)
        return started

    def _received(self, message: dict[str, Any], at: float) -> None:
        for entry in list(self._waiting):
            predicate, d = entry
            if predicate(message):
                self._waiting.remove(entry)
                d.callback((message, at))
                return
        if self.onMessage is not None:
            self.onMessage(message, at)

    def next(self, predicate: Callable[[dict[str, Any]], bool]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self._waiting.append((predicate, d))
        return d

    def close(self) -> None:
        if self.factory.peer is not None:
            self.factory.peer.dropConnection(abort=True)


def ofType(*types: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m.get("type") in types


def pcmChunk(index: int) -> str:
    t = (np.arange(CHUNK_SAMPLES) + index * CHUNK_SAMPLES) / 44100
    samples = (0.3 * np.sin(2 * math.pi * 220 * t) * 32767).astype("<i2")
    return base64.b64encode(samples.tobytes()).decode("ascii")


def wav48kStereo(seconds: float = 3.0) -> str:
    t = np.arange(int(48000 * seconds)) / 48000
    left = 0.3 * np.sin(2 * math.pi * 220 * t)
    stereo = np.stack([left, left * 0.8], axis=1)
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(2)
        writer.setsampwidth(2)
        writer.setframerate(48000)
        writer.writeframes((stereo * 32767).astype("<i2").tobytes())
    return base64.b64encode(out.getvalue()).decode("ascii")


#: More chunks than any run sends: the hop's segment never ends mid-run.
ONE_LONG_SEGMENT = 1_000_000


class Rig:
    """
    RPEngine and a client connected to one server (middleware or relay).
    """

    def __init__(self, reactor: Any, port: int, relay: bool) -> None:
        self.reactor = reactor
        self.port = port
        self.relay = relay
        self.sessionId: str | None = None
        self.requestId = "bench"
        self.sequence = 0

    async def start(self, sampleRate: int) -> None:
        reactor, port = self.reactor, self.port
        self.engine = Socket(reactor, f"ws://127.0.0.1:{port}/rp-engine/socket", ORIGIN)
        await self.engine.opened()
        if not self.relay:
            welcome = self.engine.next(ofType("welcome"))
            self.engine.send(Envelope.build("hello").fields)
            message, _ = await welcome
            self.sessionId = message["sessionId"]
            self.engine.send(
                self.envelope(
                    "capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=64
                )
            )
        self.client = Socket(reactor, f"ws://127.0.0.1:{port}/client/socket", None)
        if not self.relay:
            ready = self.client.next(ofType("ready"))
            await self.client.opened()
            await ready
            self.client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
            self.client.send(
                {"type": "configure", "output": {"sampleRate": sampleRate, "voice": "F2"}}
            )
        else:
            await self.client.opened()
        await deferLater(reactor, 0.2, lambda: None)

    def envelope(self, kind: str, **fields: Any) -> dict[str, Any]:
        return Envelope.build(kind, self.sessionId, **fields).fields

    async def openTurn(self, text: str = "go") -> str:
        """
        A client turn, accepted by RPEngine; returns its requestId.
        """
        if self.relay:
            self.requestId = f"relay-{time.perf_counter_ns()}"
            self.sequence = 0
            return self.requestId
        request = self.engine.next(ofType("reply.request"))
        self.client.send({"type": "text", "text": text})
        message, _ = await request
        self.accept(message)
        return self.requestId

    def accept(self, request: dict[str, Any]) -> None:
        self.requestId = request["requestId"]
        self.sequence = 0
        self.engine.send(self.envelope("ack", acknowledgedMessageId=request["messageId"]))
        self.engine.send(self.envelope("reply.accepted", requestId=self.requestId))

    async def closeTurn(self) -> None:
        if self.relay:
            return
        done = self.client.next(ofType("reply-complete", "tts-cancelled"))
        for kind in ("reply.audio.completed", "reply.text.completed", "reply.completed"):
            self.engine.send(self.envelope(kind, requestId=self.requestId))
        await done

    async def hop(self, kind: str, index: int) -> float:
        """
        One message from RPEngine to the client; the seconds it took.
        """
        if kind == "text":
            word = f"w{index} "
            arrived = self.client.next(
                lambda m: m.get("type") == "llm-chunk" and m.get("content", m.get("delta")) == word
            )
            fields = {"sequence": self.sequence, "delta": word}
            sent = self.engine.send(
                self.envelope("reply.text.delta", requestId=self.requestId, **fields)
            )
        else:
            arrived = self.client.next(ofType("tts-chunk"))
            fields = {
                "sequence": self.sequence,
                # One long sentence, numbered as RPEngine numbers a
                # segment's chunks (src/socket-adapter.ts).
                "segmentSequence": 0,
                "segmentChunkSequence": self.sequence,
                "segmentChunkCount": ONE_LONG_SEGMENT,
                "data": pcmChunk(index),
            }
            sent = self.engine.send(
                self.envelope("reply.audio.chunk", requestId=self.requestId, **fields)
            )
        self.sequence += 1
        _, at = await arrived
        return at - sent

    def startAudio(self) -> None:
        self.engine.send(
            self.envelope(
                "reply.audio.start",
                requestId=self.requestId,
                format="pcm_s16le",
                sampleRate=44100,
                channels=1,
            )
        )

    def close(self) -> None:
        self.engine.close()
        self.client.close()


async def hops(
    reactor: Any, port: int, relay: bool, kind: str, count: int, rate: int
) -> list[float]:
    rig = Rig(reactor, port, relay)
    await rig.start(rate)
    try:
        await rig.openTurn()
        if kind == "audio":
            rig.startAudio()
        times = []
        for index in range(count + count // 10):
            took = await rig.hop(kind, index)
            if index >= count // 10:  # the first tenth warms up
                times.append(took)
        await rig.closeTurn()
        return times
    finally:
        rig.close()
        await deferLater(reactor, 0.1, lambda: None)


async def audioIn(reactor: Any, port: int, relay: bool, turns: int) -> list[float]:
    """
    Client C{audio} (3 s WAV, 48 kHz stereo) to RPEngine's reply.request.
    """
    rig = Rig(reactor, port, relay)
    await rig.start(24000)
    data = wav48kStereo()
    times = []
    try:
        for _ in range(turns):
            request = rig.engine.next(ofType("reply.request", "audio"))
            sent = rig.client.send({"type": "audio", "data": data})
            message, at = await request
            times.append(at - sent)
            if not relay:
                audio = message["event"]["audio"]
                assert (audio["sampleRate"], audio.get("channels", 1)) == (16000, 1), audio
                rig.accept(message)
                await rig.closeTurn()
        return times
    finally:
        rig.close()
        await deferLater(reactor, 0.1, lambda: None)


async def firstChunk(reactor: Any, port: int, turns: int) -> list[float]:
    """
    A turn's first reply.audio.chunk to the client's first tts-chunk.
    """
    rig = Rig(reactor, port, relay=False)
    await rig.start(24000)
    times = []
    try:
        for _ in range(turns):
            await rig.openTurn()
            rig.startAudio()
            times.append(await rig.hop("audio", 0))
            await rig.closeTurn()
        return times
    finally:
        rig.close()
        await deferLater(reactor, 0.1, lambda: None)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


async def run(reactor: Any, quick: bool = False) -> tuple[Section, Section]:
    runs = 2 if quick else 5
    count = 300 if quick else 1000
    pin(1)
    middleware = Peer(reactor, "middleware", "--pin", "0")
    relay = Peer(reactor, "middleware", "--bare-relay", "--pin", "0")
    try:
        ports = {
            "middleware": int(await middleware.line("PORT")),
            "relay": int(await relay.line("PORT")),
        }
        cases = [("text", 44100), ("audio", 44100), ("audio", 24000)]
        results: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
        for _ in range(runs):
            for kind, rate in cases:
                for server in ("relay", "middleware"):
                    times = await hops(reactor, ports[server], server == "relay", kind, count, rate)
                    key = (server, kind, rate)
                    results.setdefault(key, []).append(
                        (percentile(times, 50), percentile(times, 99))
                    )
        turns = 10 if quick else 30
        inRelay, inMiddleware, first = [], [], []
        for _ in range(runs):
            inRelay += await audioIn(reactor, ports["relay"], True, turns)
            inMiddleware += await audioIn(reactor, ports["middleware"], False, turns)
            first += await firstChunk(reactor, ports["middleware"], turns)
    finally:
        await middleware.stop()
        await relay.stop()

    def stat(server: str, kind: str, rate: int, which: int) -> float:
        return median([r[which] for r in results[(server, kind, rate)]])

    rows = []
    goals = []
    for kind, rate in cases:
        label = (
            "reply.text.delta -> llm-chunk"
            if kind == "text"
            else (f"reply.audio.chunk (100 ms) -> tts-chunk at {rate / 1000:g} kHz")
        )
        r50, r99 = stat("relay", kind, rate, 0), stat("relay", kind, rate, 1)
        m50, m99 = stat("middleware", kind, rate, 0), stat("middleware", kind, rate, 1)
        rows.append(
            (
                label,
                _us(r50),
                _us(r99),
                _us(m50),
                _us(m99),
                f"{m50 / r50:.2f}x",
                f"{m99 / r99:.2f}x",
            )
        )
        # Issue 20's lines: text within 1.15x of the relay, audio within 1.3x.
        line = 1.15 if kind == "text" else 1.3
        goals.append(
            (
                f"hop p50 <= {line:g}x bare relay ({label})",
                f"{m50 / r50:.2f}x",
                m50 / r50 <= line,
            )
        )
        goals.append((f"hop p99 <= 3x bare relay ({label})", f"{m99 / r99:.2f}x", m99 / r99 <= 3.0))
    chunkFloor = stat("relay", "audio", 24000, 0)
    first50, first99 = percentile(first, 50), percentile(first, 99)
    added = first50 - chunkFloor
    goals.append(
        (
            "first tts-chunk adds <= 1 ms p50 over the bare hop",
            f"{added * 1000:.2f} ms",
            added <= 0.001,
        )
    )
    in50r, in50m = percentile(inRelay, 50), percentile(inMiddleware, 50)
    in99m = percentile(inMiddleware, 99)
    firstRows = [
        (
            "(a) audio turn in: client audio -> reply.request",
            f"{in50m * 1000:.2f}",
            f"{in99m * 1000:.2f}",
            f"{in50r * 1000:.2f}",
            f"{(in50m - in50r) * 1000:.2f}",
        ),
        (
            "(b) first reply.audio.chunk -> first tts-chunk",
            f"{first50 * 1000:.3f}",
            f"{first99 * 1000:.3f}",
            f"{chunkFloor * 1000:.3f}",
            f"{added * 1000:.3f}",
        ),
    ]
    megabytes = len(wav48kStereo()) / 1e6
    body1 = f"""
Latency of one message from the simulated RPEngine to the client, one in flight at a time,
{count} messages per run after {count // 10} to warm up; the median over {runs} runs of each
run's p50 and p99, in microseconds. The relay and the middleware run alternately, each in its own
process pinned to CPU 0; RPEngine and the client share this process, pinned to CPU 1, and one
clock.

{table(HOP_HEADERS, rows)}
"""
    body2 = f"""
(a) A spoken turn in: the client's `audio` message (a 3 s WAV, 48 kHz stereo, {megabytes:.2f}
MB of base64) until RPEngine holds the `reply.request` (16 kHz mono PCM16 for the middleware:
decoded, downmixed and resampled by the client endpoint and the audio-resample plugin, card
attached by card-cache); for the relay, the same message parsed, renamed and forwarded. {turns}
turns per run, {runs} runs.

(b) The first `tts-chunk` of a turn: from RPEngine's first `reply.audio.chunk` (after
`reply.audio.start`) to the client's first `tts-chunk` at 24 kHz, which sets up the turn's
resampler, against the relay's p50 hop for the same chunk.

{table(["measure", "p50 (ms)", "p99 (ms)", "floor p50 (ms)", "added p50 (ms)"], firstRows)}
"""
    one = Section("Hop overhead (benchmark 1)", body1, goals[:-1])
    one.figures = {
        "text hop p50 (reply.text.delta -> llm-chunk)": (
            stat("relay", "text", 44100, 0) * 1e6,
            stat("middleware", "text", 44100, 0) * 1e6,
            "us",
        ),
        "audio hop p50 (reply.audio.chunk 44.1 kHz -> tts-chunk 24 kHz)": (
            stat("relay", "audio", 24000, 0) * 1e6,
            stat("middleware", "audio", 24000, 0) * 1e6,
            "us",
        ),
    }
    two = Section("Time to first audio (benchmark 2)", body2, goals[-1:])
    return one, two
