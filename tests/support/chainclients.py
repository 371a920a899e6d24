"""
A client of the endpoint talking to the daemon's chain and a simulated
RPEngine, all in memory on a Clock, with a character set: the rig of the
end-to-end tests of plugins that tell the client something beside the reply
(feelings, speech marks).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock

from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.client.connection import ClientConnection
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.testing.inmemory import InMemoryEngine, connectInMemory
from rpmiddleware.testing.simoptions import SimulatorOptions
from tests.support.client import clockedEndpoint
from tests.support.connections import FakeClientWriter, OpenConnections
from tests.support.memory import settle


def memorySettings() -> Settings:
    """
    The daemon's settings with the memory plugin in memory and without
    summaries, so that a test leaves no file and schedules no summary.
    """
    settings = Settings()
    settings.plugins["memory"] = {"path": ":memory:", "summaries": False}
    return settings


class ChainClientRig:
    """
    A mixin for a test case: L{startClients} sets C{middleware}, C{link}
    (the simulated RPEngine's), C{clients}, and the one client's
    C{connection} and C{writer}.
    """

    clock: Clock
    middleware: Middleware
    link: InMemoryEngine
    clients: OpenConnections
    connection: ClientConnection
    writer: FakeClientWriter

    def startClients(
        self, settings: Settings, simulator: SimulatorOptions, card: dict[str, Any]
    ) -> None:
        """
        Start the daemon from C{settings} with C{simulator} as RPEngine,
        connect a client whose extension messages reach it, and set the
        character C{mira} with C{card}.
        """
        self.middleware = Middleware.fromSettings(self.clock, settings)
        self.link = connectInMemory(self.middleware, self.clock, simulator)
        endpoint = clockedEndpoint(self.middleware, settings, self.clock)
        self.clients = OpenConnections(endpoint, self.clock)
        self.middleware.router.observe(ExtensionBridge(self.clients))
        settle(self.clock, 0.1)
        self.connection, self.writer = self.clients.connect()
        self.clients.say(self.connection, type="character", characterId="mira", card=card)
