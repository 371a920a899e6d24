"""
The client endpoint's dispatch table, and the surface its handlers see of a
connection (rpmiddleware/client/surface.py).
"""

from __future__ import annotations

import inspect

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.client.connection import ClientConnection
from rpmiddleware.client.messages import CLIENT_TYPES
from rpmiddleware.client.surface import ClientSurface
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.timeline import Timeline
from tests.support.client import clockedEndpoint
from tests.support.connections import FakeClientWriter


def surfaceMembers() -> set[str]:
    """
    Every attribute, property and method the protocol declares.
    """
    names = set(getattr(ClientSurface, "__annotations__", {}))
    for name, value in vars(ClientSurface).items():
        if not name.startswith("_") and (callable(value) or isinstance(value, property)):
            names.add(name)
    return names


class DispatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        clock = Clock()
        settings = Settings()
        services = PluginServices(clock, settings, CardHasher(None), Timeline())
        self.middleware = Middleware(clock, settings, [], services)
        self.endpoint = clockedEndpoint(self.middleware, settings, clock)

    def test_everyTypeHandled(self) -> None:
        """
        The endpoint's table has a handler for every client message type and
        for nothing else.
        """
        self.assertEqual(sorted(self.endpoint.handlers), sorted(CLIENT_TYPES))

    def test_handlersTakeTheSurface(self) -> None:
        """
        Every handler takes the connection as its first argument and the
        message as its second, whichever module it lives in.
        """
        for kind, handler in self.endpoint.handlers.items():
            parameters = list(inspect.signature(handler).parameters)
            self.assertEqual(len(parameters), 2, kind)

    def test_connectionProvidesTheSurface(self) -> None:
        """
        A connection has every member of the surface (mypy checks the types
        where connections are passed as surfaces; this checks that nothing
        is missing at run time).
        """
        connection = ClientConnection(self.endpoint, FakeClientWriter(), "tcp4:127.0.0.1:5000")
        members = surfaceMembers()
        self.assertIn("submit", members)
        for name in sorted(members):
            self.assertTrue(hasattr(connection, name), name)
