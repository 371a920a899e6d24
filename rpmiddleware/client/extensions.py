"""
Plugins' messages to clients (L{rpmiddleware.clientext}): a router observer
that writes each L{TO_CLIENT <rpmiddleware.clientext.TO_CLIENT>} envelope's
message to the connection of its client session.

A session with no open connection here (between a disconnect and its
reconnect, or the Python API's C{"api"}) is not this endpoint's to serve: the
message is dropped, as the playbook's are.

An envelope of a type that is neither RPEngine's nor one of the middleware's
own (L{TO_CLIENT}, the playbook's C{x-playbook.*}) has no client message to
become: no WebSocket client is told of it.  Rather than let it vanish, the
bridge logs a warning the first time each plugin sends each such type, naming
both and the way that does reach a client (C{toClient}, or an C{x-} field on
a reply's envelope).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.client.surface import ClientSurface
from rpmiddleware.clientext import TO_CLIENT
from rpmiddleware.envelope import Envelope
from rpmiddleware.messages import MESSAGES
from rpmiddleware.playbookwire import PREFIX as PLAYBOOK_PREFIX


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
        #: (plugin, type) pairs already warned about.
        self.unknown: set[tuple[str, str]] = set()

    def __call__(self, envelope: Envelope) -> None:
        if envelope.type != TO_CLIENT:
            if envelope.type not in MESSAGES and not envelope.type.startswith(PLAYBOOK_PREFIX):
                self._noClientMessage(envelope)
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

    def _noClientMessage(self, envelope: Envelope) -> None:
        origin = str(envelope.meta.get("origin") or "RPEngine")
        if (origin, envelope.type) in self.unknown:
            return
        self.unknown.add((origin, envelope.type))
        self.log.warn(
            "{origin} sent {type} toward the game: no client message is made of that type, "
            "so no WebSocket client is told of it (the Python API's observers see it); "
            "send a client message with rpmiddleware.clientext.toClient, or put an x- field "
            "on a reply's envelope (docs/plugin-authors.md, Talking to clients)",
            origin=origin,
            type=envelope.type,
            requestId=envelope.requestId,
        )
