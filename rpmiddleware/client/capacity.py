"""
RPEngine's availability as clients see it: the C{capacity} message.

One monitor per endpoint watches the core (L{rpmiddleware.coreview.CoreView}:
is an RPEngine connected? what did its last C{capacity.update} say?), and
tells every connection when anything a client would show changes.  Clients
learn why their turn waits: no RPEngine (with the link that opens it), or
RPEngine busy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.config import PRODUCTION_ORIGIN
from rpmiddleware.coreview import CoreView, EngineSessionView
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
    @param core: the core whose engine and capacity are watched for as long
        as it lives.
    """

    log = Logger()

    def __init__(self, core: CoreView) -> None:
        self._core = core
        self._last = self.state()
        self._listeners: list[Listener] = []
        core.observeEnvelopes(self._envelope)
        core.observeEngine(self._engineChanged)

    @property
    def engineConnected(self) -> bool:
        return self._core.engineConnected

    @property
    def acceptingRequests(self) -> bool:
        return self._core.capacity.acceptingRequests

    @property
    def queueDepth(self) -> int:
        return self._core.capacity.queueDepth

    @property
    def queueLimit(self) -> int:
        return self._core.capacity.queueLimit

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

    def _engineChanged(self, session: EngineSessionView | None) -> None:
        self._changed()

    def _envelope(self, envelope: Envelope) -> None:
        if envelope.type == "capacity.update":
            self._changed()

    def _changed(self) -> None:
        now = self.state()
        if now != self._last:
            self._last = now
            self._notify()

    def _notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                self.log.failure("a capacity listener failed")
