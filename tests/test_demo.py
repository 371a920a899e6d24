"""
C{twistd rpmiddleware --demo}: the simulator connects in-process and a
scripted turn streams to completion.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase, TestCase

from rpmiddleware.config.settings import Settings
from rpmiddleware.testing.demo import DEMO_CHARACTER, giveDemoCharacter
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import connectClient
from tests.support.demo import startFastDemo


class DemoTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def test_demoPlaysATurn(self) -> Any:
        demo, events = startFastDemo(self)
        completed = yield demo.ready
        self.assertEqual(completed.type, "reply.completed")
        self.assertTrue(demo.turn.text().strip())
        types = [e.type for e in demo.turn.envelopes]
        self.assertEqual(types[0], "reply.accepted")
        self.assertIn("reply.text.delta", types)
        self.assertIn("reply.audio.chunk", types)
        self.assertEqual(types[-1], "reply.completed")
        said = [e for e in events if e.get("log_format", "").startswith("demo: Mira says")]
        self.assertTrue(said, "the reply is logged as it streams")
        url = f"https://rpengine.gemtavern.com/#port={demo.port}"
        link = [e for e in events if e.get("link") == url]
        self.assertEqual(len(link), 1, "the connect link with the real port is logged")

    @inlineCallbacks
    def test_offTheShelfClientTalksToMira(self) -> Any:
        """
        A voice client that sends no character message (an unmodified
        LLMRTC web client) plays the demo's character, not an error.
        """
        demo, events = startFastDemo(self)
        yield demo.ready
        client = connectClient(reactor, f"ws://127.0.0.1:{demo.port}/client/socket")
        self.addCleanup(lambda: client.drop() if not client.closed.called else None)
        yield client.opened
        client.send({"type": "text", "text": "Who are you?"})
        done = yield client.nextOfType("reply-complete", "error")
        self.assertEqual(done["type"], "reply-complete", done)
        self.assertTrue(done["text"].strip())
        yield client.close()


class DemoCharacterTests(SynchronousTestCase):
    def test_demoCharacterIsTheDefault(self) -> None:
        settings = Settings()
        giveDemoCharacter(settings)
        self.assertEqual(settings.game.default_character_id, DEMO_CHARACTER)
        from rpmiddleware.client.settings import loadDefaultCharacter

        character = loadDefaultCharacter(settings)
        assert character is not None
        self.assertEqual(character.characterId, DEMO_CHARACTER)
        self.assertEqual(character.card, exampleCard())

    def test_configuredDefaultKept(self) -> None:
        settings = Settings()
        settings.game.default_character = "/games/bram.json"
        settings.game.default_character_id = "bram"
        giveDemoCharacter(settings)
        self.assertEqual(
            (settings.game.default_character, settings.game.default_character_id),
            ("/games/bram.json", "bram"),
        )
