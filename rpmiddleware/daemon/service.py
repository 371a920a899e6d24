"""
Services for C{twistd rpmiddleware}: the loopback listener, the chain's
plugins (closed when the daemon stops), and L{makeMiddlewareService}, which
wires them with the engine's file mailbox when it is asked for.  (The demo's
service is L{rpmiddleware.testing.demo}.)
"""

from __future__ import annotations

import errno
from typing import Any

from twisted.application import service
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web.server import Site

from rpmiddleware.client.websocket import ClientFactory
from rpmiddleware.config.settings import Settings
from rpmiddleware.console import mountConsole
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.engine.mailbox.service import MailboxOptions, MailboxService
from rpmiddleware.engine.websocket import EngineFactory
from rpmiddleware.web.site import CLIENT_PATH, ENGINE_PATH, buildSite


class ListenerService(service.Service):
    """
    Listens on the loopback interface; a port in use stops start-up with a
    sentence instead of a traceback, and start-up logs the endpoints and the
    link that opens RPEngine on the port actually bound (C{--port 0}).

    Twisted's own services cannot give the bound port with public API, which
    is why this thin service stays: C{strports.service} does raise a
    listening error at start-up (the sentence could wrap it), but keeps the
    port it bound in the private C{_waitingForPort} (C{internet.TCPServer}: in
    C{_port}), and the port actually bound (C{--port 0} binds any) is needed
    as C{port} by the log line and RPEngine's link here, the demo
    (L{rpmiddleware.testing.demo}), the console and
    L{rpmiddleware.testing.live}.
    """

    log = Logger()
    port: IListeningPort | None = None

    def __init__(
        self, reactor: Any, site: Site, settings: Settings, factories: dict[bytes, Any]
    ) -> None:
        self.reactor = reactor
        self.site = site
        self.settings = settings
        #: The WebSocket factories by path, for connection counts and shutdown.
        self.factories = factories

    def privilegedStartService(self) -> None:
        server = self.settings.server
        try:
            self.port = self.reactor.listenTCP(server.port, self.site, interface=server.interface)
        except CannotListenError as e:
            inUse = getattr(e.socketError, "errno", None) == errno.EADDRINUSE
            why = (
                "the port is already in use (is another rpmiddleware or game running?)"
                if inUse
                else str(e.socketError)
            )
            raise SystemExit(
                f"rpmiddleware: cannot listen on {server.interface}:{server.port}: {why}. "
                "Choose another port with --port (and the same port in RPEngine's settings)."
            )
        super().privilegedStartService()

    def startService(self) -> None:
        super().startService()
        assert self.port is not None
        address: Any = self.port.getHost()
        self.log.info(
            "rpmiddleware listening on ws://{host}:{port}/rp-engine/socket "
            "(RPEngine) and ws://{host}:{port}/client/socket (games)",
            host=address.host,
            port=address.port,
        )
        self.log.info(
            "Open RPEngine at https://rpengine.gemtavern.com/#port={port} to connect it",
            port=address.port,
            link=f"https://rpengine.gemtavern.com/#port={address.port}",
        )

    def stopService(self) -> Any:
        super().stopService()
        if self.port is not None:
            port, self.port = self.port, None
            return port.stopListening()
        return None


class PluginsService(service.Service):
    """
    The chain's plugins, closed when the daemon stops
    (L{Middleware.close}: every plugin's C{close}, bounded, each isolated).
    C{stopService} returns the Deferred twistd's service collection waits
    for before the reactor stops.
    """

    def __init__(self, middleware: Middleware) -> None:
        self.middleware = middleware

    def stopService(self) -> Any:
        super().stopService()
        return self.middleware.close()


def makeMiddlewareService(
    reactor: Any, settings: Settings, middleware: Middleware | None = None
) -> tuple[service.MultiService, Middleware]:
    """
    The listener and everything behind it, ready for twistd or a test.

    @raise rpmiddleware.config.settings.ConfigError: for unusable settings, such as a
        default character file that is not a valid card.
    """
    middleware = middleware or Middleware.fromSettings(reactor, settings)
    endpoints: dict[bytes, Any] = {
        ENGINE_PATH: EngineFactory(reactor, middleware, settings),
        CLIENT_PATH: ClientFactory(reactor, middleware, settings),
    }
    top = service.MultiService()
    # First in, so told to stop last: the plugins close after the others were told.
    plugins = PluginsService(middleware)
    plugins.setName("plugins")
    plugins.setServiceParent(top)
    site = buildSite(endpoints, mountConsole(middleware, endpoints, top), reactor)
    listener = ListenerService(reactor, site, settings, endpoints)
    listener.setName("listener")
    listener.setServiceParent(top)
    if settings.engine.mailbox:
        mailboxService(reactor, middleware, settings).setServiceParent(top)
    return top, middleware


def mailboxService(reactor: Any, middleware: Middleware, settings: Settings) -> MailboxService:
    """
    RPEngine's file mailbox in the configured folder, feeding the same
    engine link as the WebSocket endpoint.
    """
    engine = settings.engine
    options = MailboxOptions(
        path=str(settings.relativePath(engine.mailbox)),
        integrationId=settings.game.integration_id,
        displayName=f"rpmiddleware ({settings.game.integration_id})",
        slotCount=engine.mailbox_audio_slots,
        watch=engine.mailbox_watch,
    )
    return MailboxService(reactor, middleware, options)
