"""
Reading a client's whole, ordinary frames without Autobahn's frame machine.

Nearly every frame a peer sends the middleware is a whole message in one
frame: FIN set, no extension bits, text or binary, masked (RFC 6455 requires
a client to mask), under 64 KB, and usually whole in the bytes one read
returns.  Autobahn reads each of those through its general machine: the
frame is appended to a buffer, the buffer re-sliced (copying what follows),
and a dozen hooks called (frame begin, data and end, message begin, frame
data and end, message end) with their checks.  py-spy put that at about a
fifth of the server's samples at 250 heavy voice streams.

L{WholeFrameReader} takes those frames straight from the bytes read to
C{onMessage}, and gives Autobahn everything else, from the first byte it
does not take: a fragment, a control frame (ping, close), an unmasked or
reserved frame, a frame over the size limits or longer than 64 KB, any
state but open, and any connection with an extension, auto-ping, frame
logging or txaio at debug.  So errors, limits and the close handshake are
Autobahn's own, word for word; only the common case is quicker.

A read that ends inside an ordinary frame (RPEngine's one connection carries
every stream, so most of its reads do) leaves that frame's bytes in
Autobahn's buffer, with no frame begun; the next read starts with them, and
if Autobahn reads next instead, they are simply the start of its buffer.  A
frame still not whole after that second read is Autobahn's.

What it reads and sets of Autobahn's protocol (L{_Reading}, the options, the
traffic counters) is not Autobahn's public API: setup.cfg pins Autobahn to
the versions checked, and C{tests/test_framereader.py} (C{AutobahnInternalsTests})
fails naming each one a newer Autobahn lacks.
"""

from __future__ import annotations

from typing import Any, Protocol

import txaio

from rpmiddleware.web.framemask import unmask

_TEXT_WHOLE = 0x81
_BINARY_WHOLE = 0x82
_MASKED = 0x80
#: The 7-bit length that says a 16-bit length follows.
_LENGTH16 = 126
#: Two header bytes and a masking key.
_SHORT_HEADER = 6
#: The same with a 16-bit length.
_LENGTH16_HEADER = 8


_DEBUG_LEVELS = frozenset(("debug", "trace"))


def autobahnDebugging() -> bool:
    """
    Whether Autobahn's debug lines are logged (txaio's level is global):
    then its own reads and writes run, which log them.
    """
    return txaio.get_global_log_level() in _DEBUG_LEVELS  # type: ignore[attr-defined]


class _Reading(Protocol):
    """
    What L{WholeFrameReader} uses of the Autobahn protocol it is mixed into
    (besides the options Autobahn copies onto it from its factory, which
    mypy does not see).
    """

    state: int
    STATE_OPEN: int
    data: bytes
    current_frame: Any
    inside_message: bool
    websocket_extensions_in_use: list[Any]
    trackedTimings: Any
    trafficStats: Any

    def onMessage(self, payload: bytes, isBinary: bool) -> None: ...

    def consumeData(self) -> None: ...


def _payloadCap(options: Any) -> int:
    """
    The longest payload read here: a 16-bit length, within both of
    Autobahn's limits (0 is no limit).
    """
    cap = 0xFFFF
    for limit in (options.maxFramePayloadSize, options.maxMessagePayloadSize):
        if 0 < limit < cap:
            cap = limit
    return cap


class WholeFrameReader:
    """
    A server protocol's reads, taking whole ordinary frames itself (put it
    first among the bases, before the class whose C{dataReceived} gives
    bytes to Autobahn).
    """

    def dataReceived(self: _Reading, data: bytes) -> None:
        options: Any = self
        if (
            self.state != self.STATE_OPEN
            or self.current_frame is not None
            or self.inside_message
            or self.websocket_extensions_in_use
            or options.autoPingInterval
            or options.logOctets
            or options.logFrames
            or self.trackedTimings
            or autobahnDebugging()
        ):
            super().dataReceived(data)  # type: ignore[misc]  # the next base's
            return
        # Counted as Autobahn counts a read, whoever reads it.
        stats = self.trafficStats
        stats.incomingOctetsWireLevel += len(data)
        joined = bool(self.data)
        if joined:
            # The start of a frame that the last read cut (no frame is begun).
            data = self.data + data
            self.data = b""
        end = len(data)
        cap = _payloadCap(options)
        position = 0
        # Whether the bytes left are only the start of an ordinary frame,
        # kept for the next read rather than given to Autobahn.
        waiting = True
        while position < end:
            first = data[position]
            if first != _TEXT_WHOLE and first != _BINARY_WHOLE:
                waiting = False
                break
            if end - position < 2:
                break
            second = data[position + 1]
            if second < _MASKED:
                waiting = False
                break
            length = second - _MASKED
            if length < _LENGTH16:
                start = position + _SHORT_HEADER
            elif length == _LENGTH16:
                if end - position < 4:
                    break
                length = (data[position + 2] << 8) | data[position + 3]
                # Not the shortest encoding: Autobahn refuses it.
                waiting = length >= _LENGTH16
                start = position + _LENGTH16_HEADER
            else:
                waiting = False
            if not waiting or length > cap:
                waiting = False
                break
            stop = start + length
            if stop > end:
                break
            payload = unmask(data[start - 4 : start], data[start:stop])
            stats.incomingOctetsWebSocketLevel += length
            stats.incomingOctetsAppLevel += length
            stats.incomingWebSocketFrames += 1
            stats.incomingWebSocketMessages += 1
            position = stop
            self.onMessage(payload, first == _BINARY_WHOLE)
            if self.state != self.STATE_OPEN:
                waiting = False
                break
        if position < end:
            self.data = data[position:] if position else data
            # A frame that two reads did not complete goes to Autobahn, which
            # takes its payload piece by piece: joining every read to it
            # would copy a large frame sent in small pieces over and over.
            if not waiting or (joined and not position):
                self.consumeData()
