"""
Unmasking the payload of a frame a WebSocket client sent (RFC 6455 5.3).

Every frame a client sends is masked: byte M{i} of its payload is XORed with
byte M{i mod 4} of a 4-byte key in its header.  Autobahn's NVX masker does
the XOR in C, but sets itself up per frame through cffi (allocations, a
finalizer, an import): about 4-6 us a frame whatever its size, where a text
delta's 300 bytes take 1.3 us as one XOR of two Python integers.  RPEngine
sends about 20 such small frames a second per voice stream, so the server
unmasks small frames here.  Two ways in: L{unmask} for a whole payload (the
frame reader's, L{rpmiddleware.web.framereader}), which gives larger ones to
numpy when it is loaded; and L{unmasker}, the per-frame masker Autobahn's
own machine calls piece by piece, which leaves larger ones (speech chunks,
past about 1 KB, where NVX's set-up is repaid) to NVX.  The measurements
are in the commits that made these.
"""

from __future__ import annotations

import sys
from typing import Protocol, cast

from autobahn.websocket.xormasker import create_xor_masker

#: Payloads up to this many bytes are unmasked by L{IntegerUnmasker}; the
#: two cost the same near 1 KB here.
SMALL_PAYLOAD = 1024


class Masker(Protocol):
    """What Autobahn's protocol calls on a frame's masker."""

    def pointer(self) -> int: ...

    def reset(self) -> None: ...

    def process(self, data: bytes) -> bytes: ...


class IntegerUnmasker:
    """
    Unmasks one frame's payload, given in one piece or several, with the
    methods Autobahn's protocol calls on its maskers (C{pointer}, C{reset},
    C{process}).
    """

    __slots__ = ("_key", "_position")

    def __init__(self, key: bytes) -> None:
        if len(key) != 4:
            raise ValueError(f"a WebSocket masking key has 4 bytes, not {len(key)}")
        self._key = bytes(key)
        self._position = 0

    def pointer(self) -> int:
        """How many payload bytes were unmasked so far."""
        return self._position

    def reset(self) -> None:
        self._position = 0

    def process(self, data: bytes) -> bytes:
        """The next piece of the payload, unmasked."""
        length = len(data)
        if not length:
            return b""
        shift = self._position & 3
        self._position += length
        key = self._key[shift:] + self._key[:shift] if shift else self._key
        return _xorIntegers(key, data)


def unmask(key: bytes, payload: bytes) -> bytes:
    """
    A whole frame's payload, unmasked with C{key}: one XOR of two integers
    for a small one; for the rest, numpy's XOR once something else has
    imported numpy (the audio path does when RPEngine connects; an idle
    daemon does without it), else Autobahn's NVX.  numpy takes 4.6 us for a
    12 KB speech chunk where NVX, set up per frame through cffi, takes 8.1.
    """
    length = len(payload)
    if length > SMALL_PAYLOAD:
        numpy = sys.modules.get("numpy")
        if numpy is None:
            return cast(bytes, create_xor_masker(key, length).process(payload))
        stream = numpy.frombuffer(key * ((length >> 2) + 1), numpy.uint8, length)
        return cast(
            bytes, numpy.bitwise_xor(numpy.frombuffer(payload, numpy.uint8), stream).tobytes()
        )
    if not length:
        return b""
    return _xorIntegers(key, payload)


def _xorIntegers(key: bytes, data: bytes) -> bytes:
    """
    C{data} XORed with C{key} repeated from its first byte, as one XOR of
    two Python integers (C{data} not empty).
    """
    length = len(data)
    stream = (key * ((length >> 2) + 1))[:length]
    return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(
        length, "little"
    )


def unmasker(key: bytes, length: int) -> Masker:
    """
    The masker for a frame of C{length} payload bytes masked with C{key}:
    L{IntegerUnmasker} for a small one, Autobahn's for the rest.
    """
    if length <= SMALL_PAYLOAD:
        return IntegerUnmasker(key)
    return cast(Masker, create_xor_masker(key, length))
