"""
RPEngine's availability as clients see it: the C{capacity} message.

One monitor per endpoint watches the core (L{rpmiddleware.core.view.CoreView}:
is an RPEngine connected? what did its last C{capacity.update} say?), and
tells every connection when anything a client would show changes.  Clients
learn why their turn waits: no RPEngine (with the link that opens it), or
RPEngine busy.  Each connection's L{CapacityNotices} sends them its
messages, the moves of RPEngine's queue depth alone at a bounded rate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from rpmiddleware.config.settings import PRODUCTION_ORIGIN
from rpmiddleware.core.view import CoreView, EngineSessionView
from rpmiddleware.protocol.envelope import Envelope

Listener = Callable[[], None]

#: Seconds between capacity messages that only move the queue depth.
DEPTH_INTERVAL = 0.25


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
        core.observeEnvelopes(self._envelope, {"capacity.update"})
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


class CapacityNotices:
    """
    One connection's C{capacity} messages, from its creation until L{stop}.

    A move of RPEngine's queue depth alone is sent at most every
    L{DEPTH_INTERVAL} seconds (the latest value always arrives): with many
    clients playing turns every request moves the depth, and telling every
    client of every move was most of what they received.  Anything else
    (engine, accepting, limit) goes at once.

    @param send: sends a message to the client.
    @param port: the local port the client connected to (for the link).
    @param closed: whether the connection is gone; then nothing is sent.
    """

    def __init__(
        self,
        monitor: CapacityMonitor,
        clock: IReactorTime,
        send: Callable[[dict[str, Any]], object],
        port: Callable[[], int],
        closed: Callable[[], bool],
    ) -> None:
        self._monitor = monitor
        self._clock = clock
        self._send = send
        self._port = port
        self._closed = closed
        self._sent: tuple[bool, bool, int, int] | None = None
        self._later: IDelayedCall | None = None
        self._stopListening = monitor.listen(self._changed)

    def send(self) -> None:
        """
        Send the client RPEngine's capacity now.
        """
        later, self._later = self._later, None
        if later is not None and later.active():
            later.cancel()
        if self._closed():
            return
        self._sent = self._monitor.state()
        self._send(self._monitor.message(self._port()))

    def stop(self) -> None:
        """
        Send nothing more (the connection is gone).
        """
        self._stopListening()
        if self._later is not None and self._later.active():
            self._later.cancel()

    def _changed(self) -> None:
        state = self._monitor.state()
        sent = self._sent
        if sent is not None and state[:2] == sent[:2] and state[3] == sent[3]:
            if self._later is None:
                self._later = self._clock.callLater(DEPTH_INTERVAL, self.send)
            return
        self.send()
