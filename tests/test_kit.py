"""
The plugin test kit (rpmiddleware.testing) builds what a plugin really sees:
a game's request carries a snapshot transfer of its card, as the middleware
builds it; a client's own message enters the chain as the client endpoint
sends it; built-in plugins are built by their factories.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

import rpmiddleware.testing as testing
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import (
    FROM_CLIENT,
    ChainPlugin,
    Envelope,
    IChainContext,
    IClientExtension,
    canonicalHash,
    clientMessage,
    validateCard,
)
from rpmiddleware.testing import (
    REFERENCE_CARD,
    PluginHarness,
    builtinPlugin,
    exampleCard,
    pluginServices,
)


class Seen(ChainPlugin):
    """Keeps every envelope it sees on its way to RPEngine."""

    name = "seen"

    def __init__(self) -> None:
        self.toEngine: list[Envelope] = []

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope | None:
        self.toEngine.append(envelope)
        return envelope


@implementer(IClientExtension)
class Asked(Seen):
    name = "asked"
    clientMessageTypes = ("ask",)

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope | None:
        if clientMessage(envelope, self.clientMessageTypes) is None:
            return envelope
        self.toEngine.append(envelope)
        return None


class ReplyRequestTests(SynchronousTestCase):
    def test_snapshotByDefault(self) -> None:
        """
        A request's card is a snapshot transfer of the example card with its
        canonical hash, which RPEngine's rules take.
        """
        harness = PluginHarness(Seen())
        harness.toEngine(harness.replyRequest("r1", text="Hello"))
        [sent] = harness.sentToEngine
        card = sent["card"]
        self.assertEqual(sorted(card), ["format", "mode", "snapshot", "targetHash"])
        self.assertEqual((card["format"], card["mode"]), ("chara_card_v2", "snapshot"))
        self.assertEqual(card["snapshot"], exampleCard())
        self.assertEqual(card["targetHash"], canonicalHash(exampleCard()))
        validateCard(card["snapshot"])

    def test_asTheMiddlewareBuildsIt(self) -> None:
        """
        The kit's request carries the card as the middleware's game end puts
        it on a game's request: the same transfer, key for key.
        """
        clock = Clock()
        seen = Seen()
        middleware = Middleware(clock, Settings(), [seen], pluginServices(clock))
        middleware.requestReply("mira", text="Hello", card=exampleCard())
        clock.advance(0)
        [request] = seen.toEngine
        harness = PluginHarness(Seen())
        self.assertEqual(harness.replyRequest()["card"], request["card"])

    def test_ownedSharedAndFoundByIdentity(self) -> None:
        """
        Given the plugin's own hasher (C{cards=}), the document is one it
        owns and knows: found by identity, the same for every request.
        """
        services = pluginServices()
        harness = PluginHarness(Seen(), cards=services.cards)
        first = harness.replyRequest("r1")["card"]["snapshot"]
        second = harness.replyRequest("r2")["card"]["snapshot"]
        self.assertIs(first, second)
        known = services.cards.known(first)
        assert known is not None
        self.assertEqual(known.hash, canonicalHash(exampleCard()))

    def test_referenceWhenAsked(self) -> None:
        """The option existing tests use: a card transfer of one's own, as it is."""
        harness = PluginHarness(Seen())
        request = harness.replyRequest("r1", card=dict(REFERENCE_CARD))
        self.assertEqual(request["card"], REFERENCE_CARD)


class FromClientTests(SynchronousTestCase):
    def test_asTheEndpointSendsIt(self) -> None:
        plugin = Asked()
        harness = PluginHarness(plugin)
        harness.fromClient("c1", {"type": "ask", "what": "mood"})
        [envelope] = plugin.toEngine
        self.assertEqual(envelope.type, FROM_CLIENT)
        self.assertEqual(envelope["message"], {"type": "ask", "what": "mood"})
        self.assertEqual(envelope.meta["client"], "c1")
        self.assertEqual(harness.sentToEngine, [])


class BuiltinPluginTests(SynchronousTestCase):
    def test_byName(self) -> None:
        services = pluginServices()
        gate = builtinPlugin("capacity-gate", {}, services)
        cache = builtinPlugin("card-cache")
        self.assertEqual([gate.name, cache.name], ["capacity-gate", "card-cache"])
        harness = PluginHarness([Seen(), cache])
        harness.startSession()
        harness.toEngine(harness.replyRequest("r1"))
        self.assertEqual(harness.typesToEngine(), ["reply.request"])

    def test_unknownName(self) -> None:
        with self.assertRaises(KeyError) as caught:
            builtinPlugin("card-cash")
        self.assertIn("no built-in plugin 'card-cash'", str(caught.exception))
        self.assertIn("card-cache", str(caught.exception))

    def test_settingsRefused(self) -> None:
        with self.assertRaises(ValueError):
            builtinPlugin("card-cache", {"nonsense": 1})


class FaceTests(SynchronousTestCase):
    def test_kitFromTheTestingPackage(self) -> None:
        """A plugin author's tests import the kit from rpmiddleware.testing."""
        missing = [name for name in testing.__all__ if not hasattr(testing, name)]
        self.assertEqual(missing, [])
        self.assertIn("builtinPlugin", testing.__all__)
        self.assertIn("captureLogEvents", testing.__all__)


class PluginServicesTests(SynchronousTestCase):
    def test_configFromAMapping(self) -> None:
        """A mapping is read as the daemon reads its file: checked, defaults filled in."""
        services = pluginServices(None, {"client": {"barge_in": False}})
        self.assertIs(services.config.client.barge_in, False)
        self.assertEqual(services.config.server.port, 38471)
