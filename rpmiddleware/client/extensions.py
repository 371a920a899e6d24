"""
Plugins' messages to clients (L{rpmiddleware.clientext}): a router observer
that writes each L{TO_CLIENT <rpmiddleware.clientext.TO_CLIENT>} envelope's
message to the connection of its client session.

A session with no open connection here (between a disconnect and its
reconnect, or the Python API's C{"api"}) is not this endpoint's to serve: the
message is dropped, as the playbook's are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.client.surface import ClientSurface
from rpmiddleware.clientext import TO_CLIENT
from rpmiddleware.envelope import Envelope


def openConnection(connections: Iterable[ClientSurface], clientId: Any) -> ClientSurface | None:
    """
    The open connection of client session C{clientId}, if there is one.
    """
    if not isinstance(clientId, str):
        return None
    for connection in connections:
        if connection.session.id == clientId and not (connection.closed or connection.closing):
            return connection
    return None


class ExtensionBridge:
    """
    @param connections: the endpoint's open connections, looked up on each
        envelope.
    """

    log = Logger()

    def __init__(self, connections: Callable[[], Iterable[ClientSurface]]) -> None:
        self.connections = connections

    def __call__(self, envelope: Envelope) -> None:
        if envelope.type != TO_CLIENT:
            return
        message = envelope.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self.log.error(
                "a plugin's message for client {clientId} has no type; dropped",
                clientId=envelope.get("clientId"),
                origin=envelope.meta.get("origin"),
            )
            return
        connection = openConnection(self.connections(), envelope.get("clientId"))
        if connection is not None:
            connection.send(message)
