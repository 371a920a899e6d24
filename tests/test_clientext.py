"""
Client messages that belong to plugins (rpmiddleware.plugin.clientext): a plugin
names its types, the endpoint accepts them while it is in the chain and
hands them over through the chain, and the plugin's answers reach the
connection of the client that asked.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.base import ChainPlugin
from rpmiddleware.plugin.clientext import clientMessage, toClient
from rpmiddleware.plugin.interfaces import IChainContext, IClientExtension, IEnvelopePlugin
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import exampleCard
from tests.support.client import clockedEndpoint
from tests.support.connections import OpenConnections


@implementer(IEnvelopePlugin, IClientExtension)
class Mood(ChainPlugin):
    """A third party's plugin with a client message of its own."""

    name = "mood"
    clientMessageTypes = ("mood",)

    def __init__(self) -> None:
        self.ended: list[str] = []

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        self.ended.append(clientId)

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        message = clientMessage(envelope, self.clientMessageTypes)
        if message is None:
            return envelope
        client = envelope.meta["client"]
        context.sendToGame(toClient(client, {"type": "mood-is", "mood": message.get("ask")}))
        return None


class Rig:
    def __init__(self, *plugins: Any) -> None:
        self.clock = Clock()
        settings = Settings()
        services = PluginServices(self.clock, settings, CardHasher(None), Timeline())
        self.middleware = Middleware(self.clock, settings, list(plugins), services)
        self.endpoint = clockedEndpoint(self.middleware, settings, self.clock)
        self.clients = OpenConnections(self.endpoint, self.clock)
        self.middleware.router.observe(ExtensionBridge(self.clients))
        self.connect = self.clients.connect
        self.say = self.clients.say


class ExtensionTests(SynchronousTestCase):
    def test_pluginAnswersItsClient(self) -> None:
        rig = Rig(Mood())
        first, firstWriter = rig.connect()
        _, otherWriter = rig.connect()
        rig.say(first, type="mood", ask="calm")
        self.assertEqual(firstWriter.sent[-1], {"type": "mood-is", "mood": "calm"})
        self.assertNotIn("mood-is", [m["type"] for m in otherWriter.sent])

    def test_sessionEndReachesExtensions(self) -> None:
        mood = Mood()
        rig = Rig(mood, ChainPlugin())
        connection, _ = rig.connect()
        connection.lost()
        rig.clock.advance(rig.endpoint.settings.session_ttl)
        rig.endpoint.sessions.sweep()
        self.assertEqual(mood.ended, [connection.session.id])

    def test_unknownWithoutThePlugin(self) -> None:
        rig = Rig()
        connection, writer = rig.connect()
        rig.say(connection, type="mood", ask="calm")
        error = writer.sent[-1]
        self.assertEqual((error["type"], error["code"]), ("error", "INVALID_MESSAGE"))
        self.assertIn("unknown message type 'mood'", error["message"])

    def test_knownTypesListTheExtensions(self) -> None:
        rig = Rig(Mood())
        connection, writer = rig.connect()
        rig.say(connection, type="moood")
        self.assertIn("mood", writer.sent[-1]["message"].split("known: ")[1])

    def test_protocolTypesCannotBeTaken(self) -> None:
        @implementer(IEnvelopePlugin, IClientExtension)
        class Greedy(ChainPlugin):
            name = "greedy"
            clientMessageTypes = ("text",)

        rig = Rig(Greedy())
        self.assertNotIn("text", rig.endpoint.extensions)

    def test_memoryMessageOverTheEndpoint(self) -> None:
        from rpmiddleware.builtin.memory import memory

        clock = Clock()
        services = PluginServices(clock, Settings(), CardHasher(None), Timeline())
        rig = Rig(memory.buildPlugin({"path": ":memory:"}, services))
        connection, writer = rig.connect()
        rig.say(connection, type="memory", op="pin", id=1, characterId="mira", fact="Alex.")
        answer = writer.sent[-1]
        self.assertEqual((answer["type"], answer["op"], answer["id"]), ("memory-result", "pin", 1))
        self.assertEqual(answer["fact"]["text"], "Alex.")
        self.assertEqual(answer["conversationId"], f"session:{connection.session.id}")

    def test_memoryOpsUseTheCharactersIntegration(self) -> None:
        """
        A memory op of a client whose character names its integration
        (C{character}'s C{integrationId}) keeps that integration's
        conversation, not the daemon's default integration's (issue 32).
        """
        from rpmiddleware.builtin.memory import Memory, memory

        clock = Clock()
        services = PluginServices(clock, Settings(), CardHasher(None), Timeline())
        plugin = memory.buildPlugin({"path": ":memory:"}, services)
        assert isinstance(plugin, Memory)
        rig = Rig(plugin)
        connection, writer = rig.connect()
        rig.say(
            connection,
            type="character",
            characterId="mira",
            integrationId="north-game",
            card=exampleCard(),
        )
        rig.say(connection, type="memory", op="pin", id=1, characterId="mira", fact="Alex.")
        self.assertEqual(writer.sent[-1]["type"], "memory-result")
        self.assertEqual(
            [(c["integrationId"], c["facts"]) for c in plugin.conversations("north-game")],
            [("north-game", 1)],
        )
        self.assertEqual(plugin.conversations(Settings().game.integration_id), [])
        rig.say(connection, type="memory", op="read", id=2, characterId="mira")
        answer = writer.sent[-1]
        self.assertEqual((answer["type"], answer["id"]), ("memory-result", 2))
        self.assertEqual([f["text"] for f in answer["conversation"]["facts"]], ["Alex."])
