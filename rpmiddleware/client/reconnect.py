"""
The C{reconnect} message: a client takes its session back (its character,
configuration and history) after its connection dropped, within
C{client.session_ttl}.  Taking it over is the connection's part
(L{rpmiddleware.client.surface.ClientSurface.resume}); what the client is
told is here.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.client import messages as wire
from rpmiddleware.client.sessions import SessionLookupError
from rpmiddleware.client.surface import ClientSurface
from rpmiddleware.protocol import clientfields
from rpmiddleware.protocol.clienterrors import SESSION_EXPIRED, SESSION_NOT_FOUND


def handleReconnect(client: ClientSurface, message: dict[str, Any]) -> None:
    sessionId = clientfields.identifier(message, "sessionId")
    assert sessionId is not None
    if sessionId == client.session.id:
        client.send(wire.reconnectAck(True, sessionId, bool(client.session.history)))
        return
    try:
        session = client.resume(sessionId)
    except SessionLookupError as e:
        if e.expired:
            client.error(
                SESSION_EXPIRED,
                f"session {sessionId} expired (sessions are kept "
                f"{client.settings.session_ttl:g} s after a disconnect); this is a new one",
            )
        else:
            client.error(SESSION_NOT_FOUND, f"there is no session {sessionId[:64]}")
        client.send(wire.reconnectAck(False, client.session.id, False))
        return
    recovered = bool(session.history)
    client.send(wire.reconnectAck(True, sessionId, recovered))
    if recovered:
        client.send({"type": "history", "entries": list(session.history)})
    client.middleware.clientSessionResumed(sessionId)
