"""
The plugin chain: order, holding, dropping, answering, and isolation.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from rpmiddleware.core.chain import PluginChain
from rpmiddleware.plugin.base import ChainPlugin, PluginFactory, rejectUnknownSettings
from rpmiddleware.plugin.interfaces import (
    IChainContext,
    IChainObserver,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IPluginFactory,
)
from rpmiddleware.protocol.envelope import Direction, Envelope
from rpmiddleware.testing.kit import FakeSession, PluginHarness, captureLogEvents
from tests.support.chain import Recorder


@implementer(IEnvelopePlugin)
class Scripted(ChainPlugin):
    """
    Answers every envelope with whatever its script function returns.
    """

    def __init__(self, name: str, toEngine: Any = None, toGame: Any = None) -> None:
        self.name = name
        self._toEngine = toEngine
        self._toGame = toGame

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        return self._toEngine(envelope, context) if self._toEngine else envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        return self._toGame(envelope, context) if self._toGame else envelope


capturedErrors = captureLogEvents


class OrderTests(SynchronousTestCase):
    def test_orderBothWays(self) -> None:
        """
        To the engine the plugins run in order; to the game in reverse.
        """
        trail: list[str] = []
        harness = PluginHarness([Recorder("a", trail), Recorder("b", trail), Recorder("c", trail)])
        harness.toEngine("request.cancel", requestId="r")
        harness.toGame("reply.completed", requestId="r")
        self.assertEqual(trail, ["a>", "b>", "c>", "<c", "<b", "<a"])
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.assertEqual(harness.typesToGame(), ["reply.completed"])

    def test_sessionHooks(self) -> None:
        trail: list[str] = []
        plugin = Recorder("a", trail)
        harness = PluginHarness(plugin)
        harness.startSession("s1")
        harness.startSession("s2")
        self.assertEqual(plugin.sessions, [("started", "s1"), ("ended", "s1"), ("started", "s2")])
        self.assertEqual(harness.chain.session.sessionId, "s2")  # type: ignore[union-attr]


class DecisionTests(SynchronousTestCase):
    def test_change(self) -> None:
        def change(envelope: Envelope, context: IChainContext) -> Envelope:
            return envelope.replace(requestId="changed")

        harness = PluginHarness([Scripted("x", toEngine=change)])
        harness.toEngine("request.cancel", requestId="r")
        self.assertEqual(harness.sentToEngine[0].requestId, "changed")
        self.assertIn(("x", "replaced"), harness.sentToEngine[0].meta["decisions"])

    def test_drop(self) -> None:
        trail: list[str] = []
        harness = PluginHarness([Scripted("x", toEngine=lambda e, c: None), Recorder("b", trail)])
        d = harness.toEngine("request.cancel", requestId="r")
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(harness.sentToEngine, [])
        self.assertEqual(trail, [], "plugins after a drop never see the envelope")

    def test_hold(self) -> None:
        """
        A Deferred holds the envelope; later ones pass; it goes on when fired.
        """
        held: list[Deferred[Any]] = []

        def hold(envelope: Envelope, context: IChainContext) -> Any:
            if envelope.requestId == "slow":
                d: Deferred[Any] = Deferred()
                held.append(d)
                return d.addCallback(lambda _: envelope)
            return envelope

        trail: list[str] = []
        harness = PluginHarness([Scripted("x", toEngine=hold), Recorder("b", trail)])
        first = harness.toEngine("request.cancel", requestId="slow")
        harness.toEngine("request.cancel", requestId="fast")
        self.assertNoResult(first)
        self.assertEqual([e.requestId for e in harness.sentToEngine], ["fast"])
        held[0].callback(None)
        self.successResultOf(first)
        self.assertEqual([e.requestId for e in harness.sentToEngine], ["fast", "slow"])
        self.assertEqual(trail, ["b>", "b>"])

    def test_holdThenDrop(self) -> None:
        d: Deferred[Any] = Deferred()
        harness = PluginHarness([Scripted("x", toEngine=lambda e, c: d)])
        result = harness.toEngine("request.cancel", requestId="r")
        d.callback(None)
        self.successResultOf(result)
        self.assertEqual(harness.sentToEngine, [])

    def test_answer(self) -> None:
        """
        A plugin answers instead of passing on: the answer travels toward the
        game through the plugins before it (in reverse), not itself.
        """
        trail: list[str] = []

        def answer(envelope: Envelope, context: IChainContext) -> None:
            context.sendToGame(Envelope.build("reply.cancelled", requestId=envelope.requestId))
            return None

        harness = PluginHarness(
            [Recorder("a", trail), Scripted("x", toEngine=answer), Recorder("c", trail)]
        )
        harness.toEngine("request.cancel", requestId="r")
        self.assertEqual(harness.sentToEngine, [])
        self.assertEqual(harness.typesToGame(), ["reply.cancelled"])
        self.assertEqual(trail, ["a>", "<a"])
        self.assertEqual(harness.sentToGame[0].meta["origin"], "x")

    def test_originateToEngine(self) -> None:
        """
        A plugin originates toward the engine from its own position: later
        plugins see it, earlier ones do not.
        """
        trail: list[str] = []

        def resend(envelope: Envelope, context: IChainContext) -> Envelope:
            if envelope.type == "request.error":
                context.sendToEngine(Envelope.build("request.cancel", requestId="again"))
            return envelope

        harness = PluginHarness(
            [Recorder("a", trail), Scripted("x", toGame=resend), Recorder("c", trail)]
        )
        harness.toGame("request.error", requestId="r", code="request_failed")
        self.assertEqual([e.requestId for e in harness.sentToEngine], ["again"])
        self.assertEqual(trail, ["<c", "c>", "<a"])


class IsolationTests(SynchronousTestCase):
    def test_raisingPluginIsSkipped(self) -> None:
        """
        A plugin that raises is logged with its name; the envelope goes on
        unchanged through the rest of the chain.
        """
        events = capturedErrors(self)
        trail: list[str] = []

        def boom(envelope: Envelope, context: IChainContext) -> Any:
            raise RuntimeError("plugin bug")

        harness = PluginHarness([Scripted("broken", toEngine=boom), Recorder("b", trail)])
        harness.toEngine("request.cancel", requestId="r")
        self.assertEqual([e.requestId for e in harness.sentToEngine], ["r"])
        self.assertEqual(trail, ["b>"])
        failures = [e for e in events if e.get("log_failure") and e.get("plugin") == "broken"]
        self.assertEqual(len(failures), 1)
        self.flushLoggedErrors(RuntimeError)

    def test_failingDeferred(self) -> None:
        events = capturedErrors(self)
        d: Deferred[Any] = Deferred()
        harness = PluginHarness([Scripted("broken", toEngine=lambda e, c: d)])
        result = harness.toEngine("request.cancel", requestId="r")
        d.errback(ValueError("late failure"))
        self.successResultOf(result)
        self.assertEqual([e.requestId for e in harness.sentToEngine], ["r"])
        self.assertTrue(any(e.get("plugin") == "broken" for e in events if e.get("log_failure")))
        self.flushLoggedErrors(ValueError)

    def test_wrongReturnType(self) -> None:
        events = capturedErrors(self)
        harness = PluginHarness([Scripted("odd", toEngine=lambda e, c: {"type": "x"})])
        harness.toEngine("request.cancel", requestId="r")
        self.assertEqual([e.requestId for e in harness.sentToEngine], ["r"])
        self.assertTrue(any(e.get("plugin") == "odd" and e.get("kind") == "dict" for e in events))

    def test_raisingHook(self) -> None:
        @implementer(IEnvelopePlugin)
        class BadHook(ChainPlugin):
            name = "badhook"

            def engineSessionStarted(self, session: Any, context: Any) -> None:
                raise RuntimeError("hook bug")

        trail: list[str] = []
        good = Recorder("good", trail)
        harness = PluginHarness([BadHook(), good])
        harness.startSession("s1")
        self.assertEqual(good.sessions, [("started", "s1")])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_failingEnd(self) -> None:
        """
        A failing receiver at the end of the chain is logged, not raised.
        """

        def explode(envelope: Envelope) -> None:
            raise RuntimeError("receiver bug")

        chain = PluginChain([], explode, explode, reactor=Clock())
        self.successResultOf(chain.sendToEngine(Envelope.build("request.cancel", requestId="r")))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class ObserverTests(SynchronousTestCase):
    def test_observerSeesExits(self) -> None:
        seen: list[tuple[str, Direction, str]] = []

        @implementer(IEnvelopePlugin, IChainObserver)
        class Watcher(ChainPlugin):
            name = "watcher"

            def envelopeLeft(self, envelope: Envelope, direction: Direction, outcome: str) -> None:
                seen.append((envelope.type, direction, outcome))

        harness = PluginHarness([Watcher(), Scripted("dropper", toGame=lambda e, c: None)])
        harness.toEngine("request.cancel", requestId="r")
        harness.toGame("reply.completed", requestId="r")
        self.assertEqual(
            seen,
            [
                ("request.cancel", Direction.TO_ENGINE, "delivered"),
                ("reply.completed", Direction.TO_GAME, "dropped"),
            ],
        )


class ProviderTests(SynchronousTestCase):
    def test_verifyBase(self) -> None:
        self.assertTrue(verifyObject(IEnvelopePlugin, Recorder("a", [])))

    def test_verifyFactory(self) -> None:
        factory = PluginFactory("x", "does x", lambda settings, services: Recorder("x", []))
        self.assertTrue(verifyObject(IPluginFactory, factory))
        self.assertEqual(factory.buildPlugin({}, None).name, "x")  # type: ignore[arg-type]

    def test_verifyContextAndSession(self) -> None:
        harness = PluginHarness(Recorder("a", []))
        self.assertTrue(verifyObject(IChainContext, harness.chain._contexts[0]))
        self.assertTrue(verifyObject(IEngineSessionInfo, FakeSession("s")))

    def test_rejectUnknownSettings(self) -> None:
        rejectUnknownSettings("x", {"a": 1}, {"a"})
        with self.assertRaises(ValueError) as caught:
            rejectUnknownSettings("x", {"b": 1}, {"a"})
        self.assertIn("'b'", str(caught.exception))
