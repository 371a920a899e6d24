"""
What both WebSocket endpoints share: loopback manners, origin allow-lists,
size and connection limits, and TCP_NODELAY actually set.

Autobahn's own C{connectionMade} tries to set TCP_NODELAY before the
factory's options reach the protocol and swallows the error, so small paced
messages (text deltas, audio chunks) wait for delayed ACKs.  We set it on the
transport ourselves, after Autobahn is done.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, cast

import txaio
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest

from rpmiddleware.web.framemask import unmasker
from rpmiddleware.web.framereader import WholeFrameReader, autobahnDebugging

#: Seconds a peer gets to finish the opening handshake (slowloris guard).
OPEN_HANDSHAKE_TIMEOUT = 10.0
CLOSE_HANDSHAKE_TIMEOUT = 5.0
SERVICE_UNAVAILABLE = 503


def normalizeOrigin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def listenerOrigins(port: int) -> frozenset[str]:
    """
    The origins of pages served by the loopback listener on C{port} itself.
    """
    return frozenset(f"http://{host}:{port}" for host in ("127.0.0.1", "localhost", "[::1]"))


class GuardedServerFactory(WebSocketServerFactory):
    """
    A server factory with the limits set explicitly (Autobahn's payload limits
    default to unlimited) and an origin allow-list.

    @ivar allowListenerOrigin: also admit pages served by this very listener
        (the console): C{listenerOrigins} of the port a connection came in on.

    @param allowedOrigins: browser origins that may connect.
    @param allowMissingOrigin: whether a peer that sends no Origin header (a
        native program, not a browser) may connect.
    """

    def __init__(
        self,
        reactor: Any,
        allowedOrigins: Iterable[str],
        allowMissingOrigin: bool,
        maxMessageBytes: int,
        connectionLimit: int,
        endpointName: str,
    ) -> None:
        super().__init__(reactor=reactor)
        self.originAllowList = frozenset(normalizeOrigin(o) for o in allowedOrigins)
        self.allowMissingOrigin = allowMissingOrigin
        # Not "maxConnections": Autobahn has an option of that name, which
        # would refuse first, with its own message.
        self.connectionLimit = connectionLimit
        self.endpointName = endpointName
        self.allowListenerOrigin = False
        self.connections: set[GuardedServerProtocol] = set()
        self.setProtocolOptions(
            maxMessagePayloadSize=maxMessageBytes,
            maxFramePayloadSize=maxMessageBytes,
            openHandshakeTimeout=OPEN_HANDSHAKE_TIMEOUT,
            closeHandshakeTimeout=CLOSE_HANDSHAKE_TIMEOUT,
            tcpNoDelay=True,
            # Close with a code (1009 for a huge message) rather than dropping
            # the TCP connection, so the peer learns what it did wrong.
            failByDrop=False,
            # Origins are checked by us with a clear refusal, not by Autobahn.
            allowedOrigins=["*"],
            # Text is checked whole by GuardedServerProtocol.textOf, which
            # the JSON reader needs anyway: Autobahn's incremental validator
            # took 38 us for a 12 KB speech chunk and 2.5 ms for a 0.77 MB
            # recording, CPython's decoder 1.3 us and 0.04 ms.
            utf8validateIncoming=False,
            # Autobahn then leaves client frames masked, and
            # GuardedServerProtocol.onFrameBegin gives each frame the masker
            # of rpmiddleware.web.framemask (the server masks nothing it sends).
            applyMask=False,
        )


#: RFC 6455's close code for a text message that is not UTF-8.
CLOSE_INVALID_PAYLOAD = 1007
#: The longest close reason a WebSocket close frame carries (RFC 6455).
MAX_CLOSE_REASON = 123


class _Framing(Protocol):
    """What L{QuietFraming} uses of the Autobahn protocol it is mixed into."""

    transport: Any
    send_queue: Any
    state: int
    STATE_OPEN: int
    STATE_CONNECTING: int
    STATE_PROXY_CONNECTING: int
    trafficStats: Any

    def _dataReceived(self, data: bytes) -> None: ...


class QuietFraming:
    """
    Autobahn's reads and writes without its per-frame debug line, for a
    server or a client protocol (put it first among the bases).

    Autobahn's C{dataReceived} and C{sendData} log a debug line for every
    read and write, and build its arguments (C{hltype}, C{hlval}:
    C{click.style}) before the logger, off at info, drops them: 5% of the
    server's CPU at 100 heavy voice streams (py-spy), and 8% of the load
    benchmark's driver at 250.  These do the same without the line unless
    txaio logs at debug or below.
    """

    # Autobahn logs every frame at debug level through C{self.log}.  A
    # txaio logger honours txaio's global level (info under twistd), so
    # those calls are no-ops; a plain Twisted Logger here would emit an event
    # per frame, which every observer then formats or filters.
    log = txaio.make_logger()  # type: ignore[attr-defined]

    def dataReceived(self: _Framing, data: bytes) -> None:
        if autobahnDebugging():
            super().dataReceived(data)  # type: ignore[misc]  # the protocol's, after this mixin
            return
        self._dataReceived(data)

    def sendData(
        self: _Framing, data: bytes, sync: bool = False, chopsize: int | None = None
    ) -> None:
        transport = self.transport
        if (
            sync
            or chopsize
            or self.send_queue
            or transport is None
            or getattr(self, "logOctets", False)
            or autobahnDebugging()
        ):
            super().sendData(data, sync, chopsize)  # type: ignore[misc]
            return
        transport.write(data)
        state = self.state
        if state == self.STATE_OPEN:
            self.trafficStats.outgoingOctetsWireLevel += len(data)
        elif state == self.STATE_CONNECTING or state == self.STATE_PROXY_CONNECTING:
            self.trafficStats.preopenOutgoingOctetsWireLevel += len(data)


# Autobahn's own bases disagree on the types of peer and _transport_details,
# which mypy checks in any class with a second base.
class GuardedServerProtocol(WholeFrameReader, QuietFraming, WebSocketServerProtocol):  # type: ignore[misc]
    factory: GuardedServerFactory
    #: Set once a text message was not UTF-8: the connection is failing,
    #: and nothing more it sends is read.
    failedPayload = False

    def textOf(self, payload: bytes) -> str | None:
        """
        A text message as text; C{None} when it is not UTF-8, after failing
        the connection with 1007 as RFC 6455 says an endpoint must (and for
        every message after it, which is not read).
        """
        if self.failedPayload:
            return None
        try:
            return payload.decode("utf-8")
        except UnicodeDecodeError as e:
            self.failedPayload = True
            reason = f"text message is not UTF-8 (byte {e.start}: {e.reason})"
            self.log.warn(
                "closing a connection to {endpoint} from {peer}: {reason}",
                endpoint=self.factory.endpointName,
                peer=self.peer,
                reason=reason,
            )
            self.closeWith(CLOSE_INVALID_PAYLOAD, reason)
            return None

    def closeWith(self, code: int, reason: str) -> None:
        """
        Start the closing handshake with any close code: Autobahn's
        C{sendClose} takes only 1000 and 3000-4999, not the protocol's own
        (1007, 1008), which its frame-level call sends as it does itself.
        """
        if self.state == self.STATE_OPEN:
            self.sendCloseFrame(code, reason.encode("utf-8")[:MAX_CLOSE_REASON])

    def onMessageEnd(self) -> None:
        """
        A message is whole: hand it to C{onMessage}, as Autobahn does, but
        without also firing its C{"message"} event, which makes a Deferred
        and adds callbacks to it for every message (3% of the server's time
        at 100 heavy streams, cProfile) for listeners added with C{on()}:
        the middleware adds none.
        """
        if not self.failedByMe:
            self.onMessage(b"".join(self.message_data), self.message_is_binary)
        self.message_data = None  # type: ignore[assignment]  # as Autobahn does

    def onFrameBegin(self) -> None:
        """
        A frame's header is read: unmask its payload with
        L{rpmiddleware.web.framemask}, which is quicker than Autobahn's masker
        for the small frames most messages are (the factory set
        C{applyMask=False}, so Autobahn made a pass-through one).
        """
        frame = self.current_frame
        if frame.mask is not None and frame.length:
            # Autobahn annotates the key as str; it is the header's 4 bytes.
            self.current_frame_masker = unmasker(cast(bytes, frame.mask), frame.length)
        super().onFrameBegin()

    def connectionMade(self) -> None:
        super().connectionMade()
        setNoDelay = getattr(self.transport, "setTcpNoDelay", None)
        if setNoDelay is not None:
            setNoDelay(True)

    def onConnect(self, request: ConnectionRequest) -> None:
        factory = self.factory
        origin = request.headers.get("origin")
        if origin is None:
            if not factory.allowMissingOrigin:
                self._refuse(request, ConnectionDeny.FORBIDDEN, "an Origin header is required")
        elif normalizeOrigin(origin) not in factory.originAllowList and not self._ownPage(origin):
            self._refuse(
                request, ConnectionDeny.FORBIDDEN, f"origin {origin[:200]} is not allowed here"
            )
        if len(factory.connections) >= factory.connectionLimit:
            self._refuse(
                request,
                SERVICE_UNAVAILABLE,
                f"too many connections to {factory.endpointName} (limit {factory.connectionLimit})",
            )

    def _ownPage(self, origin: str) -> bool:
        """
        Whether C{origin} is a page of this listener and the factory admits those.
        """
        if not self.factory.allowListenerOrigin or self.transport is None:
            return False
        port = getattr(self.transport.getHost(), "port", None)
        return isinstance(port, int) and normalizeOrigin(origin) in listenerOrigins(port)

    def _refuse(self, request: ConnectionRequest, code: int, reason: str) -> None:
        self.log.warn(
            "refused a connection to {endpoint} from {peer}: {reason}",
            endpoint=self.factory.endpointName,
            peer=request.peer,
            reason=reason,
        )
        raise ConnectionDeny(code, reason)

    def onOpen(self) -> None:
        self.factory.connections.add(self)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.connections.discard(self)
