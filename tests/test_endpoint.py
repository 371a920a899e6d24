"""
The engine endpoint over a real loopback socket: the handshake, and every
refusal the seed asks for (path, origin, size), with the daemon living on.
"""

from __future__ import annotations

import socket
from typing import Any

import treq
import txaio
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase, TestCase

from rpmiddleware.client.websocket import ClientProtocol
from rpmiddleware.config.settings import Settings
from rpmiddleware.engine.websocket import EngineProtocol
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import captureLogEvents
from rpmiddleware.testing.live import connectClient, startMiddleware
from tests.support.client import sendCapacityAndWait

PRODUCTION = "https://rpengine.gemtavern.com"


class EndpointTests(TestCase):
    timeout = 20

    def setUp(self) -> None:
        self.settings = Settings()
        self.live = startMiddleware(reactor, self.settings)
        self.addCleanup(self.live.stop)

    def connect(self, origin: str | None = PRODUCTION, path: str = "/rp-engine/socket") -> Any:
        client = connectClient(reactor, self.live.url(path), origin=origin)
        self.addCleanup(client.drop)
        return client

    @inlineCallbacks
    def handshake(self) -> Any:
        client = self.connect()
        yield client.opened
        client.send(Envelope.build("hello").fields)
        welcome = yield client.next()
        return client, welcome

    def delivered(self, client: Any, session: Any) -> Any:
        return sendCapacityAndWait(self.live.middleware, client, session.sessionId)

    @inlineCallbacks
    def test_handshake(self) -> Any:
        client, welcome = yield self.handshake()
        self.assertEqual(welcome["type"], "welcome")
        self.assertEqual(welcome["protocolVersion"], 3)
        self.assertTrue(self.live.middleware.link.connected)
        session = self.live.middleware.link.session
        assert session is not None
        self.assertEqual(session.sessionId, welcome["sessionId"])

    @inlineCallbacks
    def test_tcpNoDelay(self) -> Any:
        """
        TCP_NODELAY is really set on the server side of the connection.
        """
        yield self.handshake()
        [factory] = [f for f in self.live.factories() if f.connections]
        [connection] = factory.connections
        handle = connection.transport.getHandle()
        self.assertEqual(handle.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), 1)

    @inlineCallbacks
    def test_foreignOrigin(self) -> Any:
        client = self.connect(origin="https://evil.example")
        yield self.assertFailure(client.opened, ConnectionError, Exception)
        self.assertFalse(self.live.middleware.link.connected)

    @inlineCallbacks
    def test_foreignOriginIs403(self) -> Any:
        response = yield treq.get(
            self.live.url("/rp-engine/socket").replace("ws:", "http:"),
            headers={  # type: ignore[arg-type]
                "Origin": "https://evil.example",
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Version": "13",
            },
            persistent=False,
        )
        self.assertEqual(response.code, 403)
        yield response.content()

    @inlineCallbacks
    def test_missingOrigin(self) -> Any:
        client = self.connect(origin=None)
        yield self.assertFailure(client.opened, ConnectionError, Exception)

    @inlineCallbacks
    def test_devOrigin(self) -> Any:
        """
        The development origin is refused unless --dev is on.
        """
        client = self.connect(origin="http://127.0.0.1:5173")
        yield self.assertFailure(client.opened, ConnectionError, Exception)
        self.settings.server.dev = True
        dev = startMiddleware(reactor, self.settings)
        self.addCleanup(dev.stop)
        client = connectClient(
            reactor, dev.url("/rp-engine/socket"), origin="http://127.0.0.1:5173"
        )
        self.addCleanup(client.drop)
        yield client.opened

    @inlineCallbacks
    def test_unknownPath(self) -> Any:
        response = yield treq.get(
            self.live.url("/somewhere/else").replace("ws:", "http:"), persistent=False
        )
        self.assertEqual(response.code, 404)
        yield response.content()
        client = self.connect(path="/rp-engine/other")
        yield self.assertFailure(client.opened, ConnectionError, Exception)

    @inlineCallbacks
    def test_onlyTheExactPath(self) -> Any:
        """
        RPEngine connects to exactly /rp-engine/socket (json_core.rs
        loopback_endpoint); nothing below it is upgraded.
        """
        for path in ("/rp-engine/socket/", "/rp-engine/socket/..", "/client/socket/x"):
            response = yield treq.get(
                self.live.url(path).replace("ws:", "http:"),
                headers={  # type: ignore[arg-type]
                    "Origin": PRODUCTION,
                    "Upgrade": "websocket",
                    "Connection": "Upgrade",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Version": "13",
                },
                persistent=False,
            )
            self.assertEqual(response.code, 404, path)
            yield response.content()
        self.assertFalse(self.live.middleware.link.connected)

    @inlineCallbacks
    def test_alternateProductionOrigin(self) -> Any:
        """
        RPEngine's other production host name, which its own mock game
        admits (tools/mock-game/server.mjs), is admitted too.
        """
        client = self.connect(origin="https://rp-engine.gemtavern.com")
        yield client.opened
        client.send(Envelope.build("hello").fields)
        welcome = yield client.next()
        self.assertEqual(welcome["type"], "welcome")

    @inlineCallbacks
    def test_oversizedMessage(self) -> Any:
        """
        A message over 8 MiB closes that connection with 1009; another
        RPEngine connection can still be made and used.
        """
        client, _ = yield self.handshake()
        client.send(b'"' + b"x" * (8 * 1024 * 1024 + 1) + b'"')
        code, _ = yield client.closed
        self.assertEqual(code, 1009)
        again, welcome = yield self.handshake()
        self.assertEqual(welcome["type"], "welcome")

    @inlineCallbacks
    def test_exactlyAtLimit(self) -> Any:
        """
        A message of exactly 8 MiB is accepted (and, not being an envelope,
        dropped with a log line); the connection stays open.
        """
        client, _ = yield self.handshake()
        payload = b'"' + b"x" * (8 * 1024 * 1024 - 2) + b'"'
        self.assertEqual(len(payload), 8 * 1024 * 1024)
        client.send(payload)
        client.send(Envelope.build("hello").fields)
        # The repeated hello is dropped too; a valid message proves we are alive.
        session = self.live.middleware.link.session
        assert session is not None
        yield self.delivered(client, session)
        self.assertEqual(session.invalidDropped, 2)
        self.assertFalse(client.closed.called)

    @inlineCallbacks
    def test_malformedFrames(self) -> Any:
        client, _ = yield self.handshake()
        session = self.live.middleware.link.session
        assert session is not None
        client.send(b"{not json")
        client.factory.peer.sendMessage(b"\x00\x01", isBinary=True)
        yield self.delivered(client, session)
        self.assertEqual(session.invalidDropped, 2)
        self.assertFalse(client.closed.called)
        self.assertIs(self.live.middleware.link.session, session)


class FrameLogTests(SynchronousTestCase):
    """
    Autobahn logs every frame it sends at debug level through the protocol's
    C{log}.  With txaio's level at info (as twistd rpmiddleware sets it),
    that costs no log event on either endpoint; our own warnings still go out.
    """

    def test_debugIsQuiet(self) -> None:
        level = txaio.get_global_log_level()  # type: ignore[attr-defined]
        self.addCleanup(txaio.set_global_log_level, level)  # type: ignore[attr-defined]
        txaio.set_global_log_level("info")  # type: ignore[attr-defined]
        events = captureLogEvents(self)
        for protocol in (EngineProtocol(), ClientProtocol()):
            protocol.log.debug("{func} sent {data_len} bytes", func="sendData", data_len=12)
            protocol.log.warn("refused a connection: {reason}", reason="test")
        self.assertEqual([e["log_format"] for e in events], ["refused a connection: {reason}"] * 2)
