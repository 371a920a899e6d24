"""
The floor the hop benchmark measures against: a bare Autobahn relay.

One "engine" and any number of "clients" connect (by path); every message
from the engine is parsed, one field changed (C{type}), serialised and sent
to every client, and every message from a client the same way to the
engine.  No validation, no plugins, no sessions: what any relay written on
Autobahn and the json module costs at least.
"""

from __future__ import annotations

import json
from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionRequest
from twisted.internet.interfaces import ITCPTransport

#: The one field the relay changes, engine type -> client type.
RENAMED = {"reply.text.delta": "llm-chunk", "reply.audio.chunk": "tts-chunk"}


class RelayProtocol(WebSocketServerProtocol):
    factory: RelayFactory
    role = "client"

    def connectionMade(self) -> None:
        super().connectionMade()
        tcp = ITCPTransport(self.transport, None)
        if tcp is not None:
            tcp.setTcpNoDelay(True)

    def onConnect(self, request: ConnectionRequest) -> None:
        self.role = "engine" if request.path.startswith("/rp-engine") else "client"

    def onOpen(self) -> None:
        if self.role == "engine":
            self.factory.engine = self
        else:
            self.factory.clients.add(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        message = json.loads(payload)
        kind = message.get("type")
        message["type"] = RENAMED.get(kind, kind)
        out = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if self.role == "engine":
            for client in self.factory.clients:
                client.sendMessage(out, isBinary=False)
        elif self.factory.engine is not None:
            self.factory.engine.sendMessage(out, isBinary=False)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if self.factory.engine is self:
            self.factory.engine = None
        self.factory.clients.discard(self)


class RelayFactory(WebSocketServerFactory):
    protocol = RelayProtocol  # type: ignore[assignment]

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor=reactor)
        self.setProtocolOptions(
            maxMessagePayloadSize=8 * 1024 * 1024, maxFramePayloadSize=8 * 1024 * 1024
        )
        self.engine: RelayProtocol | None = None
        self.clients: set[RelayProtocol] = set()


def startRelay(reactor: Any) -> int:
    """
    Listen on a free loopback port; returns the port.
    """
    port = reactor.listenTCP(0, RelayFactory(reactor), interface="127.0.0.1")
    return int(port.getHost().port)
