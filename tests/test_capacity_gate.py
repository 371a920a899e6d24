"""
capacity-gate: work waits for RPEngine's capacity, fairly between clients.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from rpmiddleware.builtin.capacity_gate import CapacityGate, capacityGate
from rpmiddleware.builtin.card_cache import CardCache
from rpmiddleware.cards.validation import CardHasher, canonicalHash, snapshotTransfer
from rpmiddleware.config.settings import Settings
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.interfaces import IEnvelopePlugin, IPluginFactory
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import REFERENCE_CARD, PluginHarness, exampleCard

WORK = ("reply.request", "voice.capture.start")


class GateRig:
    def __init__(self, plugins: list[Any] | None = None, **kw: Any) -> None:
        self.plugin = CapacityGate(**kw)
        self.harness = PluginHarness([self.plugin, *(plugins or [])])
        self.clock = self.harness.clock

    def request(
        self, requestId: str, client: str | None = "A", kind: str = "reply.request", **meta: Any
    ) -> Deferred[None]:
        card = exampleCard()
        fields: dict[str, Any] = {
            "requestId": requestId,
            "integrationId": "game",
            "characterId": "mira",
            "card": snapshotTransfer(card, canonicalHash(card)),
        }
        if kind == "reply.request":
            fields["event"] = {"text": "Hello"}
        envelope = self.harness.envelope(kind, **fields)
        if client is not None:
            envelope.meta["client"] = client
        envelope.meta.update(meta)
        return self.harness.toEngine(envelope)

    def capacity(self, accepting: bool = True, depth: int = 0, limit: int = 1) -> None:
        self.harness.toGame(
            "capacity.update", acceptingRequests=accepting, queueDepth=depth, queueLimit=limit
        )

    def end(self, requestId: str, kind: str = "reply.completed", **fields: Any) -> None:
        self.harness.toGame(kind, requestId=requestId, **fields)

    def sent(self) -> list[str | None]:
        return [e.requestId for e in self.harness.sentToEngine if e.type in WORK]

    def toGame(self, kind: str) -> list[Envelope]:
        return [e for e in self.harness.sentToGame if e.type == kind]


class FactoryTests(SynchronousTestCase):
    def services(self) -> PluginServices:
        return PluginServices(None, Settings(), CardHasher(None), Timeline())

    def test_interfaces(self) -> None:
        self.assertTrue(verifyObject(IPluginFactory, capacityGate))
        plugin = capacityGate.buildPlugin({}, self.services())
        self.assertTrue(verifyObject(IEnvelopePlugin, plugin))
        self.assertEqual((capacityGate.name, plugin.name), ("capacity-gate", "capacity-gate"))

    def test_defaults(self) -> None:
        plugin = capacityGate.buildPlugin({}, self.services())
        assert isinstance(plugin, CapacityGate)
        self.assertEqual((plugin.queueLimit, plugin.assumeAfter), (32, 2.0))
        self.assertEqual(plugin.state()["queueLimit"], 1)

    def test_settings(self) -> None:
        plugin = capacityGate.buildPlugin(
            {"queue_limit": 3, "assume_after": 1, "assumed_limit": 2}, self.services()
        )
        assert isinstance(plugin, CapacityGate)
        self.assertEqual((plugin.queueLimit, plugin.assumeAfter), (3, 1.0))
        self.assertEqual(plugin.state()["queueLimit"], 2)

    def test_unknownSetting(self) -> None:
        build = capacityGate.buildPlugin
        e = self.assertRaises(ValueError, build, {"queue": 3}, self.services())
        self.assertIn("unknown setting plugins.capacity-gate.queue", str(e))

    def test_wrongTypes(self) -> None:
        for key, value in [
            ("queue_limit", "many"),
            ("queue_limit", 2.5),
            ("assume_after", "soon"),
            ("assume_after", True),
            ("assume_after", -1),
            ("assumed_limit", 0),
        ]:
            build = capacityGate.buildPlugin
            e = self.assertRaises(ValueError, build, {key: value}, self.services())
            self.assertIn(f"plugins.capacity-gate.{key} must be", str(e))


class GateTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.rig = GateRig()
        self.rig.harness.startSession()

    def test_holdWhileNotAcceptingThenRelease(self) -> None:
        self.rig.capacity(accepting=False, depth=0, limit=4)
        self.rig.request("r1")
        self.assertEqual(self.rig.sent(), [])
        self.assertEqual(self.rig.plugin.held(), ["r1"])
        self.rig.capacity(accepting=True, depth=0, limit=4)
        self.assertEqual(self.rig.sent(), ["r1"])
        self.assertEqual(self.rig.plugin.held(), [])
        self.assertEqual(self.rig.harness.typesToGame(), ["capacity.update", "capacity.update"])

    def test_heldUntilFirstUpdate(self) -> None:
        self.rig.request("r1")
        self.assertEqual(self.rig.sent(), [])
        self.rig.capacity(limit=2)
        self.assertEqual(self.rig.sent(), ["r1"])

    def test_queueLimitCountsInFlight(self) -> None:
        """
        Room is the limit less RPEngine's published depth less what it has
        not yet answered: it answers reply.accepted before the update that
        counts the request (app.rs accept_reply).
        """
        self.rig.capacity(depth=0, limit=2)
        for rid in ("r1", "r2", "r3"):
            self.rig.request(rid)
        self.assertEqual(self.rig.sent(), ["r1", "r2"])
        self.rig.end("r1", "reply.accepted")
        self.rig.capacity(depth=1, limit=2)
        self.assertEqual(self.rig.sent(), ["r1", "r2"], "r2 is not counted by RPEngine yet")
        self.assertEqual(self.rig.plugin.state()["awaitingAcceptance"], 1)
        self.rig.end("r2", "reply.accepted")
        self.rig.capacity(depth=2, limit=2)
        self.assertEqual(self.rig.sent(), ["r1", "r2"])
        self.rig.end("r1")
        self.assertEqual(self.rig.sent(), ["r1", "r2", "r3"])
        self.rig.request("r4")
        self.assertEqual(self.rig.plugin.held(), ["r4"])
        self.rig.capacity(depth=1, limit=2)
        self.assertEqual(self.rig.plugin.held(), ["r4"], "r3 is still unanswered")
        self.rig.end("r3", "reply.accepted")
        self.rig.capacity(depth=1, limit=2)
        self.assertEqual(self.rig.sent(), ["r1", "r2", "r3", "r4"])

    def test_burstOfTwentyTwoNeverOverruns(self) -> None:
        """
        22 clients at once against RPEngine's queue of 20, answered the way
        RPEngine answers (reply.accepted then capacity.update for each, in
        order): 20 are submitted, two wait here, none is refused.
        """
        self.rig.capacity(depth=0, limit=20)
        for i in range(22):
            self.rig.request(f"r{i}", client=f"c{i}")
        self.assertEqual(len(self.rig.sent()), 20)
        for depth, requestId in enumerate(list(self.rig.sent()), start=1):
            self.rig.end(str(requestId), "reply.accepted")
            self.rig.capacity(depth=depth, limit=20, accepting=depth < 20)
            self.assertEqual(len(self.rig.sent()), 20)
        self.assertEqual(len(self.rig.plugin.held()), 2)
        self.rig.end("r0")
        self.rig.capacity(depth=19, limit=20)
        self.assertEqual(len(self.rig.sent()), 21)
        self.assertEqual(self.rig.toGame("request.error"), [])

    def test_terminalFreesAPlace(self) -> None:
        self.rig.capacity(limit=1)
        self.rig.request("r1")
        self.rig.request("r2")
        self.rig.end("r1", "request.error", code="request_failed", retryable=False)
        self.assertEqual(self.rig.sent(), ["r1", "r2"])
        self.rig.request("r3")
        self.rig.end("r2", "reply.cancelled")
        self.assertEqual(self.rig.sent(), ["r1", "r2", "r3"])
        self.assertEqual(len(self.rig.toGame("request.error")), 1)

    def test_capacityExceededRequeuedAtFront(self) -> None:
        self.rig.capacity(limit=1)
        self.rig.request("r1")
        self.rig.request("r2")
        first = self.rig.harness.sentToEngine[0]
        self.rig.end("r1", "request.error", code="capacity_exceeded", retryable=True)
        self.assertEqual(self.rig.toGame("request.error"), [])
        self.assertEqual(self.rig.plugin.held(), ["r1", "r2"])
        self.assertEqual(self.rig.sent(), ["r1"])
        self.rig.capacity(limit=1)
        self.assertEqual(self.rig.sent(), ["r1", "r1"])
        again = self.rig.harness.sentToEngine[1]
        self.assertNotEqual(again.messageId, first.messageId)
        self.assertEqual(again["event"], first["event"])
        self.assertEqual(again.meta["client"], "A")
        self.assertEqual(self.rig.plugin.held(), ["r2"])

    def test_capacityExceededForUnknownRequestPasses(self) -> None:
        self.rig.end("elsewhere", "request.error", code="capacity_exceeded", retryable=True)
        self.assertEqual(len(self.rig.toGame("request.error")), 1)

    def test_fullLocalQueueRefused(self) -> None:
        rig = GateRig(queueLimit=2)
        rig.harness.startSession()
        rig.capacity(accepting=False)
        for rid in ("r1", "r2", "r3"):
            rig.request(rid)
        [error] = rig.toGame("request.error")
        self.assertEqual(error.requestId, "r3")
        self.assertEqual(error["code"], "capacity_exceeded")
        self.assertIs(error["retryable"], True)
        self.assertIn("local queue is full", error["message"])
        self.assertEqual(rig.plugin.held(), ["r1", "r2"])

    def test_fairBetweenClients(self) -> None:
        self.rig.capacity(accepting=False)
        for i in range(1, 6):
            self.rig.request(f"a{i}", client="A")
        self.rig.request("b1", client="B")
        expected = ["a1", "b1", "a2", "a3", "a4", "a5"]
        self.assertEqual(self.rig.plugin.held(), expected)
        self.rig.capacity(limit=1)
        for rid in expected[:-1]:
            self.rig.end(rid)
        self.assertEqual(self.rig.sent(), expected)

    def test_newClientNotBehindABusyOne(self) -> None:
        self.rig.capacity(limit=1)
        for i in range(1, 6):
            self.rig.request(f"a{i}", client="A")
        self.rig.request("b1", client="B")
        self.assertEqual(self.rig.sent(), ["a1"])
        self.rig.end("a1")
        self.assertEqual(self.rig.sent(), ["a1", "b1"])

    def test_clientDefaultsToApi(self) -> None:
        self.rig.capacity(accepting=False)
        self.rig.request("x1", client=None)
        self.rig.request("x2", client="api")
        self.rig.request("y1", client="other")
        self.assertEqual(self.rig.plugin.held(), ["x1", "y1", "x2"])

    def test_fifoPerClient(self) -> None:
        self.rig.capacity(accepting=False)
        for rid in ("c1", "c2", "c3"):
            self.rig.request(rid, client="C")
        self.rig.capacity(limit=5)
        self.assertEqual(self.rig.sent(), ["c1", "c2", "c3"])

    def test_cancelHeldAnsweredLocally(self) -> None:
        self.rig.capacity(limit=1)
        self.rig.request("r1")
        self.rig.request("r2")
        self.rig.request("v1", kind="voice.capture.start")
        self.rig.harness.toEngine("request.cancel", requestId="r2")
        self.rig.harness.toEngine("voice.capture.cancel", requestId="v1")
        self.assertEqual(self.rig.harness.typesToEngine(), ["reply.request"])
        self.assertEqual([e.requestId for e in self.rig.toGame("reply.cancelled")], ["r2", "v1"])
        self.assertEqual(self.rig.plugin.held(), [])
        # A cancel for work RPEngine has goes to RPEngine.
        self.rig.harness.toEngine("request.cancel", requestId="r1")
        self.assertEqual(self.rig.harness.typesToEngine(), ["reply.request", "request.cancel"])

    def test_engineLossKeepsQueue(self) -> None:
        self.rig.capacity(accepting=False)
        self.rig.request("r1")
        self.rig.harness.endSession()
        self.rig.request("r2")
        self.assertEqual(self.rig.plugin.held(), ["r1", "r2"])
        self.assertEqual(self.rig.plugin.state()["acceptingRequests"], None)
        self.rig.harness.startSession()
        self.assertEqual(self.rig.sent(), [])
        self.rig.capacity(limit=2)
        self.assertEqual(self.rig.sent(), ["r1", "r2"])

    def test_resubmittedGoFirstEvenWhenFull(self) -> None:
        rig = GateRig(queueLimit=1)
        rig.request("r1")
        rig.request("again", resubmitted=True)
        self.assertEqual(rig.plugin.held(), ["again", "r1"])
        self.assertEqual(rig.toGame("request.error"), [])

    def test_noSessionHolds(self) -> None:
        rig = GateRig()
        rig.request("r1")
        rig.clock.advance(10)
        self.assertEqual(rig.sent(), [])
        self.assertEqual(rig.plugin.held(), ["r1"])

    def test_otherMessagesPass(self) -> None:
        card = dict(REFERENCE_CARD)
        self.rig.harness.toEngine("character.sync", integrationId="g", characterId="c", card=card)
        self.rig.harness.toEngine("voice.capture.stop", requestId="unknown")
        self.assertEqual(self.rig.harness.typesToEngine(), ["character.sync", "voice.capture.stop"])

    def test_state(self) -> None:
        self.rig.capacity(accepting=True, depth=3, limit=4)
        self.rig.request("r1")
        self.rig.request("r2")
        state = self.rig.plugin.state()
        self.assertEqual(
            {k: state[k] for k in ("acceptingRequests", "queueDepth", "queueLimit", "held")},
            {"acceptingRequests": True, "queueDepth": 3, "queueLimit": 4, "held": ["r2"]},
        )


class AssumeTests(SynchronousTestCase):
    def test_assumeAfterTimeout(self) -> None:
        rig = GateRig()
        rig.harness.startSession()
        rig.request("r1")
        rig.request("r2")
        rig.clock.advance(1.9)
        self.assertEqual(rig.sent(), [])
        rig.clock.advance(0.2)
        self.assertEqual(rig.sent(), ["r1"])
        self.assertTrue(rig.plugin.state()["assumed"])
        rig.end("r1")
        self.assertEqual(rig.sent(), ["r1", "r2"])

    def test_assumesLastKnownLimit(self) -> None:
        rig = GateRig(assumeAfter=0.5)
        rig.harness.startSession()
        rig.capacity(accepting=False, limit=3)
        rig.harness.startSession()
        for rid in ("r1", "r2", "r3", "r4"):
            rig.request(rid)
        rig.clock.advance(0.5)
        self.assertEqual(rig.sent(), ["r1", "r2", "r3"])

    def test_updateCancelsTimer(self) -> None:
        rig = GateRig()
        rig.harness.startSession()
        self.assertEqual(len(rig.clock.getDelayedCalls()), 1)
        rig.capacity(accepting=False)
        self.assertEqual(rig.clock.getDelayedCalls(), [])
        rig.request("r1")
        rig.clock.advance(5)
        self.assertEqual(rig.sent(), [])

    def test_sessionEndCancelsTimer(self) -> None:
        rig = GateRig()
        rig.harness.startSession()
        rig.harness.endSession()
        rig.request("r1")
        rig.clock.advance(5)
        self.assertEqual(rig.sent(), [])


class WithCardCacheTests(SynchronousTestCase):
    """
    The gate before card-cache (nearer the game), as docs/plugins advise.
    """

    def test_localRefusalFreesThePlace(self) -> None:
        cache = CardCache(CardHasher(None), Timeline())
        rig = GateRig(plugins=[cache])
        rig.harness.startSession()
        rig.capacity(limit=1)
        card = exampleCard()
        card["data"]["name"] = 5
        bad = rig.harness.envelope(
            "reply.request",
            requestId="bad",
            integrationId="g",
            characterId="c",
            event={"text": "x"},
            card=snapshotTransfer(card, "0" * 64),
        )
        rig.harness.toEngine(bad)
        self.assertEqual([e.requestId for e in rig.toGame("request.error")], ["bad"])
        rig.request("good")
        self.assertEqual(rig.sent(), ["good"])
