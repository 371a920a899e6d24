"""
A faithful RPEngine simulator: the browser app's side of protocol v3.

RPEngine cannot run in tests, benchmarks or a plugin author's sandbox, so
this plays it: it connects to the game side's WebSocket listener as RPEngine
does (same path, same Origin header), says C{hello}, and then acknowledges,
validates, queues and answers requests with streamed text and synthetic
speech as RPEngine's core does (crates/rp-engine-core/src/app.rs).  The
protocol logic is L{SimulatedEngine}, which has no transport; this module
adds the Autobahn client around it.

    engine = yield connectSimulator(reactor, 38471)
    ...
    engine.disconnect()          # RPEngine goes away mid-turn
    yield engine.closed
"""

from __future__ import annotations

import json
from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionClosed
from twisted.internet.interfaces import IConnector, IReactorTCP, IReactorTime, ITCPTransport
from twisted.python.failure import Failure

from rpmiddleware.testing.simengine import SimulatedEngine
from rpmiddleware.testing.simoptions import (
    CLIENT_VERSION,
    PlayerTake,
    SimulatorOptions,
    defaultReplyText,
)

__all__ = [
    "CLIENT_VERSION",
    "DEFAULT_PATH",
    "MAX_PAYLOAD",
    "ConnectionClosedBeforeWelcome",
    "PlayerTake",
    "SimulatedEngine",
    "SimulatorFactory",
    "SimulatorOptions",
    "SimulatorProtocol",
    "connectSimulator",
    "defaultReplyText",
]

DEFAULT_PATH = "/rp-engine/socket"
#: Frame and message limit of the simulator's client.  Set explicitly so a
#: test of the game side's 8 MiB limit fails on the game side, not here, and
#: a larger frame from the game reaches the engine's own 8 MiB check.
MAX_PAYLOAD = 16 * 1024 * 1024


class ConnectionClosedBeforeWelcome(ConnectionClosed):
    """
    The game side closed the connection before it answered C{hello}.
    """


class SimulatorProtocol(WebSocketClientProtocol):
    """
    One RPEngine connection: JSON text frames in and out of a
    L{SimulatedEngine} created when the WebSocket opens.
    """

    factory: SimulatorFactory
    engine: SimulatedEngine | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        # Autobahn only tries, with its own option; streamed deltas and audio
        # chunks are small writes that Nagle's algorithm would hold back.
        tcp = ITCPTransport(self.transport, None)
        if tcp is not None:
            tcp.setTcpNoDelay(True)

    def onOpen(self) -> None:
        engine = SimulatedEngine(self._sendFields, self.factory.clock, self.factory.options)
        engine.transportDisconnect = self._drop
        engine.carrier = self
        self.engine = engine
        self.factory.engineStarted(engine)
        engine.connected()

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        engine = self.engine
        if engine is None:
            return
        if isBinary:
            # The browser reads a binary frame as text that is not JSON.
            engine.undecodable("binary frames are not part of the protocol")
            return
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as e:
            engine.undecodable(f"not UTF-8 text: {e}")
            return
        engine.receivedFrame(text)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if self.engine is not None:
            self.engine.disconnected()
        self.factory.connectionEnded(code, reason)

    def _sendFields(self, fields: dict[str, Any]) -> None:
        if self.state != self.STATE_OPEN:
            return
        payload = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
        self.sendMessage(payload.encode("utf-8"), isBinary=False)

    def _drop(self) -> None:
        self.dropConnection(abort=True)


class SimulatorFactory(WebSocketClientFactory):
    """
    Connects one simulated RPEngine; C{welcomed} fires with its engine once
    the game side has answered C{hello}, or fails if the connection is
    refused or closed first.
    """

    protocol = SimulatorProtocol  # type: ignore[assignment]

    def __init__(
        self,
        url: str,
        reactor: IReactorTCP,
        options: SimulatorOptions,
        origin: str,
    ) -> None:
        super().__init__(url, origin=origin, reactor=reactor)
        self.clock = IReactorTime(reactor)
        self.options = options
        self.setProtocolOptions(maxMessagePayloadSize=MAX_PAYLOAD, maxFramePayloadSize=MAX_PAYLOAD)
        self.engine: SimulatedEngine | None = None
        self.welcomed: Deferred[SimulatedEngine] = Deferred()

    def engineStarted(self, engine: SimulatedEngine) -> None:
        self.engine = engine
        engine.welcomed.addCallback(self._welcomed)

    def _welcomed(self, engine: SimulatedEngine) -> SimulatedEngine:
        if not self.welcomed.called:
            self.welcomed.callback(engine)
        return engine

    def connectionEnded(self, code: int | None, reason: str | None) -> None:
        if not self.welcomed.called:
            self.welcomed.errback(
                ConnectionClosedBeforeWelcome(f"closed before welcome: {code} {reason}")
            )

    def clientConnectionFailed(self, connector: IConnector, reason: Failure) -> None:
        if not self.welcomed.called:
            self.welcomed.errback(reason)


def connectSimulator(
    reactor: IReactorTCP,
    port: int,
    options: SimulatorOptions | None = None,
    host: str = "127.0.0.1",
    path: str = DEFAULT_PATH,
    origin: str | None = None,
) -> Deferred[SimulatedEngine]:
    """
    Connect a simulated RPEngine to the game side listening on C{port}.

    @param reactor: provides L{IReactorTCP} and L{IReactorTime} (the latter
        paces the simulated streams).
    @param origin: the Origin header; C{options.origin} (RPEngine's
        production origin) by default.
    @return: fires with the L{SimulatedEngine} once C{welcome} arrived.
    """
    options = options if options is not None else SimulatorOptions()
    factory = SimulatorFactory(
        f"ws://{host}:{port}{path}", reactor, options, origin or options.origin
    )
    reactor.connectTCP(host, port, factory)
    return factory.welcomed
