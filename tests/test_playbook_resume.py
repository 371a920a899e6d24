"""
A client that takes its session back with C{reconnect} is told the playbook
stage the session is in: the client endpoint, the playbook plugin and the
bridge between them, without sockets, on a Clock.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.playbook import PlaybookPlugin
from rpmiddleware.builtin.playbook.parser import parsePlaybook
from rpmiddleware.builtin.playbook.wire import PREFIX
from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.client.connection import ClientConnection
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.envelope import Direction, Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import exampleCard
from tests.support.client import clockedEndpoint
from tests.support.connections import FakeClientWriter, OpenConnections

#: Mira's playbook: asking for work moves to "offer"; ten seconds of silence
#: there move on to "waited", with no turn (say = "").
PLAYBOOK: dict[str, Any] = {
    "name": "resume",
    "stages": {
        "greeting": {"transitions": [{"on": "player", "keywords": ["work"], "to": "offer"}]},
        "offer": {"transitions": [{"on": "idle", "after": 10, "to": "waited", "say": ""}]},
        "waited": {},
    },
}


class LeftChain:
    """
    A chain observer: every envelope that left the chain, either way.
    """

    name = "left"

    def __init__(self) -> None:
        self.envelopes: list[tuple[Direction, str, str]] = []

    def envelopeLeft(self, envelope: Envelope, direction: Direction, outcome: str) -> None:
        self.envelopes.append((direction, envelope.type, outcome))


class Rig:
    """
    A middleware whose chain is the playbook plugin alone (or nothing), on a
    Clock, with no RPEngine (turns wait for one), its client endpoint and
    the bridge that delivers the plugin's envelopes to open connections.
    """

    def __init__(self, withPlugin: bool = True) -> None:
        self.clock = Clock()
        self.settings = Settings()
        services = PluginServices(self.clock, self.settings, CardHasher(None), Timeline())
        plugins = []
        if withPlugin:
            plugins.append(PlaybookPlugin({"mira": parsePlaybook(PLAYBOOK, {})}))
        self.middleware = Middleware(self.clock, self.settings, plugins, services)
        self.left = LeftChain()
        self.middleware.chain.addObserver(self.left)
        self.endpoint = clockedEndpoint(self.middleware, self.settings, self.clock)
        self.clients = OpenConnections(self.endpoint, self.clock)
        self.connections = self.clients.open
        self.middleware.router.observe(ExtensionBridge(self.clients))
        self.connect = self.clients.connect
        self.say = self.clients.say

    def drop(self, connection: ClientConnection) -> None:
        connection.lost()
        self.connections.remove(connection)

    def reconnect(self, sessionId: str) -> list[dict[str, Any]]:
        """
        A new connection takes C{sessionId} back; what it was sent from the
        reconnect-ack on, once the reactor has turned (the plugin sends one
        turn later).
        """
        connection, writer = self.connect()
        self.say(connection, type="reconnect", sessionId=sessionId)
        sent = [m for m in writer.sent if m["type"] != "capacity"]
        kinds = [m["type"] for m in sent]
        return sent[kinds.index("reconnect-ack") :]


def play(rig: Rig, characterId: str, text: str) -> tuple[ClientConnection, FakeClientWriter]:
    connection, writer = rig.connect()
    rig.say(connection, type="character", characterId=characterId, card=exampleCard())
    rig.say(connection, type="text", text=text)
    return connection, writer


class ResumeTests(SynchronousTestCase):
    def test_toldTheStageAfterReconnect(self) -> None:
        """
        After reconnect-ack (and history), the client gets a stage-change
        from and to the session's stage, exactly a stage-change's fields.
        """
        rig = Rig()
        first, writer = play(rig, "mira", "Any work?")
        self.assertIn(
            {
                "type": "stage-change",
                "from": "greeting",
                "to": "offer",
                "reason": 'player said "work"',
            },
            writer.sent,
        )
        rig.drop(first)
        after = rig.reconnect(first.session.id)
        self.assertEqual([m["type"] for m in after], ["reconnect-ack", "history", "stage-change"])
        self.assertTrue(after[0]["success"])
        self.assertEqual(
            after[-1],
            {"type": "stage-change", "from": "offer", "to": "offer", "reason": "session resumed"},
        )

    def test_toldAChangeMadeWhileAway(self) -> None:
        """
        A stage change made while no connection had the session (the idle
        rule fires after the disconnect) reached nobody; the reconnected
        client is told the stage it led to.
        """
        rig = Rig()
        first, writer = play(rig, "mira", "Any work?")
        rig.drop(first)
        rig.clock.advance(10)
        self.assertNotIn("waited", [m.get("to") for m in writer.sent])
        after = rig.reconnect(first.session.id)
        self.assertEqual(
            after[-1],
            {"type": "stage-change", "from": "waited", "to": "waited", "reason": "session resumed"},
        )
        self.assertEqual([m["type"] for m in after].count("stage-change"), 1)

    def test_nothingWithoutAPlaybook(self) -> None:
        """
        A session whose character has no playbook is told nothing more than
        reconnect-ack and its history.
        """
        rig = Rig()
        first, writer = play(rig, "bob", "Any work?")
        rig.drop(first)
        after = rig.reconnect(first.session.id)
        self.assertEqual([m["type"] for m in after], ["reconnect-ack", "history"])
        self.assertTrue(after[0]["success"])

    def test_nothingWithoutThePlugin(self) -> None:
        """
        Without the playbook plugin in the chain nothing is told, and no
        playbook envelope is made.
        """
        rig = Rig(withPlugin=False)
        first, writer = play(rig, "mira", "Any work?")
        rig.drop(first)
        after = rig.reconnect(first.session.id)
        self.assertEqual([m["type"] for m in after], ["reconnect-ack", "history"])
        self.assertEqual([e for e in rig.left.envelopes if e[1].startswith(PREFIX)], [])

    def test_nothingOnAFailedReconnect(self) -> None:
        rig = Rig()
        first, writer = play(rig, "mira", "Any work?")
        rig.drop(first)
        after = rig.reconnect("no-such-session")
        self.assertEqual([m["type"] for m in after], ["reconnect-ack"])
        self.assertFalse(after[0]["success"])
