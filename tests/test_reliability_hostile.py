"""
Hostile peers on the engine endpoint, over real loopback sockets: slowloris
upgrade requests, connections that never speak, more connections than the
limit, messages at the 8 MiB limit and one byte over (whole and in
fragments), invalid UTF-8 and WebSocket framing violations.  Each gets its
defined answer and the daemon goes on serving RPEngine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred, DeferredList, gatherResults
from twisted.internet.task import deferLater
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import LogEvent, globalLogPublisher
from twisted.trial.unittest import TestCase

from rpmiddleware.config.settings import Settings
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.live import LiveMiddleware, TestClient, connectClient, startMiddleware
from tests.support.client import sendCapacityAndWait, whenRouted
from tests.support.rawpeer import RawPeer, cancelBucketTimers, rawConnect, whenGone

PRODUCTION = "https://rpengine.gemtavern.com"
LIMIT = 8 * 1024 * 1024


def upgradeRequest(port: int, path: str = "/rp-engine/socket") -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n"
        f"Origin: {PRODUCTION}\r\n"
        "\r\n"
    ).encode("ascii")


def whenGoneD(connection: Any) -> Deferred[None]:
    return Deferred.fromCoroutine(whenGone(connection))


def headerDrops(events: Sequence[LogEvent]) -> list[LogEvent]:
    """
    The log events of connections dropped at the header deadline.
    """
    return [e for e in events if str(e.get("log_format", "")).startswith("dropped {peer}: no ")]


class HostileTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.addCleanup(cancelBucketTimers)
        self.settings = Settings()
        self.settings.server.max_connections = 8
        self.settings.server.hello_timeout = 30.0
        self.live: LiveMiddleware = startMiddleware(reactor, self.settings)
        self.addCleanup(self.live.stop)
        self.site: Any = self.live.listener.site

    def connect(self, origin: str | None = PRODUCTION) -> TestClient:
        client = connectClient(reactor, self.live.url("/rp-engine/socket"), origin=origin)
        self.addCleanup(client.drop)
        return client

    async def handshake(self) -> tuple[TestClient, Any]:
        client = self.connect()
        await client.opened
        client.send(Envelope.build("hello").fields)
        welcome = await client.next()
        session = self.live.middleware.link.session
        assert session is not None and session.sessionId == welcome["sessionId"]
        return client, session

    async def stillServes(self) -> None:
        """
        A new RPEngine still gets a session and can use it.
        """
        client, session = await self.handshake()
        await sendCapacityAndWait(self.live.middleware, client, session.sessionId)
        await client.close()

    def test_slowloris(self) -> Deferred[None]:
        """
        An upgrade request trickled in a byte at a time is dropped at the
        header deadline, though every byte came well within the idle timeout;
        it never becomes a WebSocket.  Meanwhile RPEngine connects normally.
        """
        self.site.headerTimeout = 0.3
        events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)

        async def run() -> None:
            peers = [await rawConnect(self.live.port) for _ in range(5)]
            request = upgradeRequest(self.live.port)
            sent = 0
            while sent < len(request) and not all(p.lost.called for p in peers):
                for peer in peers:
                    if not peer.lost.called:
                        peer.write(request[sent : sent + 1])
                sent += 1
                if sent == 3:
                    await self.stillServes()
                await deferLater(reactor, 0.02, lambda: None)
            await gatherResults([p.lost for p in peers])
            self.assertLess(sent, len(request))
            # Each was dropped by the header deadline, not by anything else.
            self.assertEqual(len(headerDrops(events)), len(peers))
            for peer in peers:
                self.assertNotIn(b"101", peer.received)
            self.assertEqual(len(self.live.factories()[0].connections), 0)
            await self.stillServes()

        return Deferred.fromCoroutine(run())

    def test_silentConnections(self) -> Deferred[None]:
        """
        Many TCP connections that never send a byte are all dropped at the
        header deadline.
        """
        self.site.headerTimeout = 0.3
        events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)

        async def run() -> None:
            peers = await gatherResults([Deferred.fromCoroutine(self._raw()) for _ in range(50)])
            await gatherResults([p.lost for p in peers])
            # Each was dropped by the header deadline, not by anything else.
            self.assertEqual(len(headerDrops(events)), 50)
            self.assertEqual([p.received for p in peers], [b""] * 50)
            await self.stillServes()

        return Deferred.fromCoroutine(run())

    async def _raw(self) -> RawPeer:
        return await rawConnect(self.live.port)

    def test_fullUpgradeInTimeStillWorks(self) -> Deferred[None]:
        """
        A slow but complete upgrade inside the deadline is served.
        """
        self.site.headerTimeout = 2.0

        async def run() -> None:
            peer = await rawConnect(self.live.port)
            request = upgradeRequest(self.live.port)
            for offset in range(0, len(request), 40):
                peer.write(request[offset : offset + 40])
                await deferLater(reactor, 0.02, lambda: None)
            await peer.whenReceived(b"\r\n\r\n")
            self.assertTrue(peer.received.startswith(b"HTTP/1.1 101"), peer.received[:80])
            peer.close()

        return Deferred.fromCoroutine(run())

    def test_connectionLimit(self) -> Deferred[None]:
        """
        With max_connections = 8, forty upgrades at once: exactly eight are
        served, the rest get HTTP 503 with a reason that says why; when one
        leaves, a newcomer is served.
        """

        async def run() -> None:
            clients = [self.connect() for _ in range(40)]
            outcomes = await gatherResults(
                [c.opened.addCallbacks(lambda _: "open", lambda f: "refused") for c in clients]
            )
            self.assertEqual(outcomes.count("open"), 8)
            self.assertEqual(outcomes.count("refused"), 32)
            self.assertEqual(len(self.live.factories()[0].connections), 8)
            response = await treq.get(
                self.live.url("/rp-engine/socket").replace("ws:", "http:"),
                headers={  # type: ignore[arg-type]
                    "Origin": PRODUCTION,
                    "Upgrade": "websocket",
                    "Connection": "Upgrade",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Version": "13",
                },
                persistent=False,
            )
            self.assertEqual(response.code, 503)
            self.assertIn(b"connections", response.phrase)
            await response.content()
            opened = [c for c, o in zip(clients, outcomes, strict=True) if o == "open"]
            servers = list(self.live.factories()[0].connections)
            left = DeferredList([whenGoneD(s) for s in servers], fireOnOneCallback=True)
            await opened[0].close()
            await left
            self.assertEqual(len(self.live.factories()[0].connections), 7)
            newcomer = self.connect()
            await newcomer.opened
            self.assertEqual(len(self.live.factories()[0].connections), 8)

        return Deferred.fromCoroutine(run())

    def test_validEnvelopeOfExactlyEightMiBFragmented(self) -> Deferred[None]:
        """
        A real envelope of exactly 8 MiB, sent in 64 KiB fragments, is
        delivered whole; one byte more closes that connection with 1009 and
        the next RPEngine is served.
        """

        async def run() -> None:
            client, session = await self.handshake()
            seen: list[Envelope] = []
            stop = self.live.middleware.router.observe(seen.append)
            self.addCleanup(stop)
            delivered = whenRouted(self.live.middleware, "reply.text.delta")
            fields = Envelope.build(
                "reply.text.delta", session.sessionId, requestId="big", sequence=0, delta=""
            ).fields
            overhead = len(Envelope(fields).toBytes())
            fields["delta"] = "x" * (LIMIT - overhead)
            payload = Envelope(fields).toBytes()
            self.assertEqual(len(payload), LIMIT)
            assert client.factory.peer is not None
            client.factory.peer.sendMessage(payload, isBinary=False, fragmentSize=65536)
            await delivered
            self.assertEqual(len(seen[0]["delta"]), LIMIT - overhead)
            self.assertFalse(client.closed.called)
            fields["delta"] += "x"
            fields["messageId"] = fields["messageId"][::-1]
            over = Envelope(fields).toBytes()
            self.assertEqual(len(over), LIMIT + 1)
            client.factory.peer.sendMessage(over, isBinary=False, fragmentSize=65536)
            code, _ = await client.closed
            self.assertEqual(code, 1009)
            self.assertEqual(len(seen), 1)
            await self.stillServes()

        return Deferred.fromCoroutine(run())

    def test_oneFrameOverLimitUnfragmented(self) -> Deferred[None]:
        async def run() -> None:
            client, _ = await self.handshake()
            assert client.factory.peer is not None
            client.factory.peer.sendMessage(b"{" + b" " * (LIMIT - 1), isBinary=False)
            self.assertFalse(client.closed.called)
            client.factory.peer.sendMessage(b"{" + b" " * LIMIT, isBinary=False)
            code, _ = await client.closed
            self.assertEqual(code, 1009)
            await self.stillServes()

        return Deferred.fromCoroutine(run())

    def test_invalidUtf8Text(self) -> Deferred[None]:
        """
        A text frame that is not UTF-8 is what RFC 6455 answers with 1007
        (binary frames carrying the same bytes are merely dropped: the
        fuzzer sends those), on either endpoint: stray bytes, and a UTF-16
        surrogate encoded as if it were a character, which Python's JSON
        reader would take from bytes.  Nothing after it is read.
        """

        async def run() -> None:
            for path, bad in [
                ("/rp-engine/socket", b'{"a":"\xff\xfe"}'),
                ("/rp-engine/socket", b'{"a":"\xed\xa0\x80"}'),
                ("/client/socket", b'{"type":"ping","timestamp":1,"x":"\xed\xa0\x80"}'),
            ]:
                if path == "/rp-engine/socket":
                    client, session = await self.handshake()
                else:
                    client = connectClient(reactor, self.live.url(path))
                    self.addCleanup(client.drop)
                    await client.opened
                    self.assertEqual((await client.next())["type"], "ready")
                assert client.factory.peer is not None
                client.factory.peer.sendMessage(bad, isBinary=False)
                client.factory.peer.sendMessage(b'{"type":"ping","timestamp":2}', isBinary=False)
                code, reason = await client.closed
                self.assertEqual(code, 1007, path)
                self.assertIn("not UTF-8", reason)
                if path == "/client/socket":
                    pending = client.factory.messages.pending
                    self.assertNotIn("pong", [m.get("type") for m in pending])
                await self.stillServes()

        return Deferred.fromCoroutine(run())

    def test_framingViolations(self) -> Deferred[None]:
        """
        Reserved opcodes, reserved bits and a ping too big for a control
        frame each close that connection with 1002 (protocol error).
        """

        async def run() -> None:
            for opcode, rsv, payload in ((3, 0, b"x"), (1, 4, b"{}"), (9, 0, b"p" * 200)):
                client, _ = await self.handshake()
                assert client.factory.peer is not None
                client.factory.peer.sendFrame(opcode, payload, rsv=rsv)
                code, _ = await client.closed
                self.assertEqual(code, 1002, (opcode, rsv))
            await self.stillServes()

        return Deferred.fromCoroutine(run())
