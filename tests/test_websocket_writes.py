"""
Reads and writes without Autobahn's per-frame debug line
(rpmiddleware.web.websocket.QuietFraming, which the guarded protocols and the
benchmark's client use): the same bytes and counts, and Autobahn's own path
whenever its debug lines are wanted or its queue is in use.
"""

from __future__ import annotations

from collections import deque

import txaio
from autobahn.twisted.websocket import WebSocketServerProtocol
from autobahn.websocket.protocol import TrafficStats
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.web.websocket import QuietFraming


class Recorded(QuietFraming, WebSocketServerProtocol):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.autobahnSends: list[bytes] = []
        self.received: list[bytes] = []

    def _dataReceived(self, data: bytes) -> None:
        self.received.append(data)


def opened() -> tuple[Recorded, StringTransport]:
    protocol = Recorded()
    transport = StringTransport()
    protocol.transport = transport
    protocol.state = protocol.STATE_OPEN
    protocol.send_queue = deque()
    protocol.trafficStats = TrafficStats()
    protocol.logOctets = False  # type: ignore[attr-defined]
    return protocol, transport


class WritesTests(SynchronousTestCase):
    def setUp(self) -> None:
        txaio.use_twisted()
        level = txaio.get_global_log_level()  # type: ignore[attr-defined]
        self.addCleanup(txaio.set_global_log_level, level)  # type: ignore[attr-defined]
        txaio.set_global_log_level("info")  # type: ignore[attr-defined]

    def test_writeCounted(self) -> None:
        """
        A write goes to the transport and into Autobahn's traffic counts.
        """
        protocol, transport = opened()
        protocol.sendData(b"frame")
        protocol.sendData(b"more")
        self.assertEqual(transport.value(), b"framemore")
        self.assertEqual(protocol.trafficStats.outgoingOctetsWireLevel, 9)

    def test_queuedWritesStayInOrder(self) -> None:
        """
        While Autobahn's own send queue holds anything, writes join it.
        """
        protocol, transport = opened()
        protocol.send_queue.append((b"first", False))
        protocol.triggered = True  # its drain is already scheduled
        protocol.sendData(b"second")
        self.assertEqual(list(protocol.send_queue), [(b"first", False), (b"second", False)])
        self.assertEqual(transport.value(), b"")

    def test_readPassedOn(self) -> None:
        protocol, _ = opened()
        protocol.dataReceived(b"bytes")
        self.assertEqual(protocol.received, [b"bytes"])

    def test_debugLevelUsesAutobahn(self) -> None:
        """
        At txaio's debug level Autobahn's own methods run (and log).
        """
        txaio.set_global_log_level("debug")  # type: ignore[attr-defined]
        protocol, transport = opened()
        protocol.log = txaio.make_logger()  # type: ignore[attr-defined]
        protocol.sendData(b"frame")
        protocol.dataReceived(b"bytes")
        self.assertEqual(transport.value(), b"frame")
        self.assertEqual(protocol.trafficStats.outgoingOctetsWireLevel, 5)
        self.assertEqual(protocol.received, [b"bytes"])
