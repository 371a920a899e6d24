"""
The guarded protocol's own reading of whole ordinary frames
(rpmiddleware.web.framereader) against Autobahn's machine: for any stream of
frames, ordinary or not, cut into reads anywhere, the same messages in the
same order, the same bytes written back (pongs, closes), the same state and
the same traffic counts.
"""

from __future__ import annotations

import ast
import struct
from importlib.metadata import version
from itertools import pairwise
from typing import Any

import txaio
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.web import framereader
from tests.support.autobahn import (
    LIMIT,
    AutobahnRecording,
    Recording,
    Transport,
    opened,
    txaioOnFakeReactor,
)
from tests.support.frames import frame

#: Payload lengths at the edges of the header's encodings and of the limit.
EDGE_LENGTHS = (0, 1, 125, 126, 127, 1024, 1025, LIMIT, LIMIT + 1)


payloads = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(EDGE_LENGTHS).map(lambda n: bytes(i % 251 for i in range(n))),
    st.sampled_from([b"caf\xc3\xa9", b"\xff\xfe not utf-8", b'{"type":"text"}']),
)
keys = st.binary(min_size=4, max_size=4)


@st.composite
def frames(draw: Any) -> bytes:
    """One frame or message of any kind a peer could send, most of them ordinary."""
    kind = draw(
        st.sampled_from(
            ["text", "text", "text", "binary", "fragmented", "ping", "close", "unmasked"]
            + ["reserved", "rsv", "nonminimal", "large"]
        )
    )
    payload = draw(payloads)
    key = draw(keys)
    if kind == "text":
        return frame(payload, key)
    if kind == "binary":
        return frame(payload, key, opcode=2)
    if kind == "fragmented":
        cut = len(payload) // 2
        return frame(payload[:cut], key, fin=False) + frame(payload[cut:], draw(keys), opcode=0)
    if kind == "ping":
        return frame(payload[:125], key, opcode=9)
    if kind == "close":
        return frame(struct.pack("!H", 1000) + payload[:100], key, opcode=8)
    if kind == "unmasked":
        return frame(payload, key, isMasked=False)
    if kind == "reserved":
        return frame(payload, key, opcode=3)
    if kind == "rsv":
        return frame(payload, key, rsv=4)
    if kind == "nonminimal":
        return frame(payload[:125], key, minimal=False)
    return frame(bytes(70_000), key, opcode=2)


class Watched(Recording):
    """Also records what Autobahn's machine is given to read."""

    def __init__(self) -> None:
        super().__init__()
        self.autobahnReads: list[bytes] = []

    def consumeData(self) -> None:
        self.autobahnReads.append(self.data)
        super().consumeData()


def watched() -> tuple[Watched, Transport]:
    """An open L{Watched} protocol, the handshake's read forgotten."""
    protocol, transport = opened(Watched)
    assert isinstance(protocol, Watched)
    protocol.autobahnReads.clear()
    return protocol, transport


def observed(protocol: Recording, transport: Transport) -> dict[str, object]:
    stats = protocol.trafficStats
    return {
        "messages": protocol.messages,
        "written": transport.value(),
        "state": protocol.state,
        "disconnecting": transport.disconnecting,
        "counts": (
            stats.incomingOctetsWireLevel,
            stats.incomingOctetsWebSocketLevel,
            stats.incomingOctetsAppLevel,
            stats.incomingWebSocketFrames,
            stats.incomingWebSocketMessages,
        ),
    }


def feed(protocolClass: type[Recording], stream: bytes, cuts: list[int]) -> dict[str, object]:
    protocol, transport = opened(protocolClass)
    edges = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    for start, stop in pairwise(edges):
        protocol.dataReceived(stream[start:stop])
    return observed(protocol, transport)


class WholeFrameReaderTests(SynchronousTestCase):
    def setUp(self) -> None:
        txaioOnFakeReactor(self)

    @settings(max_examples=300, deadline=None)
    @given(
        stream=st.lists(frames(), max_size=8).map(b"".join),
        cuts=st.lists(st.integers(min_value=1, max_value=80_000), max_size=5),
    )
    def test_sameAsAutobahn(self, stream: bytes, cuts: list[int]) -> None:
        """
        Whatever the frames and however they are cut into reads, the
        protocol does what Autobahn's machine does with them.
        """
        self.assertEqual(feed(Recording, stream, cuts), feed(AutobahnRecording, stream, cuts))

    def test_ordinaryFramesTakenHere(self) -> None:
        """
        Ordinary frames never reach Autobahn's frame machine, in one read or
        cut across two; the first one that is not ordinary, and all after it,
        do.
        """
        text = frame(b'{"type":"text"}', b"abcd")
        binary = frame(bytes(2000), b"efgh", opcode=2)
        ping = frame(b"hi", b"ijkl", opcode=9)
        protocol, transport = watched()
        calls = protocol.autobahnReads
        protocol.dataReceived(text + binary + text)
        # Frames cut by reads anywhere, the header too.
        stream = text + binary + text
        for cut in (1, 3, 7, len(text) + 5, len(text) + 100, len(stream) - 1):
            protocol.dataReceived(stream[:cut])
            protocol.dataReceived(stream[cut:])
        self.assertEqual(calls, [])
        protocol.dataReceived(text + ping + text)
        self.assertEqual(calls, [ping + text])
        self.assertEqual(
            protocol.messages,
            [(b'{"type":"text"}', False), (bytes(2000), True), (b'{"type":"text"}', False)] * 7
            + [(b'{"type":"text"}', False)] * 2,
        )
        # The pong is Autobahn's.
        self.assertEqual(transport.value(), b"\x8a\x02hi")

    def test_frameInManyPiecesLeftToAutobahn(self) -> None:
        """
        A frame that a second read does not complete is Autobahn's, which
        takes it piece by piece rather than joining each piece to the rest.
        """
        binary = frame(bytes(range(250)) * 11, b"abcd", opcode=2)
        protocol, _ = watched()
        calls = protocol.autobahnReads
        protocol.dataReceived(binary[:1000])
        protocol.dataReceived(binary[1000:2000])
        self.assertEqual(protocol.messages, [])
        protocol.dataReceived(binary[2000:])
        # Autobahn's from the second read on, each piece once.
        self.assertEqual(calls, [binary[:2000], binary[2000:]])
        self.assertEqual(protocol.messages, [(bytes(range(250)) * 11, True)])

    def test_oversizeLeftToAutobahn(self) -> None:
        """
        A frame over the limit is refused as Autobahn refuses it: closed
        with 1009, the message not delivered.
        """
        protocol, transport = opened(Recording)
        protocol.dataReceived(frame(bytes(LIMIT + 1), b"abcd", opcode=2))
        self.assertEqual(protocol.messages, [])
        self.assertEqual(
            transport.value()[:4], b"\x88" + bytes([len(transport.value()) - 2]) + b"\x03\xf1"
        )

    def test_debugLevelUsesAutobahn(self) -> None:
        """
        At txaio's debug level every read goes to Autobahn, which logs it.
        """
        level = txaio.get_global_log_level()  # type: ignore[attr-defined]
        self.addCleanup(txaio.set_global_log_level, level)  # type: ignore[attr-defined]
        protocol, _ = watched()
        calls = protocol.autobahnReads
        txaio.set_global_log_level("debug")  # type: ignore[attr-defined]
        text = frame(b"{}", b"abcd")
        protocol.dataReceived(text)
        self.assertEqual(calls, [text])
        self.assertEqual(protocol.messages, [(b"{}", False)])


#: What framereader.py calls the objects it reads Autobahn's internals
#: through: the protocol (C{self}, and C{options}, the protocol as the
#: factory's options were copied onto it) and its traffic counters.
READ_THROUGH = {"self": "the protocol", "options": "the protocol", "stats": "trafficStats"}


def internalsRead() -> dict[str, set[str]]:
    """
    Every attribute framereader.py reads or sets through C{self},
    C{options} and C{stats}, by the object it is on.
    """
    path = framereader.__file__
    assert path is not None
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: dict[str, set[str]] = {"the protocol": set(), "trafficStats": set()}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in READ_THROUGH
        ):
            found[READ_THROUGH[node.value.id]].add(node.attr)
    return found


class AutobahnInternalsTests(SynchronousTestCase):
    """
    The whole-frame reader reads and sets Autobahn's internals (setup.cfg pins
    Autobahn to the versions it was checked with): each one it uses is still
    there, on a real opened protocol of the installed Autobahn.  A failure
    here names what changed; read framereader.py against the new Autobahn
    before widening the pin.
    """

    def setUp(self) -> None:
        txaioOnFakeReactor(self)

    def test_internalsFound(self) -> None:
        """
        The reader of framereader.py finds what it uses (so the check below
        checks something).
        """
        found = internalsRead()
        self.assertTrue(
            {"state", "STATE_OPEN", "data", "current_frame", "consumeData"} <= found["the protocol"]
        )
        self.assertIn("maxFramePayloadSize", found["the protocol"])
        self.assertIn("incomingWebSocketFrames", found["trafficStats"])

    def test_protocolHasWhatTheReaderUses(self) -> None:
        protocol, _ = opened(Recording)
        ours = set(vars(framereader.WholeFrameReader)) | {"onMessage"}
        missing = sorted(
            name for name in internalsRead()["the protocol"] - ours if not hasattr(protocol, name)
        )
        self.assertEqual(
            missing,
            [],
            f"autobahn {version('autobahn')}: the WebSocket server protocol no longer "
            f"has what rpmiddleware/web/framereader.py reads: {missing}",
        )
        self.assertTrue(callable(protocol.consumeData), "autobahn: consumeData not a method")
        self.assertIsNone(protocol.current_frame, "autobahn: an open protocol has a frame begun")
        self.assertIs(protocol.inside_message, False)
        self.assertIsInstance(protocol.data, bytes, "autobahn: the read buffer is not bytes")

    def test_trafficStatsHaveTheCounters(self) -> None:
        protocol, _ = opened(Recording)
        stats = protocol.trafficStats
        missing = sorted(
            name
            for name in internalsRead()["trafficStats"]
            if not isinstance(getattr(stats, name, None), int)
        )
        self.assertEqual(
            missing,
            [],
            f"autobahn {version('autobahn')}: trafficStats lacks the counters "
            f"rpmiddleware/web/framereader.py adds to: {missing}",
        )

    def test_txaioLogLevel(self) -> None:
        """
        txaio still says its global log level, as one of the names
        framereader.autobahnDebugging compares it with or another.
        """
        reader = getattr(txaio, "get_global_log_level", None)
        self.assertTrue(
            callable(reader),
            f"txaio {version('txaio')}: get_global_log_level is gone "
            "(framereader.autobahnDebugging reads it)",
        )
        self.assertIsInstance(reader(), str)  # type: ignore[misc]
