"""
A character's attitude to the player (issue 33, part 3): its axes and named
levels, kept with the conversation in the store's generic state, changed by
the game (the memory op, the Python API) and by the actions it declares,
told to the game when a level changes, and given to the model in one line.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.actions import actions as buildActions  # noqa: N812
from rpmiddleware.builtin.memory import Memory, memory
from rpmiddleware.builtin.memory.attitude import (
    AXES,
    LEVELS,
    STATE,
    Attitude,
    AttitudeError,
    levelOf,
    valuesOf,
)
from rpmiddleware.builtin.memory.conversation import Conversation, Fact, Key
from rpmiddleware.builtin.memory.planner import Limits, plan
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.builtin.memory.storeerrors import InvalidDocument
from rpmiddleware.cards.hasher import CardHasher
from rpmiddleware.client.status import promptSummary
from rpmiddleware.config.settings import Settings
from rpmiddleware.plugin import Envelope, PluginServices
from rpmiddleware.plugin.clientext import TO_CLIENT
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import PluginHarness, exampleAction, exampleCard
from tests.support.memory import scenarioOf

KEY = Key("game", "c1", "slot-1")
#: What the ops name: the configured integration (the client named no character).
OWN = Key("rpmiddleware", "c1", "slot-1")


class LevelTests(SynchronousTestCase):
    def test_levelsAtTheirThresholds(self) -> None:
        """Each level starts at its threshold and ends one below the next."""
        for i, (name, start) in enumerate(LEVELS):
            self.assertEqual(levelOf(start), name)
            if i:
                self.assertEqual(levelOf(start - 1), LEVELS[i - 1][0])
        self.assertEqual(levelOf(-100), "hostile")
        self.assertEqual(levelOf(100), "devoted")
        self.assertEqual(levelOf(0), "neutral")

    def test_changeIsBoundedAndNamesTheLevelsThatMoved(self) -> None:
        start = Attitude({"trust": 15, "affection": 95, "respect": 0})
        after, moved = start.changed({"trust": 30, "affection": 30, "respect": -3}, step=10)
        self.assertEqual(after.values, {"trust": 25, "affection": 100, "respect": -3})
        self.assertEqual(
            [(m.axis, m.before, m.after) for m in moved], [("trust", "neutral", "warm")]
        )
        self.assertEqual(start.values["trust"], 15, "the old one is left as it was")

    def test_setIsClampedWithoutAStep(self) -> None:
        after, moved = Attitude().changed({"respect": -70}, absolute=True)
        self.assertEqual(after.values["respect"], -70)
        self.assertEqual(moved[0].asDict(), {"axis": "respect", "from": "neutral",
                                             "to": "hostile", "value": -70})  # fmt: skip

    def test_lineNamesEveryAxisWithLevelAndValue(self) -> None:
        attitude = Attitude({"trust": 40, "affection": -30, "respect": 0}, "wary of her promises")
        self.assertEqual(
            attitude.line("Mira", "Ada"),
            "Mira's attitude to Ada: trust warm (40), affection cold (-30), respect neutral (0); "
            "stance: wary of her promises",
        )

    def test_badStateIsNeutral(self) -> None:
        """A hand-edited save never stops a character: what does not read is neutral."""
        made = Attitude.fromState({STATE: {"trust": "lots", "affection": 500, "stance": 3}})
        self.assertEqual(made.values, {"trust": 0, "affection": 100, "respect": 0})
        self.assertEqual(made.stance, "")
        self.assertTrue(Attitude.fromState({STATE: []}).neutral)

    def test_valuesRefuseUnknownAxesAndBadNumbers(self) -> None:
        with self.assertRaisesRegex(AttitudeError, r"set\.love is not an axis"):
            valuesOf({"love": 3}, "set", -100, 100)
        with self.assertRaisesRegex(AttitudeError, r"set\.trust must be a whole number"):
            valuesOf({"trust": 101}, "set", -100, 100)
        with self.assertRaisesRegex(AttitudeError, r"set\.trust must be a whole number"):
            valuesOf({"trust": True}, "set", -100, 100)


class StateTests(SynchronousTestCase):
    """The store's generic per-conversation state (MemoryStore.setState)."""

    def test_keptAcrossARestart(self) -> None:
        path = os.path.abspath(self.mktemp())
        store = MemoryStore(path, lambda: 1.0)
        conversation = store.conversation(KEY)
        self.assertIsNone(self.successResultOf(store.setState(conversation, "mood", {"a": 1})))
        store.setState(conversation, "attitude", {"trust": 5})
        store.setState(conversation, "mood", {"a": 2})
        store.close()
        again = MemoryStore(path, lambda: 2.0).conversation(KEY)
        self.assertEqual(again.state, {"mood": {"a": 2}, "attitude": {"trust": 5}})

    def test_noneRemovesAndForgetTakesItAll(self) -> None:
        path = os.path.abspath(self.mktemp())
        store = MemoryStore(path, lambda: 1.0)
        conversation = store.conversation(KEY)
        store.setState(conversation, "mood", "calm")
        store.setState(conversation, "other", 1)
        store.setState(conversation, "other", None)
        self.assertEqual(conversation.state, {"mood": "calm"})
        store.forget(KEY)
        store.close()
        self.assertEqual(MemoryStore(path, lambda: 2.0).conversation(KEY).state, {})

    def test_refusesWhatJSONCannotWrite(self) -> None:
        store = MemoryStore(":memory:", lambda: 1.0)
        conversation = store.conversation(KEY)
        self.assertRaises(ValueError, store.setState, conversation, "mood", float("nan"))
        self.assertRaises(ValueError, store.setState, conversation, " ", 1)
        self.assertEqual(conversation.state, {})

    def test_exportedAndRestoredSealed(self) -> None:
        store = MemoryStore(":memory:", lambda: 1.0)
        conversation = store.conversation(KEY)
        store.append(conversation, ("player", "Ada", "Hello.", "complete"))
        store.setState(conversation, STATE, {"trust": 30, "stance": "likes her"})
        document = store.export(conversation)
        self.assertEqual(document["state"], {STATE: {"trust": 30, "stance": "likes her"}})
        other = Key("game", "c1", "slot-2")
        self.assertEqual(store.restore(other, document).state, document["state"])
        document["state"][STATE]["trust"] = 100
        with self.assertRaisesRegex(InvalidDocument, "checksum"):
            store.restore(other, document)

    def test_exportWithoutStateUnchanged(self) -> None:
        """A conversation with no state exports as before (no state key)."""
        store = MemoryStore(":memory:", lambda: 1.0)
        conversation = store.conversation(KEY)
        store.append(conversation, ("player", "Ada", "Hello.", "complete"))
        self.assertNotIn("state", store.export(conversation))


def services(clock: Clock) -> PluginServices:
    return PluginServices(clock, Settings(), CardHasher(None), Timeline())


class Rig:
    """The memory plugin (and maybe actions) in a harness, a game's conversation."""

    def __init__(self, test: SynchronousTestCase, withActions: bool = False, **settings: Any):
        self.clock = Clock()
        built = services(self.clock)
        plugin = memory.buildPlugin({"path": ":memory:", **settings}, built)
        assert isinstance(plugin, Memory)
        self.memory = plugin
        chain: list[Any] = [plugin]
        if withActions:
            chain.insert(0, buildActions.buildPlugin({}, built))
        self.harness = PluginHarness(chain, clock=self.clock, cards=built.cards)
        self.harness.startSession()
        self.test = test

    def ask(self, client: str = "c1", **message: Any) -> dict[str, Any]:
        self.harness.fromClient(client, {"type": "memory", "characterId": "c1",
                                         "conversationId": "slot-1", **message})  # fmt: skip
        answer: dict[str, Any] = self.harness.sentToGame[-1]["message"]
        return answer

    def events(self, client: str = "c1") -> list[dict[str, Any]]:
        return [
            e["message"] for e in self.harness.sentToGame
            if e.type == TO_CLIENT and e["clientId"] == client
            and e["message"]["type"] == "memory-event" and e["message"]["event"] == "attitude"
        ]  # fmt: skip

    def turn(self, requestId: str, text: str = "Hello.", reply: str = "Welcome.") -> Envelope:
        request = self.harness.replyRequest(
            requestId, text=text, player={"displayName": "Ada"},
            meta={"client": "c1", "conversation": "slot-1"},
        )  # fmt: skip
        self.harness.toEngine(request)
        sent = self.harness.sentToEngine[-1]
        self.harness.toGame("reply.text.completed", requestId=requestId, text=reply)
        self.harness.toGame("reply.completed", requestId=requestId)
        return sent


class OpTests(SynchronousTestCase):
    def test_readIsNeutralAtFirst(self) -> None:
        answer = Rig(self).ask(op="attitude", id=1)
        self.assertEqual(answer["type"], "memory-result", answer)
        self.assertEqual(answer["changes"], [])
        self.assertEqual(
            answer["attitude"]["axes"], {a: {"value": 0, "level": "neutral"} for a in AXES}
        )

    def test_setAdjustAndTheGameIsToldOfEachLevelChange(self) -> None:
        rig = Rig(self)
        answer = rig.ask(op="attitude", set={"trust": 40}, stance="Owes Ada her life.")
        self.assertEqual(answer["attitude"]["axes"]["trust"], {"value": 40, "level": "warm"})
        self.assertEqual(answer["attitude"]["stance"], "Owes Ada her life.")
        self.assertEqual(answer["changes"], [{"axis": "trust", "from": "neutral", "to": "warm",
                                              "value": 40}])  # fmt: skip
        rig.ask(op="attitude", adjust={"trust": 5})  # still warm: nothing told
        answer = rig.ask(op="attitude", adjust={"trust": -30, "respect": -65})
        self.assertEqual(answer["attitude"]["axes"]["trust"]["value"], 15)
        events = rig.events()
        self.assertEqual(len(events), 2, events)
        self.assertEqual(events[-1]["source"], "game")
        self.assertEqual(events[-1]["conversationId"], "slot-1")
        self.assertEqual([c["to"] for c in events[-1]["changes"]], ["neutral", "hostile"])
        self.assertEqual(rig.memory.attitude("c1", "slot-1")["axes"]["respect"]["value"], -65)

    def test_badOpsAreInvalidMessages(self) -> None:
        rig = Rig(self)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"set": {"love": 1}}, "set.love is not an axis"),
            ({"adjust": {"trust": 1.5}}, "adjust.trust must be a whole number"),
            ({"set": {"trust": 1}, "adjust": {"trust": 1}}, "set or adjust, not both"),
            ({"stance": "x" * 201}, "stance is longer than 200"),
        ]
        for message, why in cases:
            answer = rig.ask(op="attitude", id=7, **message)
            self.assertEqual((answer["type"], answer["code"]), ("error", "INVALID_MESSAGE"))
            self.assertIn(why, answer["message"])
        self.assertTrue(Attitude.fromState(rig.memory.conversation(OWN).state).neutral)

    def test_offRefusesChanges(self) -> None:
        answer = Rig(self, attitude=False).ask(op="attitude", set={"trust": 3})
        self.assertEqual(answer["code"], "INVALID_MESSAGE")
        self.assertIn("attitude is turned off", answer["message"])


class ModelLineTests(SynchronousTestCase):
    def test_lineReachesTheNextRequest(self) -> None:
        rig = Rig(self)
        first = rig.turn("t1")
        self.assertNotIn("attitude to", scenarioOf(first), "neutral: no line")
        rig.memory.setAttitude("c1", "slot-1", {"trust": 40, "affection": -30}, "wary",
                               integrationId="game")  # fmt: skip
        second = rig.turn("t2", "Can I trust you?")
        self.assertIn(
            "Mira the Innkeeper's attitude to Ada: trust warm (40), affection cold (-30), "
            "respect neutral (0); stance: wary",
            scenarioOf(second),
        )
        # The console shows the levels the model was told (never the stance's words).
        entry = rig.memory.timeline.get(second.requestId)
        report = entry.details["memory"]
        shown = promptSummary(report)
        self.assertEqual(shown["attitude"], {"trust": "warm", "affection": "cold",
                                             "respect": "neutral"})  # fmt: skip
        self.assertNotIn("wary", str(shown))

    def test_offLeavesTheLineOut(self) -> None:
        rig = Rig(self, attitude=False)
        rig.memory.conversation(KEY).state[STATE] = {"trust": 50}
        self.assertNotIn("attitude to", scenarioOf(rig.turn("t1")))


class BudgetTests(SynchronousTestCase):
    def test_lineGivesWayLastAndNeverOverflows(self) -> None:
        """
        Fitted by RPEngine's estimate like the facts: as the limit shrinks,
        every plan stays within it, the pinned fact goes before the
        attitude line, and at some limit the line goes too while the
        request is still planned.
        """
        request = {
            "event": {"text": "Hello."},
            "player": {"displayName": "Ada"},
            "output": {"modalities": ["text"], "language": "en"},
        }
        conversation = Conversation(KEY, facts=[Fact(1, "Ada carries the ring of the north.")])
        line = Attitude({"trust": 40, "affection": -30, "respect": 0}, "wary").line("Mira", "Ada")
        whole = plan(request, exampleCard(), conversation, [], Limits(), False, 0, None, False,
                     attitude=line)  # fmt: skip
        self.assertTrue(whole.report["attitude"]["included"])
        seen = set()
        for limit in range(whole.report["estimatedTokens"], 0, -1):
            made = plan(request, exampleCard(), conversation, [], Limits(maxInputTokens=limit),
                        False, 0, None, False, attitude=line)  # fmt: skip
            if made.card is None:
                break
            self.assertLessEqual(made.report["estimatedTokens"], limit)
            facts, attitude = made.report["facts"]["included"], made.report["attitude"]["included"]
            self.assertFalse(facts and not attitude, f"the line went before the fact at {limit}")
            seen.add((bool(facts), attitude))
        self.assertIn((False, True), seen)
        self.assertIn((False, False), seen)


class ActionEffectTests(SynchronousTestCase):
    """A declared action's attitude effect, applied when the game reports it done."""

    def setUp(self) -> None:
        self.rig = Rig(self, withActions=True)
        declared = exampleAction(name="give_gift", attitude={"affection": 25, "trust": 5})
        self.rig.harness.fromClient("c1", {"type": "actions", "op": "declare",
                                           "actions": [declared]})  # fmt: skip
        self.assertEqual(self.rig.harness.sentToGame[-1]["message"]["type"], "actions-result")

    def call(self, requestId: str) -> str:
        harness = self.rig.harness
        request = harness.replyRequest(requestId, text="A gift for you.",
                                       meta={"client": "c1", "conversation": "slot-1"})  # fmt: skip
        harness.toEngine(request)
        captured = {"rpmiddleware.action": ['give_gift {"gate": "north"}']}
        harness.toGame(
            "reply.text.completed", requestId=requestId, text="Thanks.", extractedContent=captured
        )
        harness.toGame("reply.completed", requestId=requestId)
        started = [
            e["message"] for e in harness.sentToGame
            if e.type == TO_CLIENT and e["message"]["type"] == "tool-call-start"
        ]  # fmt: skip
        return str(started[-1]["callId"])

    def test_appliedWhenTheCallSucceeds(self) -> None:
        callId = self.call("t1")
        self.assertTrue(Attitude.fromState(self.rig.memory.conversation(KEY).state).neutral,
                        "not before the game says it was done")  # fmt: skip
        self.rig.harness.fromClient("c1", {"type": "tool-result", "callId": callId, "result": 1})
        attitude = self.rig.memory.attitude("c1", "slot-1", "game")["axes"]
        self.assertEqual((attitude["affection"]["value"], attitude["trust"]["value"]), (25, 5))
        events = self.rig.events()
        self.assertEqual(len(events), 1, events)
        self.assertEqual(events[0]["source"], "action give_gift")
        self.assertEqual(
            events[0]["changes"],
            [{"axis": "affection", "from": "neutral", "to": "warm", "value": 25}],
        )

    def test_notAppliedWhenItFails(self) -> None:
        callId = self.call("t1")
        self.rig.harness.fromClient("c1", {"type": "tool-result", "callId": callId,
                                           "error": "no room in the bag"})  # fmt: skip
        self.assertTrue(Attitude.fromState(self.rig.memory.conversation(KEY).state).neutral)

    def test_badEffectRefusedAtDeclaration(self) -> None:
        self.rig.harness.fromClient("c1", {"type": "actions", "op": "declare", "actions": [
            exampleAction(name="insult", attitude={"love": -5})]})  # fmt: skip
        answer = self.rig.harness.sentToGame[-1]["message"]
        self.assertEqual(answer["type"], "error")
        self.assertIn("attitude.love is not an axis", answer["message"])


class MoodStateTests(SynchronousTestCase):
    """
    The feelings plugin's mood (meta mood on a reply's text) is kept in the
    conversation's state and given back on its next request.
    """

    def test_keptAndGivenBack(self) -> None:
        rig = Rig(self)
        harness = rig.harness
        slot = {"client": "c1", "conversation": "slot-1"}
        harness.toEngine(harness.replyRequest("t1", text="Hi.", meta=slot))
        completed = harness.envelope("reply.text.completed", requestId="t1", text="Hello.")
        completed.meta["mood"] = {"joy": 0.6, "sadness": 0.1}
        harness.toGame(completed)
        harness.toGame("reply.completed", requestId="t1")
        self.assertEqual(rig.memory.conversation(KEY).state["mood"], {"joy": 0.6, "sadness": 0.1})
        following = rig.turn("t2")
        self.assertEqual(following.meta["mood"], {"joy": 0.6, "sadness": 0.1})

    def test_noMoodNoMeta(self) -> None:
        rig = Rig(self)
        rig.turn("t1")
        self.assertNotIn("mood", rig.turn("t2").meta)
