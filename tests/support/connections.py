"""
Client connections without sockets: a fake client writer that keeps what
was sent as JSON, and L{OpenConnections}, connections of a client endpoint
on a Clock as the router bridges look them up.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock

from rpmiddleware.client.connection import ClientConnection

PORT = 38471


class FakeClientWriter:
    """
    A client connection's transport: what was sent, as JSON.
    """

    port = PORT

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.closedWith: tuple[int, str] | None = None

    def sendText(self, payload: bytes) -> None:
        self.raw.append(payload)
        self.sent.append(json.loads(payload))

    def backlog(self) -> int:
        return 0

    def closeConnection(self, code: int, reason: str) -> None:
        self.closedWith = (code, reason)

    def pauseReading(self) -> None:
        pass

    def resumeReading(self) -> None:
        pass

    def statuses(self) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == "status"]


class OpenConnections:
    """
    Connections of a client endpoint on a Clock, with fake writers; called,
    it lists the open ones, as the router bridges look them up.
    """

    def __init__(self, endpoint: Any, clock: Clock) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.open: list[ClientConnection] = []

    def __call__(self) -> list[ClientConnection]:
        return self.open

    def connect(self) -> tuple[ClientConnection, FakeClientWriter]:
        writer = FakeClientWriter()
        connection = ClientConnection(self.endpoint, writer, "tcp4:127.0.0.1:5000")
        connection.opened()
        self.open.append(connection)
        return connection, writer

    def say(self, connection: ClientConnection, **message: Any) -> None:
        connection.received(json.dumps(message).encode("utf-8"), False)
        self.clock.advance(0)
