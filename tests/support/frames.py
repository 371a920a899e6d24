"""
WebSocket frames built byte by byte from RFC 6455 (masked or not, any
header length), and the upgrade request that opens a connection.
"""

from __future__ import annotations

import struct


def masked(payload: bytes, key: bytes) -> bytes:
    """RFC 6455 5.3, byte by byte (the definition, not an optimisation)."""
    return bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def header(first: int, length: int, isMasked: bool = True, minimal: bool = True) -> bytes:
    maskBit = 0x80 if isMasked else 0
    if length < 126 and minimal:
        return struct.pack("!BB", first, maskBit | length)
    if length < 65536:
        return struct.pack("!BBH", first, maskBit | 126, length)
    return struct.pack("!BBQ", first, maskBit | 127, length)


def frame(
    payload: bytes,
    key: bytes,
    opcode: int = 1,
    fin: bool = True,
    rsv: int = 0,
    isMasked: bool = True,
    minimal: bool = True,
) -> bytes:
    """A client frame, masked with C{key} unless told otherwise."""
    first = (0x80 if fin else 0) | (rsv << 4) | opcode
    body = masked(payload, key) if isMasked else payload
    return header(first, len(payload), isMasked, minimal) + (key if isMasked else b"") + body


UPGRADE = (
    b"GET /socket HTTP/1.1\r\nHost: 127.0.0.1:9\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)
