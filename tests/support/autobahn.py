"""
An Autobahn server protocol (rpmiddleware's guarded one) on a memory
transport and a fake reactor, opened with a real upgrade request, that
records the messages it reads: the rig of the whole-frame reader's tests
(tests/test_framereader.py) and of bench's wire tests.
"""

from __future__ import annotations

import txaio
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.web.websocket import GuardedServerFactory, GuardedServerProtocol, QuietFraming
from tests.support.frames import UPGRADE

#: The limit the factories here set, small enough that frames over it are cheap.
LIMIT = 3000


class Recording(GuardedServerProtocol):
    """
    Records each message, and reads text as the endpoints do: a text
    message that is not UTF-8 fails the connection in the middle of a read.
    """

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[bytes, bool]] = []

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages.append((payload, isBinary))
        if not isBinary:
            self.textOf(payload)


class AutobahnRecording(Recording):
    """The same, with every read through Autobahn's frame machine."""

    dataReceived = QuietFraming.dataReceived


class Transport(StringTransport):
    """A string transport that, like TCP's, lets a protocol unregister no producer."""

    def unregisterProducer(self) -> None:
        self.producer = None


def opened(protocolClass: type[Recording]) -> tuple[Recording, Transport]:
    factory = GuardedServerFactory(
        MemoryReactorClock(),
        allowedOrigins=(),
        allowMissingOrigin=True,
        maxMessageBytes=LIMIT,
        connectionLimit=4,
        endpointName="test",
    )
    factory.protocol = protocolClass
    protocol = factory.buildProtocol(None)
    assert isinstance(protocol, protocolClass)
    transport = Transport()
    protocol.makeConnection(transport)
    protocol.dataReceived(UPGRADE)
    assert protocol.state == protocol.STATE_OPEN
    transport.clear()
    return protocol, transport


def txaioOnFakeReactor(case: SynchronousTestCase) -> None:
    """
    Autobahn's handshake timers are txaio's, on txaio's reactor: a fake one
    for the test, or they would be left on the real one for later tests.
    """
    txaio.use_twisted()
    case.patch(txaio.config, "loop", MemoryReactorClock())  # type: ignore[attr-defined]
