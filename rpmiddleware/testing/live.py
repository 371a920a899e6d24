"""
Real loopback listeners and WebSocket peers for end-to-end tests.

Everything listens on 127.0.0.1 port 0 and is torn down by the test's
cleanups, so tests run in parallel and leave nothing behind.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    connectWS,
)
from twisted.internet.defer import Deferred, DeferredQueue, inlineCallbacks
from twisted.internet.interfaces import ITCPTransport
from twisted.python.failure import Failure

from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.daemon.service import makeMiddlewareService
from rpmiddleware.plugin.interfaces import IEnvelopePlugin


class LiveMiddleware:
    """
    A middleware listening on a real loopback port.
    """

    def __init__(self, reactor: Any, settings: Settings, middleware: Middleware) -> None:
        settings.server.port = 0
        self.reactor = reactor
        self.settings = settings
        self.service, self.middleware = makeMiddlewareService(reactor, settings, middleware)
        self.service.privilegedStartService()
        self.service.startService()
        self.listener: Any = self.service.getServiceNamed("listener")
        self.port: int = self.listener.port.getHost().port
        settings.server.port = self.port

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def stop(self) -> Deferred[Any]:
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        for factory in self.factories():
            for connection in list(factory.connections):
                connection.dropConnection(abort=True)
        await self.service.stopService()

    def factories(self) -> list[Any]:
        return list(self.listener.factories.values())


def startMiddleware(
    reactor: Any,
    settings: Settings | None = None,
    plugins: Sequence[IEnvelopePlugin] = (),
    middleware: Middleware | None = None,
) -> LiveMiddleware:
    """
    Start a middleware with C{plugins} on a free loopback port.
    """
    settings = settings or Settings()
    if middleware is None:
        middleware = Middleware(reactor, settings, list(plugins))
    return LiveMiddleware(reactor, settings, middleware)


class TestClientProtocol(WebSocketClientProtocol):
    factory: TestClientFactory

    def connectionMade(self) -> None:
        super().connectionMade()
        tcp = ITCPTransport(self.transport, None)
        if tcp is not None:
            tcp.setTcpNoDelay(True)

    def onOpen(self) -> None:
        self.factory.peer = self
        if not self.factory.opened.called:
            self.factory.opened.callback(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.messages.put(json.loads(payload) if not isBinary else payload)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.closeCode = code
        self.factory.closeReason = reason
        if not self.factory.opened.called:
            self.factory.opened.errback(
                Failure(ConnectionError(f"closed before opening: {code} {reason}"))
            )
        if not self.factory.closed.called:
            self.factory.closed.callback((code, reason))


class TestClientFactory(WebSocketClientFactory):
    protocol = TestClientProtocol  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opened: Deferred[TestClientProtocol] = Deferred()
        self.closed: Deferred[tuple[int | None, str | None]] = Deferred()
        self.messages: DeferredQueue[Any] = DeferredQueue()
        self.peer: TestClientProtocol | None = None
        self.closeCode: int | None = None
        self.closeReason: str | None = None
        self.setProtocolOptions(
            maxMessagePayloadSize=16 * 1024 * 1024, maxFramePayloadSize=16 * 1024 * 1024
        )

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        if not self.opened.called:
            self.opened.errback(reason)
        if not self.closed.called:
            self.closed.callback((None, str(reason.value)))


class TestClient:
    """
    A WebSocket peer for tests: send JSON, await the next message, await close.
    """

    def __init__(self, factory: TestClientFactory) -> None:
        self.factory = factory

    @property
    def opened(self) -> Deferred[TestClientProtocol]:
        return self.factory.opened

    @property
    def closed(self) -> Deferred[tuple[int | None, str | None]]:
        return self.factory.closed

    def send(self, message: Any) -> None:
        assert self.factory.peer is not None
        if isinstance(message, bytes):
            self.factory.peer.sendMessage(message, isBinary=False)
        else:
            self.factory.peer.sendMessage(json.dumps(message).encode("utf-8"), isBinary=False)

    def next(self) -> Deferred[Any]:
        return self.factory.messages.get()

    @inlineCallbacks
    def nextOfType(self, *types: str):  # type: ignore[no-untyped-def]
        """
        The next message whose type is one of C{types}, skipping others.
        """
        while True:
            message = yield self.next()
            if isinstance(message, dict) and message.get("type") in types:
                return message

    def close(self) -> Deferred[tuple[int | None, str | None]]:
        if self.factory.peer is not None and not self.closed.called:
            self.factory.peer.sendClose()
        return self.closed

    def drop(self) -> None:
        if self.factory.peer is not None:
            self.factory.peer.dropConnection(abort=True)


def connectClient(
    reactor: Any, url: str, origin: str | None = None, headers: dict[str, str] | None = None
) -> TestClient:
    """
    Connect a L{TestClient}; await C{client.opened} before sending.
    """
    factory = TestClientFactory(url, origin=origin, headers=headers, reactor=reactor)
    connectWS(factory)
    return TestClient(factory)
