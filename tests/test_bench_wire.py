"""
The benchmark driver's own framing (bench.wire) against Autobahn's: the
frames it writes are read by Autobahn's server machine as the messages
sent, and a server's frames, cut into reads anywhere, reach it as the same
messages, pongs and state as through Autobahn's client machine.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from itertools import pairwise
from typing import Any

from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from bench.wire import WholeFrames, maskedFrame
from rpmiddleware.web.framemask import unmask
from rpmiddleware.web.websocket import QuietFraming
from tests.support.autobahn import LIMIT, AutobahnRecording, Transport, opened, txaioOnFakeReactor
from tests.support.frames import frame

_ACCEPT_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Client(WholeFrames, QuietFraming, WebSocketClientProtocol):  # type: ignore[misc]
    """The driver's reading, recording each message."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[bytes, bool]] = []

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages.append((payload, isBinary))


class AutobahnClient(Client):
    """The same, with every read through Autobahn's frame machine."""

    dataReceived = QuietFraming.dataReceived


def openedClient(protocolClass: type[Client]) -> tuple[Client, Transport]:
    """A client after the opening handshake, answered as a server would."""
    factory = WebSocketClientFactory("ws://127.0.0.1:9/client/socket", reactor=MemoryReactorClock())
    # As the driver's (bench.hop): it reads text with orjson, which checks UTF-8.
    factory.setProtocolOptions(utf8validateIncoming=False)
    factory.protocol = protocolClass
    protocol = factory.buildProtocol(None)
    assert isinstance(protocol, protocolClass)
    transport = Transport()
    protocol.makeConnection(transport)
    found = re.search(rb"Sec-WebSocket-Key: (\S+)", transport.value())
    assert found is not None
    accept = base64.b64encode(hashlib.sha1(found.group(1) + _ACCEPT_GUID).digest())
    protocol.dataReceived(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )
    assert protocol.state == protocol.STATE_OPEN
    transport.clear()
    return protocol, transport


#: Payload lengths at the edges of the header's three length encodings.
LENGTHS = (0, 1, 125, 126, 127, 0xFFFF, 0x10000)
PATTERN = bytes(range(251)) * 262


def serverFrame(payload: bytes, opcode: int = 1, fin: bool = True) -> bytes:
    """A frame as a server sends it: unmasked."""
    return frame(payload, b"", opcode, fin, isMasked=False)


@st.composite
def serverFrames(draw: Any) -> bytes:
    """A frame a server sends: whole text or binary, a fragmented message, or a ping."""
    kind = draw(st.sampled_from(["text", "text", "binary", "fragmented", "ping"]))
    if draw(st.booleans()):
        payload = PATTERN[: draw(st.sampled_from(LENGTHS))]
    else:
        payload = draw(st.binary(max_size=300))
    if kind == "fragmented":
        cut = len(payload) // 2
        return serverFrame(payload[:cut], opcode=2, fin=False) + serverFrame(
            payload[cut:], opcode=0
        )
    opcode = {"text": 1, "binary": 2, "ping": 9}[kind]
    return serverFrame(payload[:125] if kind == "ping" else payload, opcode=opcode)


def digests(items: list[tuple[bytes, Any]]) -> list[tuple[int, str, Any]]:
    """
    Each payload's length and digest beside what came with it: a failure
    then shows where two runs differ, not a diff of 64 KB payloads (which
    takes unittest minutes).
    """
    return [(len(p), hashlib.sha256(p).hexdigest()[:12], other) for p, other in items]


def clientFrames(written: bytes) -> list[tuple[bytes, int]]:
    """The unmasked payload and opcode of each (unfragmented) frame a client wrote."""
    found = []
    position = 0
    while position < len(written):
        opcode, length = written[position] & 0x0F, written[position + 1] & 0x7F
        position += 2
        if length >= 126:
            size = 2 if length == 126 else 8
            length = int.from_bytes(written[position : position + size], "big")
            position += size
        key = written[position : position + 4]
        position += 4
        found.append((unmask(key, written[position : position + length]), opcode))
        position += length
    return found


class WholeFramesTests(SynchronousTestCase):
    def setUp(self) -> None:
        txaioOnFakeReactor(self)

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(serverFrames(), min_size=1, max_size=6),
        st.lists(st.integers(min_value=0, max_value=140_000), max_size=5),
    )
    def test_sameAsAutobahn(self, sent: list[bytes], cuts: list[int]) -> None:
        """
        Any server frames cut into reads anywhere give the driver's reading
        the messages, the bytes written back (pongs) and the state of
        Autobahn's.
        """
        stream = b"".join(sent)
        edges = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
        seen = []
        for protocolClass in (Client, AutobahnClient):
            protocol, transport = openedClient(protocolClass)
            for start, stop in pairwise(edges):
                protocol.dataReceived(stream[start:stop])
            seen.append(
                (
                    digests(protocol.messages),
                    protocol.state,
                    digests(clientFrames(transport.value())),
                )
            )
        self.assertEqual(seen[0], seen[1])

    def test_closeIsAutobahns(self) -> None:
        """A server's close frame after a message closes as Autobahn does."""
        protocol, transport = openedClient(Client)
        protocol.dataReceived(
            serverFrame(b'{"type":"ready"}') + serverFrame(struct.pack("!H", 1000), opcode=8)
        )
        self.assertEqual(protocol.messages, [(b'{"type":"ready"}', False)])
        self.assertEqual(protocol.state, protocol.STATE_CLOSING)
        self.assertEqual(transport.value()[:1], b"\x88", "the close is answered")

    def test_sendTextWritesOneMaskedFrame(self) -> None:
        protocol, transport = openedClient(Client)
        protocol.sendText(b'{"type":"text","text":"speak"}')
        server, _ = opened(AutobahnRecording)
        server.dataReceived(transport.value())
        self.assertEqual(server.messages, [(b'{"type":"text","text":"speak"}', False)])


class MaskedFrameTests(SynchronousTestCase):
    def setUp(self) -> None:
        txaioOnFakeReactor(self)

    def test_readByAutobahn(self) -> None:
        """
        Autobahn's server machine reads each frame as the payload sent, at
        every length encoding within its limit.
        """
        payloads = [bytes(i % 251 for i in range(n)) for n in (0, 1, 125, 126, 127, LIMIT)]
        server, _ = opened(AutobahnRecording)
        server.dataReceived(b"".join(maskedFrame(p) for p in payloads))
        self.assertEqual(server.messages, [(p, False) for p in payloads])

    def test_shortestLength(self) -> None:
        """The length takes the shortest encoding that holds it (RFC 6455 5.2)."""
        self.assertEqual(maskedFrame(bytes(125))[:2], b"\x81\xfd")
        self.assertEqual(maskedFrame(bytes(0xFFFF))[:4], b"\x81\xfe\xff\xff")
        self.assertEqual(
            maskedFrame(bytes(0x10000))[:10], b"\x81\xff" + (0x10000).to_bytes(8, "big")
        )

    def test_freshKeys(self) -> None:
        """Each frame has a key of its own, as RFC 6455 asks of a client."""
        keys = {maskedFrame(b"x" * 10)[2:6] for _ in range(20)}
        self.assertGreater(len(keys), 1)
