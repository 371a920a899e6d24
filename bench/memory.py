"""
Benchmark 6: memory.

The middleware runs in a process of its own; its resident set size (VmRSS)
is read from /proc:

  - idle, with nothing connected;
  - per idle RPEngine connection (WebSocket open, no hello yet: the engine
    endpoint keeps only the newest session, so open connections beyond one
    are exactly these);
  - per idle client (past C{ready} and C{capacity});
  - the ceiling while a client that stops reading asks for a long spoken
    reply that RPEngine sends as fast as it can, against the same reply to
    a client that reads.
"""

from __future__ import annotations

import base64
import json
import math
import os
import struct
import time
from typing import Any

import numpy as np
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.internet.task import LoopingCall, deferLater

from bench.common import Section, median, table
from bench.hop import ORIGIN, Socket, ofType
from bench.peers import Peer
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard

CONNECTIONS = 200
#: A long reply: 5 minutes of speech in 100 ms chunks, more than loopback socket
#: buffers hold.
CHUNKS = 3000


async def rss(server: Peer) -> int:
    """
    The server's RSS in KiB (median of three readings).
    """
    readings = []
    for _ in range(3):
        readings.append(int(await server.ask("rss")))
        await _sleep(0.05)
    return int(median(readings))


def _sleep(seconds: float) -> Deferred[None]:
    from twisted.internet import reactor

    return deferLater(reactor, seconds, lambda: None)


class BlastingEngine:
    """
    RPEngine sending each accepted turn's speech as fast as it can, and
    stopping when the turn is cancelled.
    """

    def __init__(self, reactor: Any, port: int) -> None:
        self.reactor = reactor
        self.port = port
        t = np.arange(4410) / 44100
        pcm = (0.3 * np.sin(2 * math.pi * 220 * t) * 32767).astype("<i2").tobytes()
        self.data = base64.b64encode(pcm).decode("ascii")
        self.loops: dict[str, LoopingCall] = {}
        self.cancelled: list[str] = []

    async def start(self) -> None:
        self.socket = Socket(self.reactor, f"ws://127.0.0.1:{self.port}/rp-engine/socket", ORIGIN)
        await self.socket.opened()
        welcome = self.socket.next(ofType("welcome"))
        self.socket.send(Envelope.build("hello").fields)
        message, _ = await welcome
        self.sessionId = message["sessionId"]
        self.emit("capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=64)
        self.socket.onMessage = self.received

    def emit(self, kind: str, **fields: Any) -> None:
        self.socket.send(Envelope.build(kind, self.sessionId, **fields).fields)

    def received(self, message: dict[str, Any], at: float) -> None:
        kind = message.get("type")
        if kind == "request.cancel":
            requestId = message["requestId"]
            self.emit("ack", acknowledgedMessageId=message["messageId"])
            loop = self.loops.pop(requestId, None)
            if loop is not None and loop.running:
                loop.stop()
            self.cancelled.append(requestId)
            self.emit("reply.cancelled", requestId=requestId)
            return
        if kind != "reply.request":
            return
        requestId = message["requestId"]
        self.emit("ack", acknowledgedMessageId=message["messageId"])
        self.emit("reply.accepted", requestId=requestId)
        self.emit("reply.audio.start", requestId=requestId, format="pcm_s16le", sampleRate=44100)
        state = {"index": 0}

        def burst() -> None:
            for _ in range(10):
                index = state["index"]
                if index >= CHUNKS:
                    self.loops.pop(requestId).stop()
                    self.emit("reply.audio.completed", requestId=requestId, chunks=CHUNKS)
                    self.emit("reply.completed", requestId=requestId)
                    return
                self.emit(
                    "reply.audio.chunk",
                    requestId=requestId,
                    sequence=index,
                    segmentSequence=0,
                    final=index == CHUNKS - 1,
                    data=self.data,
                )
                state["index"] = index + 1

        loop = LoopingCall(burst)
        loop.clock = self.reactor
        self.loops[requestId] = loop
        loop.start(0.005)

    def stop(self) -> None:
        for loop in self.loops.values():
            if loop.running:
                loop.stop()
        self.socket.close()


class _Silent(Protocol):
    """
    A client that upgrades, asks for a turn, and then never reads again.
    """

    def __init__(self) -> None:
        self.made: Deferred[_Silent] = Deferred()
        self.received = b""

    def connectionMade(self) -> None:
        self.made.callback(self)

    def dataReceived(self, data: bytes) -> None:
        self.received += data


def _frame(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x81, 0x80 | size)
    elif size < 65536:
        head = struct.pack("!BBH", 0x81, 0xFE, size)
    else:
        head = struct.pack("!BBQ", 0x81, 0xFF, size)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def silentClient(reactor: Any, port: int) -> _Silent:
    factory = ClientFactory()
    peer = _Silent()
    factory.buildProtocol = lambda addr: peer  # type: ignore[method-assign]
    reactor.connectTCP("127.0.0.1", port, factory)
    await peer.made
    key = base64.b64encode(os.urandom(16)).decode()
    assert peer.transport is not None
    peer.transport.write(
        (
            f"GET /client/socket HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    while b"\r\n\r\n" not in peer.received:
        await _sleep(0.01)
    peer.transport.write(_frame({"type": "character", "characterId": "m", "card": exampleCard()}))
    peer.transport.write(_frame({"type": "text", "text": "a long story please"}))
    peer.transport.pauseProducing()  # type: ignore[attr-defined]
    return peer


async def ceiling(reactor: Any, reads: bool, seconds: float) -> tuple[int, int, int]:
    """
    (idle RSS, peak RSS, upstream cancels) while one client gets a long
    spoken reply sent as fast as RPEngine can.
    """
    server = Peer(reactor, "middleware")
    port = int(await server.line("PORT"))
    engine = BlastingEngine(reactor, port)
    client: Any = None
    try:
        await engine.start()
        await _sleep(0.5)
        idle = await rss(server)
        peak = idle
        if reads:
            client = Socket(reactor, f"ws://127.0.0.1:{port}/client/socket", None)
            done = client.next(ofType("reply-complete", "tts-cancelled"))
            await client.opened()
            client.send({"type": "character", "characterId": "m", "card": exampleCard()})
            client.send({"type": "text", "text": "a long story please"})
        else:
            client = await silentClient(reactor, port)
            done = None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            peak = max(peak, int(await server.ask("rss")))
            if done is not None and done.called:
                break
            await _sleep(0.05)
        return idle, peak, len(engine.cancelled)
    finally:
        engine.stop()
        if isinstance(client, Socket):
            client.close()
        elif client is not None and client.transport is not None:
            client.transport.abortConnection()
        await server.stop()


async def idleConnections(reactor: Any) -> tuple[int, int, int]:
    """
    (idle RSS, RSS with CONNECTIONS idle RPEngine connections, with as many
    idle clients), in KiB.
    """
    server = Peer(
        reactor, "middleware", "--max-connections", str(CONNECTIONS + 8), "--hello-timeout", "600"
    )
    port = int(await server.line("PORT"))
    try:
        await _sleep(1.0)
        idle = await rss(server)
        engines = [
            Socket(reactor, f"ws://127.0.0.1:{port}/rp-engine/socket", ORIGIN)
            for _ in range(CONNECTIONS)
        ]
        await gatherResults([Deferred.fromCoroutine(e.opened()) for e in engines])
        await _sleep(0.5)
        withEngines = await rss(server)
        for engine in engines:
            engine.close()
        await _sleep(0.5)
        base = await rss(server)
        clients = []
        readies = []
        for _ in range(CONNECTIONS):
            client = Socket(reactor, f"ws://127.0.0.1:{port}/client/socket", None)
            readies.append(client.next(ofType("ready")))
            clients.append(client)
        await gatherResults(readies)
        await _sleep(0.5)
        withClients = await rss(server)
        for client in clients:
            client.close()
        return idle, withEngines - idle, withClients - base
    finally:
        await server.stop()


async def run(reactor: Any, quick: bool = False) -> Section:
    idle, engines, clients = await idleConnections(reactor)
    seconds = 20.0
    readIdle, readPeak, _ = await ceiling(reactor, reads=True, seconds=seconds)
    slowIdle, slowPeak, cancels = await ceiling(reactor, reads=False, seconds=seconds)
    rows = [
        ("idle middleware (default chain, both endpoints)", f"{idle / 1024:.1f} MiB"),
        ("per idle RPEngine connection", f"{engines / CONNECTIONS:.1f} KiB"),
        ("per idle client", f"{clients / CONNECTIONS:.1f} KiB"),
        (
            "peak over idle: a client that reads a 5 min reply sent at full speed",
            f"{(readPeak - readIdle) / 1024:.1f} MiB",
        ),
        (
            "peak over idle: a client that never reads, the same reply",
            f"{(slowPeak - slowIdle) / 1024:.1f} MiB",
        ),
    ]
    body = f"""
Resident set size of the middleware process (`VmRSS`), median of three readings; per-connection
figures from {CONNECTIONS} connections opened at once. The last two rows sample the RSS every
50 ms for up to {seconds:g} s while RPEngine sends a 5 min spoken reply (3000 chunks of 100 ms,
35 MB of base64) as fast as it can: to a client that reads, and to one that stopped reading
after asking (default `[client]` bounds: 2 MiB soft, 8 MiB hard, 10 s grace). For the second,
RPEngine was asked to cancel the turn {cancels} time(s).

{table(["measure", "value"], rows)}
"""
    return Section("Memory (benchmark 6)", body)
