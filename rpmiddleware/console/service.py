"""
Mounting the console beside the WebSocket endpoints: its pages, C{/metrics},
the status hub of the client endpoint, and admitting the page's own origin
on C{/client/socket} (only there: the console is not RPEngine).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.application import service
from twisted.logger import Logger
from twisted.web.resource import Resource

from rpmiddleware.client.status import StatusHub, attachHub
from rpmiddleware.console.metrics import MetricsResource, MiddlewareMetrics
from rpmiddleware.console.pages import IndexPage, LoopbackOnly, StaticDirectory
from rpmiddleware.core.view import CoreView
from rpmiddleware.web.site import CLIENT_PATH

INDEX_PATH = b"/"
FILES_PATH = b"/console"
METRICS_PATH = b"/metrics"


class ConsoleService(service.Service):
    """
    Owns what the console watches with, so that it stops with the listener.

    @ivar metrics: the middleware's L{MiddlewareMetrics}.
    @ivar hub: the client endpoint's L{StatusHub}, if there is a client endpoint.
    """

    log = Logger()

    def __init__(self, metrics: MiddlewareMetrics, hub: StatusHub | None) -> None:
        self.metrics = metrics
        self.hub = hub
        self.setName("console")

    def startService(self) -> None:
        super().startService()
        listener: Any = self.parent.getServiceNamed("listener") if self.parent else None
        port = getattr(listener, "port", None)
        if port is not None:
            address: Any = port.getHost()
            self.log.info(
                "Console at http://{host}:{port}/ (metrics at /metrics)",
                host=address.host,
                port=address.port,
            )

    def stopService(self) -> Any:
        super().stopService()
        if self.hub is not None:
            self.hub.stop()
        return None


def _openConnections(factory: Any) -> Any:
    def connections() -> list[Any]:
        found = (getattr(p, "connection", None) for p in list(factory.connections))
        return [c for c in found if c is not None]

    return connections


def mountConsole(
    middleware: CoreView, endpoints: Mapping[bytes, Any], parent: service.MultiService
) -> dict[bytes, Resource]:
    """
    Everything the console needs, with a L{ConsoleService} under C{parent}.

    @param endpoints: the WebSocket factories by path, as given to
        L{rpmiddleware.web.site.buildSite}.
    @return: the pages by path, for L{rpmiddleware.web.site.buildSite}.
    """
    metrics = MiddlewareMetrics(middleware, endpoints)
    hub = None
    client = endpoints.get(CLIENT_PATH)
    if client is not None:
        client.allowListenerOrigin = True
        hub = attachHub(client.endpoint, _openConnections(client))
    ConsoleService(metrics, hub).setServiceParent(parent)
    return {
        INDEX_PATH: LoopbackOnly(IndexPage()),
        FILES_PATH: LoopbackOnly(StaticDirectory()),
        METRICS_PATH: LoopbackOnly(MetricsResource(metrics)),
    }
