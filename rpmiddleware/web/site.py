"""
The HTTP face of the listener: one twisted.web site on one loopback port,
WebSocket endpoints at their fixed paths and 404 for everything else.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.resource import WebSocketResource
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.web.http import HTTPChannel
from twisted.web.resource import NoResource, Resource
from twisted.web.server import Site

from rpmiddleware.web.websocket import OPEN_HANDSHAKE_TIMEOUT

ENGINE_PATH = b"/rp-engine/socket"
CLIENT_PATH = b"/client/socket"

#: Seconds an HTTP connection may idle before an upgrade.
HTTP_TIMEOUT = 30
#: Seconds a peer has to send a whole request head (the upgrade request),
#: however slowly it trickles in: the idle timeout above restarts with every
#: byte, so alone it does not stop a slowloris.
HEADER_TIMEOUT = OPEN_HANDSHAKE_TIMEOUT


class GuardedChannel(HTTPChannel):
    """
    An HTTP channel whose every request head must arrive within the site's
    C{headerTimeout} seconds (from the connection, or from the end of the
    previous request), or the connection is dropped.
    """

    log = Logger()
    _headDeadline: IDelayedCall | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        self._armHeadDeadline()

    def _armHeadDeadline(self) -> None:
        timeout = getattr(getattr(self, "site", None), "headerTimeout", None)
        if timeout and self._headDeadline is None:
            self._headDeadline = self.callLater(timeout, self._headTooSlow)

    def _cancelHeadDeadline(self) -> None:
        if self._headDeadline is not None and self._headDeadline.active():
            self._headDeadline.cancel()
        self._headDeadline = None

    def allHeadersReceived(self) -> None:
        self._cancelHeadDeadline()
        super().allHeadersReceived()

    def requestDone(self, request: Any) -> None:
        super().requestDone(request)
        if self.transport is not None and self.persistent:
            self._armHeadDeadline()

    def _headTooSlow(self) -> None:
        self._headDeadline = None
        if self.transport is not None:
            self.log.warn(
                "dropped {peer}: no complete request within {timeout} s",
                peer=str(self.transport.getPeer()),
                timeout=getattr(getattr(self, "site", None), "headerTimeout", None),
            )
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Any = None) -> None:
        self._cancelHeadDeadline()
        super().connectionLost(reason)


class ExactPathWebSocketResource(WebSocketResource):
    """
    A WebSocket endpoint at its exact path only.  Autobahn's resource is a
    leaf, so on its own it would also upgrade C{/rp-engine/socket/} and
    C{/rp-engine/socket/..}: anything below it answers 404 here.
    """

    def render(self, request: Any) -> Any:
        if request.postpath:
            return NoResource().render(request)
        return super().render(request)


def _mount(root: Resource, path: bytes, leaf: Resource) -> None:
    parts = path.strip(b"/").split(b"/")
    node = root
    for part in parts[:-1]:
        child = node.children.get(part)
        if child is None:
            child = Resource()
            node.putChild(part, child)
        node = child
    node.putChild(parts[-1], leaf)


def buildSite(
    endpoints: dict[bytes, Any],
    pages: dict[bytes, Resource] | None = None,
    reactor: Any = None,
) -> Site:
    """
    A site serving each WebSocket factory in C{endpoints} at its path, and
    any C{pages} (the console) beside them; its HTTP timeouts run on
    C{reactor} (the global reactor if not given).
    """
    root = Resource()
    for path, factory in endpoints.items():
        _mount(root, path, ExactPathWebSocketResource(factory))  # type: ignore[arg-type]
    for path, page in (pages or {}).items():
        _mount(root, path, page)
    site = Site(root, timeout=HTTP_TIMEOUT, reactor=reactor)
    # HTTP/1.1 only (HTTP/2 needs TLS, which a loopback listener never has).
    site.protocol = GuardedChannel  # type: ignore[assignment]
    site.headerTimeout = HEADER_TIMEOUT  # type: ignore[attr-defined]
    site.displayTracebacks = False
    return site
