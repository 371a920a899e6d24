"""
A connection taking over a session (a C{reconnect}): the session's previous
connection, if any, is closed; the new one's turns are dropped and its own
session forgotten.  What the client is told is
L{rpmiddleware.client.reconnect}'s part.
"""

from __future__ import annotations

from typing import Any, Protocol

from twisted.logger import Logger

from rpmiddleware.client.sessions import ClientSession, SessionStore
from rpmiddleware.client.turnqueue import TurnQueue

log = Logger()


class Resuming(Protocol):
    """
    The connection that resumes a session.
    """

    @property
    def peer(self) -> str: ...

    @property
    def session(self) -> ClientSession:
        """Its session until now."""


def resumeSession(
    sessions: SessionStore, sessionId: str, connection: Resuming, turns: TurnQueue
) -> ClientSession:
    """
    Hand the session C{sessionId} to C{connection} and return it; the
    caller makes it the connection's session.

    @raise rpmiddleware.client.sessions.SessionLookupError: no such session
        (or it expired).
    """
    previous: Any
    session, previous = sessions.resume(sessionId, connection)
    if previous is not None and previous is not connection:
        previous.takenOver()
    turns.dropWaiting("a waiting turn was dropped: the connection resumed another session")
    turns.stop("the connection resumed another session")
    sessions.discard(connection.session)
    log.info(
        "client {peer} resumed session {sessionId} ({entries} history entries)",
        peer=connection.peer,
        sessionId=sessionId,
        entries=len(session.history),
    )
    return session
