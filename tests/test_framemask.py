"""
Unmasking client frames (rpmiddleware.web.framemask) and the guarded protocol's
use of it: the payload RFC 6455 5.3 defines, whether a frame comes in one
read or byte by byte, small or large.
"""

from __future__ import annotations

import os
import sys
from itertools import pairwise
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.web.framemask import SMALL_PAYLOAD, IntegerUnmasker, unmask, unmasker
from rpmiddleware.web.websocket import GuardedServerFactory, GuardedServerProtocol
from tests.support.frames import UPGRADE, frame, masked


class IntegerUnmaskerTests(SynchronousTestCase):
    @given(
        payload=st.binary(max_size=3000),
        key=st.binary(min_size=4, max_size=4),
        cuts=st.lists(st.integers(min_value=0, max_value=3000), max_size=6),
    )
    def test_piecesUnmaskAsAWhole(self, payload: bytes, key: bytes, cuts: list[int]) -> None:
        """
        However the payload is cut into pieces, the pieces unmask to the
        original, and the pointer counts the bytes given.
        """
        data = masked(payload, key)
        unmasking = IntegerUnmasker(key)
        edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
        out = b"".join(unmasking.process(data[a:b]) for a, b in pairwise(edges))
        self.assertEqual(out, payload)
        self.assertEqual(unmasking.pointer(), len(payload))

    def test_leadingZerosKept(self) -> None:
        """
        Bytes that unmask to zero at the end (the integers' high end) are
        not dropped.
        """
        key = b"\x01\x02\x03\x04"
        payload = b"ab\x00\x00\x00"
        self.assertEqual(IntegerUnmasker(key).process(masked(payload, key)), payload)

    def test_reset(self) -> None:
        unmasking = IntegerUnmasker(b"abcd")
        unmasking.process(b"xyz")
        unmasking.reset()
        self.assertEqual(unmasking.pointer(), 0)
        self.assertEqual(unmasking.process(masked(b"hello", b"abcd")), b"hello")

    def test_keyOfFourBytes(self) -> None:
        error = self.assertRaises(ValueError, IntegerUnmasker, b"abc")
        self.assertIn("4 bytes, not 3", str(error))

    def test_largePayloadsLeftToAutobahn(self) -> None:
        """
        Small payloads get the integer unmasker, larger ones Autobahn's;
        both give the RFC's bytes.
        """
        key = os.urandom(4)
        for size in (1, SMALL_PAYLOAD, SMALL_PAYLOAD + 1, 12_000):
            payload = os.urandom(size)
            chosen = unmasker(key, size)
            self.assertEqual(isinstance(chosen, IntegerUnmasker), size <= SMALL_PAYLOAD, size)
            self.assertEqual(chosen.process(masked(payload, key)), payload)


class UnmaskTests(SynchronousTestCase):
    @given(payload=st.binary(max_size=3000), key=st.binary(min_size=4, max_size=4))
    def test_wholePayload(self, payload: bytes, key: bytes) -> None:
        """
        A whole payload unmasks to RFC 6455's bytes, with numpy imported and
        without (Autobahn's NVX then).
        """
        self.assertEqual(unmask(key, masked(payload, key)), payload)
        with patch.dict(sys.modules, {"numpy": None}):
            self.assertEqual(unmask(key, masked(payload, key)), payload)

    def test_largePayloads(self) -> None:
        """
        Payloads past the integers' size unmask to RFC 6455's bytes both ways.
        """
        key = os.urandom(4)
        for size in (SMALL_PAYLOAD + 1, SMALL_PAYLOAD + 3, 12_000, 65_535):
            payload = os.urandom(size)
            self.assertEqual(unmask(key, masked(payload, key)), payload, size)
            with patch.dict(sys.modules, {"numpy": None}):
                self.assertEqual(unmask(key, masked(payload, key)), payload, size)

    def test_numpyNotImportedForIt(self) -> None:
        """
        Unmasking a large payload does not import numpy: an idle daemon does
        without it.
        """
        key = b"\x01\x02\x03\x04"
        payload = bytes(range(256)) * 20
        with patch.dict(sys.modules, {"numpy": None}):
            self.assertEqual(unmask(key, masked(payload, key)), payload)
            self.assertIsNone(sys.modules["numpy"])


class Collecting(GuardedServerProtocol):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[bytes] = []

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages.append(payload)


class GuardedUnmaskingTests(SynchronousTestCase):
    def opened(self) -> Collecting:
        factory = GuardedServerFactory(
            MemoryReactorClock(),
            allowedOrigins=(),
            allowMissingOrigin=True,
            maxMessageBytes=1 << 20,
            connectionLimit=4,
            endpointName="test",
        )
        factory.protocol = Collecting
        protocol = factory.buildProtocol(None)
        assert isinstance(protocol, Collecting)
        protocol.makeConnection(StringTransport())
        protocol.dataReceived(UPGRADE)
        self.assertEqual(protocol.state, protocol.STATE_OPEN)
        return protocol

    def test_framesWholeAndByteByByte(self) -> None:
        """
        Small and large masked frames reach C{onMessage} unmasked, given in
        one read or one byte per read.
        """
        small = b'{"type":"text","text":"' + b"x" * 300 + b'"}'
        large = b'{"data":"' + b"A" * 12_000 + b'"}'
        stream = frame(small, b"\x11\x22\x33\x44") + frame(large, b"\xa0\xb1\xc2\xd3")
        whole = self.opened()
        whole.dataReceived(stream)
        bytewise = self.opened()
        for i in range(len(stream)):
            bytewise.dataReceived(stream[i : i + 1])
        self.assertEqual(whole.messages, [small, large])
        self.assertEqual(bytewise.messages, [small, large])
