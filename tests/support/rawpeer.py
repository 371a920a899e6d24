"""
A raw TCP peer for hostile-client tests: it writes what it is told, when
it is told, and records what comes back and when the connection ends; and
the clean-up of the client endpoint's bucket timers.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.internet.task import deferLater
from twisted.python.failure import Failure


class RawPeer(Protocol):
    """
    A TCP peer that writes what it is told, when it is told, and records
    what comes back and when the connection ends.
    """

    def __init__(self) -> None:
        self.received = b""
        self.lost: Deferred[None] = Deferred()
        self.made: Deferred[RawPeer] = Deferred()
        self._awaited: list[tuple[bytes, Deferred[bytes]]] = []

    def connectionMade(self) -> None:
        self.made.callback(self)

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        for marker, d in list(self._awaited):
            if marker in self.received:
                self._awaited.remove((marker, d))
                d.callback(self.received)

    def whenReceived(self, marker: bytes) -> Deferred[bytes]:
        """
        Fires with everything received once C{marker} is among it.
        """
        if marker in self.received:
            return succeed(self.received)
        d: Deferred[bytes] = Deferred()
        self._awaited.append((marker, d))
        return d

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        assert self.transport is not None
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure | None = None) -> None:
        if not self.lost.called:
            self.lost.callback(None)


class RawFactory(ClientFactory):
    def __init__(self) -> None:
        self.peer = RawPeer()

    def buildProtocol(self, addr: Any) -> RawPeer:
        return self.peer


async def rawConnect(port: int) -> RawPeer:
    factory = RawFactory()
    reactor.connectTCP("127.0.0.1", port, factory)
    return await factory.peer.made


async def whenGone(connection: Any) -> None:
    """
    Once the server side of a WebSocket connection has closed and left its
    factory's C{connections} (autobahn resolves C{is_closed} just before
    C{onClose}, so one reactor turn later).
    """
    await connection.is_closed
    await deferLater(reactor, 0, lambda: None)


def cancelBucketTimers() -> None:
    """
    Autobahn's timers live in txaio buckets: cancelling a close-handshake
    timeout empties its slot but leaves the bucket's reactor call pending for
    the rest of the five seconds.  Harmless in a daemon; a dirty reactor to
    trial.
    """
    for call in reactor.getDelayedCalls():
        func = getattr(call, "func", None)
        if getattr(func, "__qualname__", "").startswith("_BatchedTimer."):
            call.cancel()
