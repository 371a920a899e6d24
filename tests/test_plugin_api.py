"""
The plugin API made hard to misuse (issue 18): ChainPlugin provides the
interface, the name is written once, a plugin may fail closed, [chain] takes
dotted paths, the harness runs the engine-end rules, and plugins that report
something are found by the interface they provide, never by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import fail
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.client.connection import ClientConnection
from rpmiddleware.client.status import attachHub
from rpmiddleware.config.settings import ConfigError, Settings, parseSettings
from rpmiddleware.console.metrics import MiddlewareMetrics
from rpmiddleware.core.discovery import PluginRegistry, buildChain, describeChain, importFactory
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.base import ChainPlugin, PluginFactory, PluginNameError
from rpmiddleware.plugin.interfaces import (
    IChainContext,
    IEnvelopePlugin,
    IHeldWork,
    IPluginFactory,
    IPluginServices,
    ITimingSource,
)
from rpmiddleware.protocol.envelope import Direction, Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import (
    EngineWouldRefuse,
    PluginHarness,
    captureLogEvents,
    pluginServices,
)
from tests.support.client import clockedEndpoint
from tests.support.connections import FakeClientWriter


class Shout(ChainPlugin):
    """Makes characters shout."""

    name = "shout"

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Envelope:
        if envelope.type == "reply.text.delta":
            envelope["delta"] = str(envelope.get("delta", "")).upper()
        return envelope


#: Found by the dotted path "tests.test_plugin_api.shout".
shout = PluginFactory(Shout, "Makes characters shout.")
notAFactory = 42


class Breaks(ChainPlugin):
    """
    Raises (or fails its Deferred, with C{later}) on C{breakOn} types.
    """

    name = "breaks"

    def __init__(self, breakOn: tuple[str, ...], later: bool = False) -> None:
        self.breakOn = breakOn
        self.later = later

    def _maybe(self, envelope: Envelope) -> Any:
        if envelope.type not in self.breakOn:
            return envelope
        if self.later:
            return fail(RuntimeError("a bug"))
        raise RuntimeError("a bug")

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        return self._maybe(envelope)

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        return self._maybe(envelope)


class BreaksClosed(Breaks):
    name = "breaks-closed"
    failClosed = True


class Seen(ChainPlugin):
    """Notes every envelope it sees, in both directions."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[tuple[str, str]] = []

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope:
        self.seen.append(("toEngine", envelope.type))
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Envelope:
        self.seen.append(("toGame", envelope.type))
        return envelope


class ChainPluginTests(SynchronousTestCase):
    def test_providesTheInterfaceUndeclared(self) -> None:
        """A subclass that declares nothing provides IEnvelopePlugin; the harness takes it."""
        self.assertTrue(IEnvelopePlugin.providedBy(Shout()))
        harness = PluginHarness(Shout())
        harness.toGame("reply.text.delta", requestId="r1", sequence=0, delta="hi")
        self.assertEqual(harness.sentToGame[0]["delta"], "HI")

    def test_failsOpenByDefault(self) -> None:
        self.assertIs(ChainPlugin.failClosed, False)


class NameOnceTests(SynchronousTestCase):
    def test_nameFromTheClass(self) -> None:
        self.assertEqual(shout.name, "shout")
        plugin = shout.buildPlugin({}, pluginServices())
        self.assertIsInstance(plugin, Shout)

    def test_noBuildRefusesSettings(self) -> None:
        with self.assertRaises(ValueError) as caught:
            shout.buildPlugin({"volume": 3}, pluginServices())
        self.assertIn("unknown setting 'volume' for plugin shout", str(caught.exception))

    def test_classWithoutAName(self) -> None:
        class Nameless(ChainPlugin):
            pass

        with self.assertRaises(PluginNameError) as caught:
            PluginFactory(Nameless, "nothing")
        self.assertIn("Nameless has no name of its own", str(caught.exception))

    def test_nameWithoutBuild(self) -> None:
        with self.assertRaises(TypeError) as caught:
            PluginFactory("shout", "Makes characters shout.")
        self.assertIn("needs a build function", str(caught.exception))

    def test_mismatchRefused(self) -> None:
        """A factory named one thing that builds a plugin named another is refused, naming both."""
        factory = PluginFactory("shouting", "typo", lambda settings, services: Shout())
        with self.assertRaises(PluginNameError) as caught:
            factory.buildPlugin({}, pluginServices())
        self.assertIn("factory 'shouting'", str(caught.exception))
        self.assertIn("named 'shout'", str(caught.exception))

    def test_mismatchStopsStartUp(self) -> None:
        registry = PluginRegistry()
        registry.add(PluginFactory("shouting", "typo", lambda s, v: Shout()), "test")
        settings = parseSettings({"chain": {"plugins": {"shouting": 10}}}, "my.toml")
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, registry, pluginServices(), {})
        self.assertIn("my.toml: plugin 'shouting'", str(caught.exception))
        self.assertIn("named 'shout'", str(caught.exception))

    def test_otherFactoryMismatchStopsStartUp(self) -> None:
        """A factory of one's own (not PluginFactory) is held to the same name."""

        @implementer(IPluginFactory)
        class Own:
            name = "own"
            description = "mine"

            def buildPlugin(self, settings: Any, services: IPluginServices) -> Shout:
                return Shout()

        registry = PluginRegistry()
        registry.add(Own(), "test")
        settings = parseSettings({"chain": {"plugins": {"own": 10}}}, "my.toml")
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, registry, pluginServices(), {})
        self.assertIn("built", str(caught.exception))
        self.assertIn("named 'shout'", str(caught.exception))


class DottedPathTests(SynchronousTestCase):
    def build(self, chain: dict[str, Any], **document: Any) -> list[Any]:
        settings = parseSettings({"chain": {"plugins": chain}, **document}, "my.toml")
        return buildChain(settings, PluginRegistry(), pluginServices(), {})

    def test_factoryByPath(self) -> None:
        [plugin] = self.build({"tests.test_plugin_api.shout": 60})
        self.assertIsInstance(plugin, Shout)

    def test_classByPath(self) -> None:
        """A plugin class is its own factory (no settings), as Scrapy's middleware is."""
        [plugin] = self.build({"tests.test_plugin_api.Shout": 60})
        self.assertEqual(plugin.name, "shout")

    def test_orderWithNames(self) -> None:
        registry = PluginRegistry()
        registry.add(PluginFactory("seen", "seen", lambda s, v: Seen("seen")), "test")
        settings = parseSettings(
            {"chain": {"plugins": {"tests.test_plugin_api.shout": 70, "seen": 60}}}, "my.toml"
        )
        plugins = buildChain(settings, registry, pluginServices(), {})
        self.assertEqual([p.name for p in plugins], ["seen", "shout"])
        described = describeChain(plugins, settings, registry, {})
        self.assertEqual(
            described[1], {"name": "shout", "priority": 70, "origin": "tests.test_plugin_api.shout"}
        )

    def test_doesNotImport(self) -> None:
        with self.assertRaises(ConfigError) as caught:
            self.build({"no_such_package.plugin.factory": 60})
        message = str(caught.exception)
        self.assertIn("my.toml: [chain] names 'no_such_package.plugin.factory'", message)
        self.assertIn("does not import", message)

    def test_missingAttribute(self) -> None:
        with self.assertRaises(ConfigError) as caught:
            importFactory("tests.test_plugin_api.nothingHere", "my.toml")
        self.assertIn(
            "'tests.test_plugin_api.nothingHere', which does not import", str(caught.exception)
        )

    def test_notAFactory(self) -> None:
        with self.assertRaises(ConfigError) as caught:
            self.build({"tests.test_plugin_api.notAFactory": 60})
        message = str(caught.exception)
        self.assertIn(
            "'tests.test_plugin_api.notAFactory', which is 42, not a plugin factory", message
        )

    def test_settingsUnderTheName(self) -> None:
        with self.assertRaises(ConfigError) as caught:
            self.build(
                {"tests.test_plugin_api.shout": 60}, plugins={"tests.test_plugin_api.shout": {}}
            )
        self.assertIn("go under its plugin's name, [plugins.shout]", str(caught.exception))

    def test_nameTakenByAnother(self) -> None:
        registry = PluginRegistry()
        registry.add(PluginFactory("shout", "another", lambda s, v: Shout()), "elsewhere")
        settings = parseSettings({"chain": {"plugins": {"tests.test_plugin_api.shout": 60}}}, "x")
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, registry, pluginServices(), {})
        self.assertIn("a name already taken by elsewhere", str(caught.exception))


class FailClosedTests(SynchronousTestCase):
    """
    A fail-closed plugin's failure stops the envelope and ends its request
    with request.error request_failed naming it; a fail-open one's passes
    the envelope on unchanged.
    """

    def setUp(self) -> None:
        self.events = captureLogEvents(self)

    def chain(self, plugin: Breaks) -> tuple[PluginHarness, Seen, Seen]:
        nearGame, nearEngine = Seen("near-game"), Seen("near-engine")
        harness = PluginHarness([nearGame, plugin, nearEngine])
        harness.startSession("s1")
        return harness, nearGame, nearEngine

    def failures(self) -> list[dict[str, Any]]:
        return [e for e in self.events if "log_failure" in e]

    def test_toEngineRequestEnds(self) -> None:
        harness, nearGame, nearEngine = self.chain(BreaksClosed(("reply.request",)))
        harness.toEngine(harness.replyRequest("r1", text="Hello"))
        self.assertEqual(harness.sentToEngine, [])
        self.assertEqual(nearEngine.seen, [])
        [error] = harness.sentToGame
        self.assertEqual(error.type, "request.error")
        self.assertEqual(
            (error["requestId"], error["code"], error["retryable"]), ("r1", "request_failed", False)
        )
        self.assertIn(
            "plugin breaks-closed failed on this request's reply.request", error["message"]
        )
        # The plugins nearer the game hear the ending; no cancel: RPEngine never had it.
        self.assertEqual(
            nearGame.seen, [("toEngine", "reply.request"), ("toGame", "request.error")]
        )
        [logged] = self.failures()
        self.assertEqual((logged["plugin"], logged["requestId"]), ("breaks-closed", "r1"))
        self.flushLoggedErrors(RuntimeError)

    def test_toGameReplyEndsAndCancels(self) -> None:
        """
        A reply RPEngine is producing: the delta goes no further, the game
        gets request.error, RPEngine gets request.cancel; a later failure of
        the same request ends nothing twice.
        """
        harness, nearGame, nearEngine = self.chain(BreaksClosed(("reply.text.delta",)))
        harness.toGame("reply.text.delta", requestId="r1", sequence=0, delta="secret")
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertNotIn("secret", json.dumps([e.fields for e in harness.sentToGame]))
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.assertEqual(harness.sentToEngine[0]["requestId"], "r1")
        self.assertEqual(nearGame.seen, [("toGame", "request.error")])
        self.assertEqual(
            nearEngine.seen, [("toGame", "reply.text.delta"), ("toEngine", "request.cancel")]
        )
        harness.toGame("reply.text.delta", requestId="r1", sequence=1, delta="more")
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.assertEqual(len(self.failures()), 2)
        self.flushLoggedErrors(RuntimeError)

    def test_deferredFailure(self) -> None:
        harness, _, _ = self.chain(BreaksClosed(("reply.text.completed",), later=True))
        harness.toGame("reply.text.completed", requestId="r1", text="secret")
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.flushLoggedErrors(RuntimeError)

    def test_terminalReplacedWithoutCancel(self) -> None:
        """RPEngine's ending fails: the game gets the error instead; RPEngine is done already."""
        harness, _, _ = self.chain(BreaksClosed(("reply.completed",)))
        harness.toGame("reply.completed", requestId="r1", modalities=["text"])
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual(harness.sentToEngine, [])
        self.flushLoggedErrors(RuntimeError)

    def test_withoutRequestDropped(self) -> None:
        harness, _, _ = self.chain(BreaksClosed(("capacity.update",)))
        harness.toGame("capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=4)
        self.assertEqual((harness.sentToGame, harness.sentToEngine), ([], []))
        self.flushLoggedErrors(RuntimeError)

    def test_withdrawalPasses(self) -> None:
        """Stopping a withdrawal would keep its request running: it passes on."""
        harness, _, nearEngine = self.chain(BreaksClosed(("request.cancel",)))
        harness.toEngine("request.cancel", requestId="r1")
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.assertEqual(harness.sentToGame, [])
        self.assertEqual(nearEngine.seen, [("toEngine", "request.cancel")])
        self.flushLoggedErrors(RuntimeError)

    def test_observersSeeItDropped(self) -> None:
        harness, _, _ = self.chain(BreaksClosed(("reply.text.delta",)))
        left: list[tuple[str, Direction, str]] = []

        class Observer:
            name = "observer"

            def envelopeLeft(self, envelope: Envelope, direction: Direction, outcome: str) -> None:
                left.append((envelope.type, direction, outcome))

        harness.chain.addObserver(Observer())
        harness.toGame("reply.text.delta", requestId="r1", sequence=0, delta="x")
        self.assertIn(("reply.text.delta", Direction.TO_GAME, "dropped"), left)
        self.flushLoggedErrors(RuntimeError)

    def test_failOpenPassesUnchanged(self) -> None:
        harness, _, _ = self.chain(Breaks(("reply.text.delta",)))
        harness.toGame("reply.text.delta", requestId="r1", sequence=0, delta="x")
        self.assertEqual(harness.typesToGame(), ["reply.text.delta"])
        self.assertEqual(harness.sentToEngine, [])
        self.flushLoggedErrors(RuntimeError)

    def test_moderationFailsClosed(self) -> None:
        """The built-in moderation plugin is fail-closed: a bug in it lets nothing through."""
        from rpmiddleware.builtin.moderation import Moderation, moderation

        plugin = moderation.buildPlugin({"words": ["darn"]}, pluginServices())
        assert isinstance(plugin, Moderation)
        self.assertIs(plugin.failClosed, True)

        def broken(*args: Any) -> Any:
            raise RuntimeError("a moderation bug")

        self.patch(plugin, "_toGame", broken)
        harness = PluginHarness(plugin)
        harness.startSession()
        harness.toEngine(harness.replyRequest("r1", text="Hello"))
        harness.toGame("reply.text.delta", requestId="r1", sequence=0, delta="darn it")
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertIn("plugin moderation failed", harness.sentToGame[0]["message"])
        self.assertEqual(harness.typesToEngine(), ["reply.request", "request.cancel"])
        self.flushLoggedErrors(RuntimeError)


class HarnessEngineRulesTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events = captureLogEvents(self)

    def refusals(self) -> list[EngineWouldRefuse]:
        return [
            e["log_failure"].value
            for e in self.events
            if "log_failure" in e and isinstance(e["log_failure"].value, EngineWouldRefuse)
        ]

    def test_refusedFailsTheTest(self) -> None:
        """A plugin that breaks a field RPEngine checks: the envelope is not sent, named."""

        class Blanker(ChainPlugin):
            name = "blanker"

            def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope:
                envelope["characterId"] = ""
                return envelope

        harness = PluginHarness(Blanker())
        harness.toEngine(harness.replyRequest("r1"))
        self.assertEqual(harness.sentToEngine, [])
        [refusal] = self.refusals()
        self.assertIn("characterId must be a non-empty string", str(refusal))
        self.assertIn("engineRules=False", str(refusal))
        self.assertEqual(len(self.flushLoggedErrors(EngineWouldRefuse)), 1)

    def test_unknownTypeRefused(self) -> None:
        harness = PluginHarness(Shout())
        harness.toEngine("mood.changed", requestId="r1")
        [refusal] = self.refusals()
        self.assertIn("RPEngine does not take 'mood.changed'", str(refusal))
        self.flushLoggedErrors(EngineWouldRefuse)

    def test_optOut(self) -> None:
        harness = PluginHarness(Shout(), engineRules=False)
        harness.toEngine("mood.changed", requestId="r1")
        self.assertEqual(harness.typesToEngine(), ["mood.changed"])
        self.assertEqual(self.refusals(), [])

    def test_requestsCompletedAsTheGameEndDoes(self) -> None:
        """A request built by type gets an eventId and output, and passes."""
        harness = PluginHarness(Shout())
        harness.toEngine(
            "reply.request",
            requestId="r1",
            integrationId="g",
            characterId="c",
            event={"text": "hi"},
            card=harness.replyRequest()["card"],
        )
        [sent] = harness.sentToEngine
        self.assertEqual(sent["eventId"], "event-r1")
        self.assertIsInstance(sent["output"], dict)
        self.assertEqual(self.refusals(), [])


@implementer(IEnvelopePlugin, IHeldWork, ITimingSource)
class ThirdParty(ChainPlugin):
    """A third party's plugin that holds work and times some of its own."""

    name = "my-queue"

    def __init__(self) -> None:
        self.holding = ["a", "b"]
        self.timingObservers: list[Callable[[str, float], None]] = []

    def held(self) -> list[str]:
        return list(self.holding)


def middlewareWith(plugin: ChainPlugin) -> tuple[Middleware, Clock]:
    clock = Clock()
    settings = Settings()
    services = PluginServices(clock, settings, CardHasher(None), Timeline())
    return Middleware(clock, settings, [plugin], services), clock


class ReportingInterfaceTests(SynchronousTestCase):
    """Found by the interface they provide, never by name."""

    def test_metricsHeldWork(self) -> None:
        middleware, _ = middlewareWith(ThirdParty())
        metrics = MiddlewareMetrics(middleware)
        value = metrics.registry.get_sample_value(
            "rpmiddleware_waiting_requests", {"where": "my_queue"}
        )
        self.assertEqual(value, 2.0)

    def test_metricsTiming(self) -> None:
        plugin = ThirdParty()
        middleware, _ = middlewareWith(plugin)
        metrics = MiddlewareMetrics(middleware)
        [observer] = plugin.timingObservers
        observer("to_engine", 0.25)
        count = metrics.registry.get_sample_value(
            "rpmiddleware_resample_seconds_count", {"direction": "to_engine"}
        )
        self.assertEqual(count, 1.0)
        metrics.stop()
        self.assertEqual(plugin.timingObservers, [])

    def test_statusQueueChart(self) -> None:
        """The console's queue chart counts what every IHeldWork plugin holds."""
        middleware, clock = middlewareWith(ThirdParty())
        endpoint = clockedEndpoint(middleware, middleware.settings, clock)
        connections: list[ClientConnection] = []
        attachHub(endpoint, lambda: connections)
        writer = FakeClientWriter()
        connection = ClientConnection(endpoint, writer, "tcp4:127.0.0.1:5000")
        connection.opened()
        connections.append(connection)
        connection.received(json.dumps({"type": "status"}).encode("utf-8"), False)
        self.assertEqual(writer.statuses()[-1]["queueHistory"][0][3], 2.0)

    def test_builtinsProvideThem(self) -> None:
        from rpmiddleware.builtin.audio_resample import audioResample
        from rpmiddleware.builtin.capacity_gate import capacityGate

        services = pluginServices()
        self.assertTrue(IHeldWork.providedBy(capacityGate.buildPlugin({}, services)))
        self.assertTrue(ITimingSource.providedBy(audioResample.buildPlugin({}, services)))
