"""
The client endpoint under abuse and load, over real loopback sockets with
the default plugin chain and the simulated RPEngine: a fuzzer (every bad
frame answered with its defined error, the session alive), clients dropped
mid-turn (their turns cancelled upstream), a client that never reads
(cancelled, then closed; memory bounded; the others unaffected), and 200
clients x 5 turns, all complete.
"""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import struct
from collections import Counter
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import TestCase

from bench.clientfuzzing import KNOWN_CLIENT_FAULTS, fuzzClient
from bench.scenarios import clientLoad
from rpmiddleware.client.settings import ClientSettings
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import LiveMiddleware, TestClient, connectClient, startMiddleware
from rpmiddleware.testing.simoptions import defaultReplyText
from rpmiddleware.testing.simulator import SimulatedEngine, SimulatorOptions, connectSimulator
from tests.support.client import whenRouted
from tests.support.rawpeer import RawPeer, cancelBucketTimers, rawConnect, whenGone

#: See bench.clientfuzzing.KNOWN_CLIENT_FAULTS; test_knownWrongAnswers holds those
#: frames to the protocol as expected failures.
KNOWN_WRONG = KNOWN_CLIENT_FAULTS


def story(request: dict[str, Any]) -> str:
    event = request.get("event") or {}
    if "story" in str(event.get("text", "")):
        return "Once upon a time there was a ferry that crossed the bay. " * 60
    return defaultReplyText(request)


class ClientRig(TestCase):
    timeout = 120

    def setUp(self) -> None:
        self.addCleanup(cancelBucketTimers)
        self.settings = Settings()
        self.settings.server.max_connections = 256
        self.settings.client = ClientSettings()
        self.configure(self.settings)
        self.middleware = Middleware.fromSettings(reactor, self.settings)
        self.live: LiveMiddleware = startMiddleware(
            reactor, self.settings, middleware=self.middleware
        )
        self.addCleanup(self.live.stop)

    def configure(self, settings: Settings) -> None:
        pass

    async def engine(self, **options: Any) -> SimulatedEngine:
        options.setdefault("tokensPerSecond", None)
        options.setdefault("audioRealtime", False)
        engine = await connectSimulator(reactor, self.live.port, SimulatorOptions(**options))
        self.addCleanup(engine.disconnect)
        return engine

    async def client(self, modalities: list[str] | None = None) -> TestClient:
        client = connectClient(reactor, self.live.url("/client/socket"))
        self.addCleanup(client.drop)
        await client.opened
        ready = await client.next()
        self.assertEqual(ready["type"], "ready")
        client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
        if modalities is not None:
            client.send({"type": "configure", "output": {"modalities": modalities}})
        return client

    async def turn(self, client: TestClient, text: str) -> list[dict[str, Any]]:
        client.send({"type": "text", "text": text})
        seen = []
        while True:
            message = await client.next()
            if message.get("type") == "capacity":
                continue
            seen.append(message)
            if message["type"] in ("reply-complete", "tts-cancelled") or (
                message["type"] == "error" and message.get("turnId") is None
            ):
                return seen


class ClientFuzzTests(ClientRig):
    def test_fuzzClientEndpoint(self) -> Deferred[None]:
        """
        About two thousand random and malformed frames on one connection:
        each gets exactly the answer the protocol defines (error
        INVALID_MESSAGE, INVALID_AUDIO_FORMAT, SESSION_NOT_FOUND with its
        reconnect-ack, pong, attachments-ack, or nothing), in order, and the
        connection stays open.
        """

        async def run() -> None:
            report = await fuzzClient(reactor, self.live, frames=2000, seed=11, skip=KNOWN_WRONG)
            self.assertEqual(report.problems(), [], report.summary())
            self.assertFalse(report.closed)
            self.assertEqual(report.frames, 2000)
            self.assertGreater(report.answered["error"], 1000)
            self.assertGreater(len(report.kinds), 20)
            factory = self.live.listener.factories[b"/client/socket"]
            for connection in list(factory.connections):
                await whenGone(connection)
            self.assertEqual(factory.connections, set())

        return Deferred.fromCoroutine(run())

    def test_knownWrongAnswers(self) -> Deferred[None]:
        """
        The frames the fuzzer once found answered INTERNAL_ERROR (deep
        nesting, a list or object where a name belongs) get INVALID_MESSAGE.
        """

        async def run() -> None:
            client = await self.client()
            frames = [
                b'{"type":"ping","timestamp":1,"deep":' + b"[" * 100000 + b"]" * 100000 + b"}",
                b'{"type":"configure","output":{"voice":[]}}',
                b'{"type":"configure","inputLanguage":{"en":1}}',
            ]
            codes = []
            for payload in frames:
                client.send(payload)
                answer = await client.next()
                while answer["type"] == "capacity":
                    answer = await client.next()
                codes.append(answer.get("code"))
            self.assertEqual(codes, ["INVALID_MESSAGE"] * 3)

        return Deferred.fromCoroutine(run())


class ClientDropTests(ClientRig):
    def test_droppedMidTurnCancelsUpstream(self) -> Deferred[None]:
        """
        Twenty clients each start a long turn and vanish at a random point of
        it (before RPEngine took it, after its first text, after its first
        audio): RPEngine is told to cancel every turn it had, processes none
        of them to completion, and is free for the next client, whose turn
        completes.
        """
        rng = random.Random(20)

        async def run() -> None:
            engine = await self.engine(replyText=story, concurrency=4, queueLimit=32)
            cuts: Counter[str] = Counter()
            turnIds = []
            cancels = []
            for _ in range(20):
                client = await self.client()
                cut = rng.choice(["sent", "llm-chunk", "tts-chunk"])
                cuts[cut] += 1
                client.send({"type": "text", "text": "tell me a story"})
                if cut != "sent":
                    while True:
                        message = await client.next()
                        if message["type"] == cut:
                            turnIds.append(message["turnId"])
                            cancels.append(
                                whenRouted(self.middleware, "reply.cancelled", message["turnId"])
                            )
                            break
                client.drop()
                await client.closed
            # RPEngine answers each cancel; then its queue empties (it says
            # so with a capacity.update) unless it already has.
            await gatherResults(cancels)
            if engine.queueDepth != 0:
                await whenRouted(
                    self.middleware, "capacity.update", where=lambda e: e["queueDepth"] == 0
                )
            self.assertTrue(all(t in engine.cancelled for t in turnIds))
            self.assertEqual(engine.queueDepth, 0)
            self.assertTrue(all(cuts[c] >= 3 for c in cuts), cuts)
            accepted = {m["requestId"] for m in engine.sentOfType("reply.accepted")}
            self.assertTrue(set(turnIds) <= accepted)
            # Whatever RPEngine accepted was cancelled, none completed.
            self.assertEqual(set(engine.cancelled), accepted)
            self.assertEqual(engine.completed, [])
            self.assertEqual(engine.protocolErrors, [])
            messages = await self.turn(await self.client(), "and now?")
            self.assertEqual(messages[-1]["type"], "reply-complete")

        return Deferred.fromCoroutine(run())


def maskedTextFrame(payload: bytes) -> bytes:
    """
    One client-to-server WebSocket text frame (masked, as RFC 6455 requires).
    """
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x81, 0x80 | size)
    elif size < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def clientUpgrade(port: int) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /client/socket HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


class SlowClientTests(ClientRig):
    timeout = 150

    def configure(self, settings: Settings) -> None:
        settings.client.send_buffer_soft = 256 * 1024
        settings.client.send_buffer_hard = 1024 * 1024
        settings.client.slow_client_grace = 0.5

    def test_clientThatNeverReads(self) -> Deferred[None]:
        """
        A client that asks for a long spoken reply and never reads a byte:
        the bytes queued for it never pass the hard bound, its turn is
        cancelled upstream, its connection is closed, and a client that
        reads gets its own turn meanwhile.
        """

        async def run() -> None:
            engine = await self.engine(replyText=story, concurrency=4, queueLimit=32)
            peer: RawPeer = await rawConnect(self.live.port)
            self.addCleanup(peer.close)
            # A small receive buffer, so that what the kernel holds for the
            # peer is soon full and the bytes pile up in the middleware.
            assert peer.transport is not None
            handle = peer.transport.getHandle()  # type: ignore[attr-defined]
            handle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            peer.write(clientUpgrade(self.live.port))
            await peer.whenReceived(b"\r\n\r\n")
            self.assertTrue(peer.received.startswith(b"HTTP/1.1 101"))
            assert peer.transport is not None
            peer.transport.pauseProducing()  # type: ignore[attr-defined]
            character = {"type": "character", "characterId": "mira", "card": exampleCard()}
            peer.write(maskedTextFrame(json.dumps(character).encode()))
            peer.write(maskedTextFrame(b'{"type":"text","text":"tell me a story"}'))
            factory = self.live.listener.factories[b"/client/socket"]
            # The server opened it before it answered 101.
            [connection] = list(factory.connections)
            # And a small send buffer on the server's side: loopback's kernel
            # buffers grow to megabytes and would otherwise absorb the whole
            # reply, so the middleware's own backlog might never build.
            server = connection.transport.getHandle()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            # The backlog is highest right after a send (it only drains in
            # between), so measuring after each send finds its peak.
            peaks = [0]
            send, onClose = connection.sendText, connection.onClose
            closed: Deferred[None] = Deferred()

            def sendAndMeasure(payload: bytes) -> None:
                send(payload)
                peaks[0] = max(peaks[0], connection.backlog())

            def closing(*args: Any) -> None:
                onClose(*args)
                if not closed.called:
                    closed.callback(None)

            connection.sendText = sendAndMeasure
            connection.onClose = closing
            reader = await self.client()
            reader.send({"type": "text", "text": "hello"})
            # The peer does not read, so only the server side can tell that
            # the connection was dropped.
            await closed.addTimeout(90, reactor)
            peak = peaks[0]
            self.assertNotIn(connection, factory.connections, "the client was never dropped")
            self.assertTrue(connection.transport.disconnected)
            self.assertLess(peak, 1024 * 1024 + 256 * 1024)
            self.assertGreater(peak, 128 * 1024)
            [story_] = [m["requestId"] for m in engine.sentOfType("reply.accepted")][:1]
            self.assertIn(story_, engine.cancelled)
            messages: list[dict[str, Any]] = []
            while not messages or messages[-1]["type"] not in ("reply-complete", "tts-cancelled"):
                message = await reader.next()
                if message["type"] != "capacity":
                    messages.append(message)
            self.assertEqual(messages[-1]["type"], "reply-complete")

        return Deferred.fromCoroutine(run())


class LoadTests(ClientRig):
    def test_manyClientsFiveTurns(self) -> Deferred[None]:
        """
        50 clients at once, 5 text turns each, one simulated RPEngine: all
        250 turns complete, each client gets only its own replies, and
        RPEngine processes every turn once.  (The stress run does 200
        clients with speech.)
        """

        async def run() -> None:
            engine = await self.engine(concurrency=16, queueLimit=256)
            report = await clientLoad(reactor, self.live, engine, 50, 5, ["text"])
            self.assertEqual(report.problems(), [], report.summary())
            self.assertEqual(report.messages["reply-complete"], 250)

        return Deferred.fromCoroutine(run())
