"""
RPEngine's availability as clients see it: the C{capacity} message.

One monitor per endpoint watches the engine link (is an RPEngine connected?)
and the router (RPEngine's C{capacity.update}), and tells every connection
when anything a client would show changes.  Clients learn why their turn
waits: no RPEngine (with the link that opens it), or RPEngine busy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.config import PRODUCTION_ORIGIN
from rpmiddleware.envelope import Envelope

Listener = Callable[[], None]


def engineLink(port: int) -> str:
    return f"{PRODUCTION_ORIGIN}/#port={port}"


def notConnectedMessage(port: int) -> str:
    return (
        f"RPEngine is not connected. Open {engineLink(port)} in a browser on this computer; "
        "turns wait until it connects."
    )


class CapacityMonitor:
    """
    @param middleware: a L{rpmiddleware.middleware.Middleware} (its C{link}
        and C{router} are watched for as long as it lives).
    """

    log = Logger()

    def __init__(self, middleware: Any) -> None:
        self.engineConnected: bool = bool(middleware.link.connected)
        self.acceptingRequests = False
        self.queueDepth = 0
        self.queueLimit = 0
        self._listeners: list[Listener] = []
        middleware.router.observe(self._envelope)
        middleware.link.observeState(self._engineChanged)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """
        Call C{listener()} after every change; returns a callable that stops it.
        """
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def state(self) -> tuple[bool, bool, int, int]:
        return (self.engineConnected, self.acceptingRequests, self.queueDepth, self.queueLimit)

    def message(self, port: int, note: str | None = None) -> dict[str, Any]:
        """
        The C{capacity} message for a client of the listener on C{port}.
        """
        message: dict[str, Any] = {
            "type": "capacity",
            "engineConnected": self.engineConnected,
            "acceptingRequests": self.acceptingRequests,
            "queueDepth": self.queueDepth,
            "queueLimit": self.queueLimit,
        }
        if not self.engineConnected:
            message["message"] = notConnectedMessage(port)
            message["engineLink"] = engineLink(port)
        if note:
            message["message"] = f"{note} {message.get('message', '')}".strip()
        return message

    def _engineChanged(self, session: Any) -> None:
        before = self.state()
        self.engineConnected = session is not None
        # A new session has told nothing yet; a gone one accepts nothing.
        self.acceptingRequests = False
        self.queueDepth = 0
        if self.state() != before:
            self._notify()

    def _envelope(self, envelope: Envelope) -> None:
        if envelope.type != "capacity.update":
            return
        before = self.state()
        accepting = envelope.get("acceptingRequests")
        depth = envelope.get("queueDepth")
        limit = envelope.get("queueLimit")
        if isinstance(accepting, bool):
            self.acceptingRequests = accepting
        if type(depth) is int:
            self.queueDepth = max(0, depth)
        if type(limit) is int:
            self.queueLimit = max(0, limit)
        if self.state() != before:
            self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                self.log.failure("a capacity listener failed")
