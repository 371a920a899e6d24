"""
The floor the hop benchmark measures against: a bare Autobahn relay.

One "engine" and any number of "clients" connect (by path); every message
from the engine is parsed, one field changed (C{type}), serialised and sent
to the client whose C{text} opened its turn (or to every client when none
did), and every message from a client the same way to the engine, a
C{text} as the C{reply.request} it asks for.  No validation, no plugins, no
sessions: what any relay written on Autobahn and the json module costs at
least.
"""

from __future__ import annotations

import json
from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionRequest
from twisted.internet.interfaces import ITCPTransport

#: The one field the relay changes, engine type -> client type.
RENAMED = {
    "reply.text.delta": "llm-chunk",
    "reply.audio.chunk": "tts-chunk",
    "reply.completed": "reply-complete",
}


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
        if self.role == "engine":
            self.factory.fromEngine(message)
        else:
            self.factory.fromClient(self, message)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if self.factory.engine is self:
            self.factory.engine = None
        self.factory.clients.discard(self)


def _dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class RelayFactory(WebSocketServerFactory):
    """
    Routes by requestId when a client's C{text} opened the turn (the load
    benchmark's players), else sends every engine message to every client
    (the hop benchmark's one client).
    """

    protocol = RelayProtocol  # type: ignore[assignment]

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor=reactor)
        self.setProtocolOptions(
            maxMessagePayloadSize=8 * 1024 * 1024, maxFramePayloadSize=8 * 1024 * 1024
        )
        self.engine: RelayProtocol | None = None
        self.clients: set[RelayProtocol] = set()
        #: requestId -> the client whose text opened it.
        self.turns: dict[str, RelayProtocol] = {}
        self.opened = 0

    def fromEngine(self, message: dict[str, Any]) -> None:
        kind: Any = message.get("type")
        if kind == "ack":
            return  # for the relay itself, which keeps nothing to resend
        message["type"] = RENAMED.get(kind, kind)
        requestId: Any = message.get("requestId")
        client = self.turns.get(requestId) if isinstance(requestId, str) else None
        if client is None:
            out = _dumps(message)
            for each in self.clients:
                each.sendMessage(out, isBinary=False)
            return
        if kind == "reply.completed":
            del self.turns[requestId]
        message["turnId"] = requestId
        if client.state == client.STATE_OPEN:  # not one leaving at the end of a run
            client.sendMessage(_dumps(message), isBinary=False)

    def fromClient(self, client: RelayProtocol, message: dict[str, Any]) -> None:
        if self.engine is None:
            return
        if message.get("type") == "text":
            # A typed turn: the request a middleware would make, at least.
            self.opened += 1
            requestId = f"relay-{self.opened}"
            self.turns[requestId] = client
            message = {
                "type": "reply.request",
                "messageId": requestId,
                "requestId": requestId,
                "event": {"text": message.get("text")},
            }
        self.engine.sendMessage(_dumps(message), isBinary=False)


def startRelay(reactor: Any) -> int:
    """
    Listen on a free loopback port; returns the port.
    """
    port = reactor.listenTCP(0, RelayFactory(reactor), interface="127.0.0.1")
    return int(port.getHost().port)
