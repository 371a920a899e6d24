"""
A middleware and a simulated RPEngine joined with no transport, on one
clock: for tests of plugins and games that want RPEngine's real answers
(every envelope written and read as JSON text, as on the wire) without a
socket or real time.

    clock = Clock()
    middleware = Middleware.fromSettings(clock, Settings())
    engine = connectInMemory(middleware, clock)
    stream = middleware.requestReply("mira", text="Hello", card=exampleCard())
    clock.advance(5)
    engine.engine.invocations[-1].history   # what the model was given

With C{latency}, every message takes that long each way, in order, as over a
real connection: a test of what happens between a message and its answer
(a cancel and RPEngine's C{reply.cancelled}) sees that time pass.
"""

from __future__ import annotations

import json
from typing import Any

from rpmiddleware.testing.simengine import SimulatedEngine
from rpmiddleware.testing.simoptions import SimulatorOptions


class InMemoryEngine:
    """
    @ivar engine: the L{SimulatedEngine}.
    @ivar session: the middleware's L{rpmiddleware.engine.session.EngineSession}.
    """

    def __init__(
        self,
        middleware: Any,
        clock: Any,
        options: SimulatorOptions | None,
        latency: float = 0.0,
    ) -> None:
        self.open = True
        self.clock = clock
        self.latency = latency
        self.engine = SimulatedEngine(self._toMiddleware, clock, options)
        self.session = middleware.newEngineSession(self, peer="in-memory")
        self.engine.transportDisconnect = self.disconnect
        self.engine.connected()

    # The middleware's writer.

    def sendText(self, payload: bytes) -> None:
        if self.latency > 0:
            self.clock.callLater(self.latency, self._toEngine, payload)
        else:
            self._toEngine(payload)

    def _toEngine(self, payload: bytes) -> None:
        if self.open:
            self.engine.receivedFrame(payload)

    def close(self, code: int, reason: str) -> None:
        self.disconnect()

    # The engine's.

    def _toMiddleware(self, fields: dict[str, Any]) -> None:
        text = json.dumps(fields)
        if self.latency > 0:
            self.clock.callLater(self.latency, self._received, text)
        else:
            self._received(text)

    def _received(self, text: str) -> None:
        if self.open:
            self.session.received(json.loads(text))

    def disconnect(self) -> None:
        """RPEngine's tab closes: both sides see the connection end."""
        if self.open:
            self.open = False
            self.session.connectionLost()
            self.engine.disconnected()


def connectInMemory(
    middleware: Any, clock: Any, options: SimulatorOptions | None = None, latency: float = 0.0
) -> InMemoryEngine:
    """
    Connect a simulated RPEngine to C{middleware}; it says C{hello} at once
    (after C{latency}, the time each message takes each way).
    """
    return InMemoryEngine(middleware, clock, options, latency)
