"""
The guide works as a newcomer uses it: kind-words (tests/support/kindwords.py),
a plugin written from docs/plugin-authors.md alone, counts the player's kind
words, tells clients the count through an C{x-} field and answers a client
message of its own with answerOp: through the kit, as the guide's tests do,
and through the client endpoint, as a game sees it.
"""

from __future__ import annotations

import ast
import inspect
import json
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.client.status import attachHub
from rpmiddleware.config.settings import parseSettings
from rpmiddleware.core.discovery import discoverPlugins
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.testing import PluginHarness, exampleCard, pluginServices
from rpmiddleware.testing.inmemory import connectInMemory
from tests.support import kindwords
from tests.support.client import clockedEndpoint
from tests.support.connections import OpenConnections
from tests.support.kindwords import KindWords, kindWords

#: What a plugin imports of rpmiddleware, the guide says: its one face.
FACE = "rpmiddleware.plugin"


class WrittenFromTheGuideTests(SynchronousTestCase):
    def test_importsOnlyTheFace(self) -> None:
        """The plugin imports rpmiddleware only as rpmiddleware.plugin, as the guide says."""
        tree = ast.parse(inspect.getsource(kindwords))
        imported = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        } | {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        self.assertEqual({m for m in imported if m.startswith("rpmiddleware")}, {FACE})


class KitTests(SynchronousTestCase):
    """kind-words in the kit's chain, as the guide's section 9 tests a plugin."""

    def setUp(self) -> None:
        clock = Clock()
        self.services = pluginServices(clock)
        self.plugin = kindWords.buildPlugin({}, self.services)
        self.harness = PluginHarness(self.plugin, clock, cards=self.services.cards)
        self.harness.startSession()

    def turn(self, line: str, requestId: str = "r1", client: str = "c1") -> list[Any]:
        """The player says C{line}; RPEngine's reply comes back: what reached the game."""
        request = self.harness.replyRequest(requestId, text=line, meta={"client": client})
        self.harness.toEngine(request)
        self.harness.toGame("reply.text.completed", requestId=requestId, text="Hm.", tokenCount=2)
        self.harness.toGame("reply.completed", requestId=requestId, modalities=["text"])
        return self.harness.sentToGame[-2:]

    def test_countsKindWords(self) -> None:
        completed, ended = self.turn("Please, friend, thank you. Sorry!")
        self.assertEqual(completed["x-kind-words"], 4)
        self.assertEqual(ended["x-kind-words"], 4)
        entry = self.services.timeline.get("r1")
        assert entry is not None
        self.assertEqual(entry.details["kindWords"], 4)

    def test_noKindWords(self) -> None:
        completed, _ = self.turn("Give me the map.")
        self.assertEqual(completed["x-kind-words"], 0)
        self.assertEqual(self.harness.typesToEngine(), ["reply.request"])

    def test_forgottenAtTheEnd(self) -> None:
        self.turn("Thanks.")
        self.harness.toGame("reply.text.completed", requestId="r1", text="again")
        self.assertNotIn("x-kind-words", self.harness.sentToGame[-1].fields)
        self.assertEqual(self.plugin.counts, {})  # type: ignore[attr-defined]

    def test_answersItsOwnMessage(self) -> None:
        self.turn("Please.", "r1")
        self.turn("Thank you, kind friend.", "r2")
        self.harness.sentToGame.clear()
        self.harness.fromClient("c1", {"type": "kindness", "op": "count", "id": 9})
        self.harness.fromClient("c1", {"type": "kindness", "op": "tally"})
        self.harness.fromClient("c1", {"type": "kindness", "op": "reset"})
        answers = [(e.type, e["clientId"], e["message"]) for e in self.harness.sentToGame]
        self.assertEqual(
            answers,
            [
                (
                    "x-client.send",
                    "c1",
                    {"type": "kindness-result", "op": "count", "id": 9, "total": 4},
                ),
                (
                    "x-client.send",
                    "c1",
                    {
                        "type": "error",
                        "code": "INVALID_MESSAGE",
                        "message": "kindness tally: op must be count or reset",
                        "op": "tally",
                    },
                ),
                ("x-client.send", "c1", {"type": "kindness-result", "op": "reset", "total": 0}),
            ],
        )
        self.assertEqual(self.harness.sentToEngine[-1].type, "reply.request")  # taken, all

    def test_settings(self) -> None:
        plugin = kindWords.buildPlugin({"words": ["cheers"]}, self.services)
        assert isinstance(plugin, KindWords)
        self.assertEqual(plugin.count("Cheers, thanks!"), 1)
        with self.assertRaises(ValueError) as caught:
            kindWords.buildPlugin({"word": ["cheers"]}, self.services)
        self.assertIn("unknown setting 'word' for plugin kind-words", str(caught.exception))


class ClientEndpointTests(SynchronousTestCase):
    """
    kind-words configured in [chain] of a daemon's middleware, with a
    simulated RPEngine on a Clock and a client of /client/socket.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        registry = discoverPlugins()
        registry.add(kindWords, "tests.support.kindwords")
        settings = parseSettings({"chain": {"plugins": {"kind-words": 40}}}, "kind.toml")
        self.middleware = Middleware.fromSettings(self.clock, settings, registry)
        connectInMemory(self.middleware, self.clock)
        endpoint = clockedEndpoint(self.middleware, settings, self.clock)
        self.clients = OpenConnections(endpoint, self.clock)
        self.middleware.router.observe(ExtensionBridge(self.clients))
        attachHub(endpoint, self.clients)
        self.connection, writer = self.clients.connect()
        self.sent: list[dict[str, Any]] = writer.sent
        self.say(type="character", characterId="mira", card=exampleCard())
        self.say(type="configure", output={"modalities": ["text"]})

    def say(self, **message: Any) -> None:
        self.clients.say(self.connection, **message)
        for _ in range(200):
            self.clock.advance(0.05)

    def test_countOnTheReply(self) -> None:
        self.assertEqual(self.middleware.chain.names[0], "kind-words")
        self.say(type="text", text="Thank you, kind friend.")
        [llm] = [m for m in self.sent if m["type"] == "llm"]
        self.assertEqual(llm["x-kind-words"], 3)
        [complete] = [m for m in self.sent if m["type"] == "reply-complete"]
        self.assertEqual(complete["x-kind-words"], 3)
        self.assertNotIn("x-kind-words", json.dumps(complete.get("stats", {})))

    def test_answersItsOwnMessage(self) -> None:
        self.say(type="text", text="Please, friend.")
        self.say(type="kindness", op="count", id="q1")
        [answer] = [m for m in self.sent if m["type"] == "kindness-result"]
        self.assertEqual(answer, {"type": "kindness-result", "op": "count", "id": "q1", "total": 2})
        self.say(type="kindness", op="tally")
        error = self.sent[-1]
        self.assertEqual((error["type"], error["code"]), ("error", "INVALID_MESSAGE"))
        self.assertIn("kindness tally: op must be count or reset", error["message"])
