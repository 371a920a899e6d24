"""
The WebSocket face of the engine endpoint: bytes in, decoded JSON to the
L{EngineSession}; the session's writes out as text frames.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.config.settings import Settings
from rpmiddleware.engine.session import EngineSession, decodeText
from rpmiddleware.protocol.messages import ProtocolViolation
from rpmiddleware.web.websocket import GuardedServerFactory, GuardedServerProtocol


class EngineProtocol(GuardedServerProtocol):
    factory: EngineFactory
    session: EngineSession | None = None

    def onOpen(self) -> None:
        super().onOpen()
        self.session = self.factory.middleware.newEngineSession(self, str(self.peer))

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        session = self.session
        if session is None:
            return
        if isBinary:
            session.invalid("binary frames are not part of the protocol; send JSON text")
            return
        text = self.textOf(payload)
        if text is None:
            return
        try:
            fields = decodeText(text)
        except ProtocolViolation as e:
            session.invalid(e.reason)
            return
        session.received(fields)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        super().onClose(wasClean, code, reason)
        if self.session is not None:
            self.session.connectionLost()

    # MessageWriter, for the session.

    def sendText(self, payload: bytes) -> None:
        if self.state != self.STATE_OPEN:
            # Closing: Autobahn would raise.  The session keeps what it sent
            # unacknowledged, so the link sends it again in the next session.
            return
        self.sendMessage(payload, isBinary=False)

    def close(self, code: int, reason: str) -> None:
        self.sendClose(code, reason)


class EngineFactory(GuardedServerFactory):
    protocol = EngineProtocol  # type: ignore[assignment]

    def __init__(self, reactor: Any, middleware: Any, settings: Settings) -> None:
        server = settings.server
        super().__init__(
            reactor,
            allowedOrigins=server.engineOrigins(),
            allowMissingOrigin=False,
            maxMessageBytes=server.max_message_bytes,
            connectionLimit=server.max_connections,
            endpointName="/rp-engine/socket",
        )
        self.middleware = middleware
