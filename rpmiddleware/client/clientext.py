"""
Plugins' messages to clients (L{rpmiddleware.plugin.clientext}): a router observer
that writes each L{TO_CLIENT <rpmiddleware.plugin.clientext.TO_CLIENT>} envelope's
message to the connection of its client session.

A session with no open connection here (between a disconnect and its
reconnect, or the Python API's C{"api"}) is not this endpoint's to serve: the
message is dropped.

A plugin may also ask for a turn of a client's own (L{START_TURN
<rpmiddleware.plugin.clientext.START_TURN>}: the playbook's game events): it starts
on that client's connection like any turn (barge-in, queueing, history), or
the plugin is told why not (L{TURN_FAILED <rpmiddleware.plugin.clientext.TURN_FAILED>}),
in order with the client's messages.

An envelope of a type that is neither RPEngine's nor one of the middleware's
own (L{TO_CLIENT}, L{START_TURN}) has no client message to become: no
WebSocket client is told of it.  Rather than let it vanish, the
bridge logs a warning the first time each plugin sends each such type, naming
both and the way that does reach a client (C{toClient}, or an C{x-} field on
a reply's envelope).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.client.surface import ClientSurface
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.plugin.clientext import START_TURN, TO_CLIENT, turnFailed
from rpmiddleware.protocol.clienterrors import INVALID_MESSAGE, InvalidMessage, errorMessage
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import MESSAGES


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
        kind = envelope.type
        if kind == START_TURN:
            self._startTurn(envelope)
            return
        if kind != TO_CLIENT:
            if kind not in MESSAGES:
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
            "send a client message with rpmiddleware.plugin.clientext.toClient, or put an x- field "
            "on a reply's envelope (docs/plugin-authors.md, Talking to clients)",
            origin=origin,
            type=envelope.type,
            requestId=envelope.requestId,
        )

    def _startTurn(self, envelope: Envelope) -> None:
        """
        Start the C{auto_event} turn a plugin asked for (it barges in, or
        waits, like any turn), or tell the plugin why not.  A session with no
        open connection here is not this endpoint's: the plugin's own timeout
        covers it.
        """
        connection = openConnection(self.connections(), envelope.get("clientId"))
        if connection is None:
            return
        token = str(envelope.get("token") or "")
        text = str(envelope.get("text") or "")
        source = str(envelope.get("source") or "event")
        extra = envelope.get("meta")
        before = (connection.current, connection.queued)

        def open(request: dict[str, Any]) -> ReplyStream:
            meta = {**request["meta"], **(extra if isinstance(extra, dict) else {})}
            request = {**request, "interactionMode": "auto_event", "meta": meta}
            return connection.middleware.requestReply(text=text, **request)

        why = None
        try:
            connection.submit(source, text, open)
        except InvalidMessage as e:
            connection.send(errorMessage(INVALID_MESSAGE, f"{source}: {e}"))
            why = str(e)
        else:
            if connection.current is before[0] and connection.queued <= before[1]:
                why = "the client's turn could not start"
        if why is not None:
            connection.middleware.submit(turnFailed(connection.session.id, token, why))


def installBridge(factory: Any) -> ExtensionBridge:
    """
    Observe what reaches the game end of C{factory}'s core for plugins'
    messages and turns,
    delivering them to C{factory}'s open connections.
    """

    def connections() -> list[ClientSurface]:
        found = (getattr(p, "connection", None) for p in list(factory.connections))
        return [c for c in found if c is not None]

    bridge = ExtensionBridge(connections)
    factory.middleware.observeEnvelopes(bridge)
    return bridge
