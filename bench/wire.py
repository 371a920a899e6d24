"""
The benchmark driver's own framing: whole frames read and written without
Autobahn's frame machine once a connection is open.

The driver plays RPEngine and every client of a load on one core.  At 250
heavy voice streams py-spy put Autobahn's machine at about a quarter of the
driver's samples reading (a dozen hooks per frame) and a sixth writing (an
NVX masker set up per frame), and the driver at 62-86% of its core.  A busy
driver reads late and writes in bursts, so the servers it measures see a
load lumpier than RPEngine's, and the delays it times include its own
queue.  These two paths keep it well below that.

The servers see the same bytes as from Autobahn: each message one masked
frame, FIN set, the shortest length, a fresh random key.  Anything else
(a control frame, a fragment, any state but open) is Autobahn's, as in
L{rpmiddleware.web.framereader}, which does the same for the server's side.
"""

from __future__ import annotations

from random import randbytes
from typing import Any

from rpmiddleware.web.framemask import unmask

_TEXT_WHOLE = 0x81
_BINARY_WHOLE = 0x82
_MASKED = 0x80
_LENGTH16 = 126
_LENGTH64 = 127


def maskedFrame(payload: bytes) -> bytes:
    """
    A text message as one masked frame, as a client sends it (RFC 6455 5.2).
    """
    length = len(payload)
    if length < _LENGTH16:
        head = bytes((_TEXT_WHOLE, _MASKED | length))
    elif length <= 0xFFFF:
        head = bytes((_TEXT_WHOLE, _MASKED | _LENGTH16)) + length.to_bytes(2, "big")
    else:
        head = bytes((_TEXT_WHOLE, _MASKED | _LENGTH64)) + length.to_bytes(8, "big")
    key = randbytes(4)
    return head + key + unmask(key, payload)


class WholeFrames:
    """
    A client protocol's reads and text sends for whole frames (put it first
    among the bases of an Autobahn client protocol).
    """

    def dataReceived(self, data: bytes) -> None:
        this: Any = self
        if this.state != this.STATE_OPEN or this.current_frame is not None or this.inside_message:
            super().dataReceived(data)  # type: ignore[misc]  # the next base's
            return
        if this.data:
            data = this.data + data
            this.data = b""
        end = len(data)
        position = 0
        ordinary = True
        while end - position >= 2:
            first = data[position]
            length = data[position + 1]
            if (first != _TEXT_WHOLE and first != _BINARY_WHOLE) or length >= _MASKED:
                ordinary = False
                break
            start = position + 2
            if length >= _LENGTH16:
                size = 2 if length == _LENGTH16 else 8
                if end - start < size:
                    break
                length = int.from_bytes(data[start : start + size], "big")
                start += size
            stop = start + length
            if stop > end:
                break
            position = stop
            this.onMessage(data[start:stop], first == _BINARY_WHOLE)
            if this.state != this.STATE_OPEN:
                ordinary = False
                break
        if position < end:
            this.data = data[position:]
            if not ordinary:
                this.consumeData()

    def sendText(self, payload: bytes) -> None:
        """One text message, as one masked frame."""
        this: Any = self
        if this.state != this.STATE_OPEN or this.transport is None:
            this.sendMessage(payload, isBinary=False)
            return
        this.transport.write(maskedFrame(payload))
