"""
Reflection in the player's pauses (issue 33, part 2): a request of the
memory plugin's own, after summaries had their chance, that asks RPEngine
what a character makes of recent events; its JSON answer checked against a
schema, kept (details as memories, an attitude change bounded per
reflection), dropped and asked again later when it fails, cancelled the
moment a player's turn needs RPEngine, never seen by a client.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from rpmiddleware.builtin.memory import IConversationMemory, Memory, memory
from rpmiddleware.builtin.memory import reflection as reflections  # the module, patched
from rpmiddleware.builtin.memory.attitude import Attitude
from rpmiddleware.builtin.memory.conversation import Key
from rpmiddleware.builtin.memory.reflection import (
    REFLECTOR_ID,
    RULE_ID,
    Reflection,
    ReflectionError,
    readReflection,
)
from rpmiddleware.builtin.memory.summarizer import SUMMARIZER_ID
from rpmiddleware.cards.hasher import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import Envelope, PluginServices
from rpmiddleware.plugin.clientext import TO_CLIENT
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.inmemory import connectInMemory
from rpmiddleware.testing.kit import PluginHarness, exampleCard
from rpmiddleware.testing.simoptions import SimulatorOptions, defaultReplyText
from tests.support.memory import scenarioOf, settle

KEY = Key("game", "c1", "slot-1")
TEXT_ONLY = {"modalities": ["text"], "language": "en"}
GOOD = json.dumps(
    {
        "details": ["Ada has a sister, Lena, in Eastwatch."],
        "change": {"trust": 40, "affection": 5},
        "stance": "Grateful to Ada for the rescue.",
    }
)


class ReadTests(SynchronousTestCase):
    def test_goodAnswer(self) -> None:
        made = readReflection(GOOD)
        self.assertEqual(made.details, ("Ada has a sister, Lena, in Eastwatch.",))
        self.assertEqual(made.change, {"trust": 40, "affection": 5})
        self.assertEqual(made.stance, "Grateful to Ada for the rescue.")

    def test_badAnswersSayWhy(self) -> None:
        for answer, why in [
            ("{not json", "not JSON"),
            ('{"details": []}', "'change' is a required property"),
            ('{"change": {"love": 3}}', "change: Additional properties"),
            ('{"change": {"trust": 2.5}}', "change/trust: 2.5 is not of type 'integer'"),
            ('{"change": {}, "details": ["a", "b", "c", "d"]}', "details: ['a', 'b', 'c', 'd']"),
            ('["change"]', "is not of type 'object'"),
        ]:
            with self.assertRaises(ReflectionError) as caught:
                readReflection(answer)
            self.assertIn(why, str(caught.exception))


class Rig:
    """The memory plugin in a harness, playing a game's conversation."""

    def __init__(self, **settings: Any) -> None:
        self.clock = Clock()
        built = PluginServices(self.clock, Settings(), CardHasher(None), Timeline())
        defaults = {"path": ":memory:", "reflection_every_entries": 4, "reflection_step": 25}
        plugin = memory.buildPlugin({**defaults, **settings}, built)
        assert isinstance(plugin, Memory)
        self.memory = plugin
        self.harness = PluginHarness(plugin, clock=self.clock, cards=built.cards)
        self.harness.startSession()
        self.turns = 0

    def turn(self, text: str = "Hello.", reply: str = "Welcome.", end: bool = True) -> Envelope:
        self.turns += 1
        requestId = f"t{self.turns}"
        request = self.harness.replyRequest(
            requestId, text=text, player={"displayName": "Ada"},
            meta={"client": "c1", "conversation": "slot-1"},
        )  # fmt: skip
        self.harness.toEngine(request)
        sent = self.harness.sentToEngine[-1]
        if end:
            self.harness.toGame("reply.text.completed", requestId=requestId, text=reply)
            self.harness.toGame("reply.completed", requestId=requestId)
        return sent

    def asked(self, characterId: str = REFLECTOR_ID) -> list[Envelope]:
        return [
            e for e in self.harness.sentToEngine
            if e.type == "reply.request" and e["characterId"] == characterId
        ]  # fmt: skip

    def answer(self, request: Envelope, captured: list[str], text: str = "") -> None:
        requestId = request.requestId
        self.harness.toGame("reply.accepted", requestId=requestId)
        self.harness.toGame("reply.text.completed", requestId=requestId, text=text or "ok",
                            extractedContent={RULE_ID: captured})  # fmt: skip
        self.harness.toGame("reply.completed", requestId=requestId)

    def attitude(self) -> Attitude:
        return Attitude.fromState(self.memory.conversation(KEY).state)

    def seenByGame(self, requestId: str | None) -> list[Envelope]:
        return [e for e in self.harness.sentToGame if e.requestId == requestId]


class ReflectionTests(SynchronousTestCase):
    def test_askedInAPauseAndKept(self) -> None:
        """
        Once enough is new, a pause brings a reflection request of the
        plugin's own (buffered, with the rule that takes its JSON out); its
        answer's details are kept as memories of high importance, its change
        moves each axis at most reflection_step, the game is told the level
        that changed, and the next request holds the attitude line.
        """
        rig = Rig()
        rig.turn("I found your lost ring on the north road.", "You found it? Thank you!")
        rig.clock.advance(10)
        self.assertEqual(rig.asked(), [], "not yet due: two entries")
        rig.turn("My sister Lena lives in Eastwatch.", "Eastwatch is far.")
        settle(rig.clock, rig.memory.settings.reflection_idle_seconds - 0.1)
        self.assertEqual(rig.asked(), [], "not before the pause")
        settle(rig.clock, 0.2)
        [request] = rig.asked()
        self.assertEqual(request["output"]["responseProcessing"]["mode"], "buffered")
        self.assertEqual(request["output"]["modalities"], ["text"])
        text = request["event"]["text"]
        self.assertIn("Ada: My sister Lena lives in Eastwatch.", text)
        self.assertIn("Who you are: Mira runs the Gilded Tankard", text)
        self.assertIn("from -25 to 25", text)
        rig.answer(request, [GOOD])
        self.assertEqual(rig.seenByGame(request.requestId), [], "never shown to a client")
        after = rig.attitude()
        self.assertEqual((after.values["trust"], after.values["affection"]), (25, 5))
        self.assertEqual(after.stance, "Grateful to Ada for the rescue.")
        conversation = rig.memory.conversation(KEY)
        kept = [(m.text, m.importance, m.source) for m in conversation.memories]
        self.assertEqual(kept, [("Ada has a sister, Lena, in Eastwatch.", 0.9, "reflection")])
        told = [
            e for e in rig.harness.sentToGame
            if e.type == TO_CLIENT and e["message"].get("event") == "attitude"
        ]  # fmt: skip
        self.assertEqual([e["clientId"] for e in told], ["c1"], "the client that plays it")
        event = told[0]["message"]
        self.assertEqual((event["source"], event["conversationId"]), ("reflection", "slot-1"))
        warmer = {"axis": "trust", "from": "neutral", "to": "warm", "value": 25}
        self.assertEqual(event["changes"], [warmer])
        following = rig.turn("Will you help me?")
        self.assertIn(
            "Mira the Innkeeper's attitude to Ada: trust warm (25), affection neutral (5), "
            "respect neutral (0); stance: Grateful to Ada for the rescue.",
            scenarioOf(following),
        )
        self.assertEqual(rig.memory.counts["reflections"], 1)

    def test_coolDownBetweenReflections(self) -> None:
        rig = Rig()
        for _ in range(2):
            rig.turn()
        settle(rig.clock, 5)
        rig.answer(rig.asked()[-1], [GOOD])
        for _ in range(2):
            rig.turn()
        settle(rig.clock, 5)
        self.assertEqual(len(rig.asked()), 1, "within the cool-down")
        settle(rig.clock, rig.memory.settings.reflection_cooldown_seconds)
        self.assertEqual(len(rig.asked()), 2)
        self.assertIn("Hello.", rig.asked()[-1]["event"]["text"])

    def test_failingReflectionsBackOffAndTheCharacterStillWorks(self) -> None:
        """
        Answers that fail (no JSON, the schema refuses, the request fails)
        are dropped, each asked again after twice the wait of the one before;
        meanwhile every turn of the character goes as ever.
        """
        rig = Rig(reflection_cooldown_seconds=10)
        for _ in range(2):
            rig.turn()
        waits = []
        answers: list[list[str]] = [[], ['{"change": {"love": 1}}'], ["{oops"], []]
        for i, captured in enumerate(answers):
            settle(rig.clock, 5 if i == 0 else 0)
            asked = rig.asked()
            self.assertEqual(len(asked), i + 1)
            start = rig.clock.seconds()
            if i == 3:
                rig.harness.toGame("request.error", requestId=asked[-1].requestId,
                                   code="request_failed", message="no")  # fmt: skip
            else:
                rig.answer(asked[-1], captured, text="I would rather not say.")
            # A turn between failures works as ever, and is remembered.
            following = rig.turn(f"Line {i}.", f"Reply {i}.")
            self.assertEqual(following["characterId"], "c1")
            while len(rig.asked()) == i + 1 and rig.clock.seconds() - start < 1000:
                rig.clock.advance(1)
            waits.append(rig.clock.seconds() - start)
        self.assertEqual([round(w) for w in waits[:3]], [10, 20, 40])
        self.assertEqual(rig.memory.counts["reflectionFailures"], 4)
        self.assertEqual(rig.memory.counts["reflections"], 0)
        self.assertTrue(rig.attitude().neutral)
        said = [e.text for e in rig.memory.conversation(KEY).entries]
        self.assertEqual(said[-2:], ["Line 3.", "Reply 3."])
        for request in rig.asked():
            self.assertEqual(rig.seenByGame(request.requestId), [])

    def test_cancelledAtOnceForAPlayerTurnAndAskedAgain(self) -> None:
        """
        A reflection in flight is cancelled the moment a player's turn
        arrives: the cancel goes first and the player's request right after
        it, in the same reactor turn; what RPEngine still says of the
        reflection reaches no client, and it is asked again at the next pause.
        """
        rig = Rig()
        for _ in range(2):
            rig.turn()
        settle(rig.clock, 5)
        [reflection] = rig.asked()
        before = len(rig.harness.sentToEngine)
        player = rig.turn("Wait, one more thing.", end=False)
        sent = rig.harness.sentToEngine[before:]
        self.assertEqual([e.type for e in sent], ["request.cancel", "reply.request"])
        self.assertEqual(sent[0].requestId, reflection.requestId)
        self.assertIs(sent[1], player)
        rig.harness.toGame("reply.cancelled", requestId=reflection.requestId)
        self.assertEqual(rig.seenByGame(reflection.requestId), [])
        rig.harness.toGame("reply.text.completed", requestId=player.requestId, text="Yes?")
        rig.harness.toGame("reply.completed", requestId=player.requestId)
        self.assertEqual(rig.memory.counts["reflectionFailures"], 0, "not its fault")
        settle(rig.clock, 5)
        self.assertEqual(len(rig.asked()), 2)
        self.assertIn("Wait, one more thing.", rig.asked()[-1]["event"]["text"])

    def test_unansweredIsLetGoAfterItsTimeout(self) -> None:
        """
        A reflection RPEngine never answers (the link gone quiet) is
        cancelled after reflection_timeout and asked again after the back-off.
        """
        rig = Rig(reflection_timeout=30, reflection_cooldown_seconds=10)
        for _ in range(2):
            rig.turn()
        settle(rig.clock, 5)
        [first] = rig.asked()
        settle(rig.clock, 30)
        cancels = [e.requestId for e in rig.harness.sentToEngine if e.type == "request.cancel"]
        self.assertEqual(cancels, [first.requestId])
        self.assertIsNone(rig.memory.reflections.current)
        self.assertEqual(rig.memory.counts["reflectionFailures"], 1)
        settle(rig.clock, 10)
        self.assertEqual(len(rig.asked()), 2)

    def test_summariesGoFirst(self) -> None:
        """In a pause with a summary due, the reflection waits for it."""
        rig = Rig(summarize_after_tokens=20, keep_recent_tokens=10)
        padding = "The rain keeps falling on the old roads and the fields beyond them. " * 3
        for i in range(3):
            rig.turn(f"Line {i}. {padding}", f"Reply {i}.")
        settle(rig.clock, 10)
        summaries = rig.asked(SUMMARIZER_ID)
        self.assertEqual(len(summaries), 1)
        self.assertEqual(rig.asked(), [], "not while the summary is asked")
        requestId = summaries[0].requestId
        rig.harness.toGame("reply.text.completed", requestId=requestId, text="They talked.")
        rig.harness.toGame("reply.completed", requestId=requestId)
        settle(rig.clock, 10)
        self.assertEqual(len(rig.asked()), 1)

    def test_sessionConversationGoneIsNotReflectedOn(self) -> None:
        """A client session's own conversation, let go of with it, is not asked about."""
        rig = Rig()
        for i in range(2):
            request = rig.harness.replyRequest(f"s{i}", text="Hi.", meta={"client": "c1"})
            rig.harness.toEngine(request)
            rig.harness.toGame("reply.text.completed", requestId=f"s{i}", text="Hello.")
            rig.harness.toGame("reply.completed", requestId=f"s{i}")
        self.assertEqual(len(rig.memory.reflections.due), 1)
        rig.harness.endClientSession("c1")
        self.assertEqual(rig.memory.reflections.due, {})
        settle(rig.clock, 100)
        self.assertEqual(rig.asked(), [])

    def test_offAsksNothing(self) -> None:
        rig = Rig(reflections=False)
        for _ in range(6):
            rig.turn()
        settle(rig.clock, 100)
        self.assertEqual(rig.asked(), [])


def reflectingReplies(request: dict[str, Any]) -> str:
    """A model that answers a reflection with prose around its JSON, and turns as ever."""
    if request.get("characterId") == REFLECTOR_ID:
        return f"Here is what I make of it: {GOOD} That is all."
    return defaultReplyText(request)


class SimulatedEngineTests(SynchronousTestCase):
    """Against the simulated RPEngine (its response processing, its FIFO queue)."""

    def setUp(self) -> None:
        self.clock = Clock()
        settings = Settings()
        settings.plugins["memory"] = {"path": ":memory:", "reflection_every_entries": 4,
                                      "reflection_step": 25}  # fmt: skip
        self.middleware = Middleware.fromSettings(self.clock, settings)
        options = SimulatorOptions(replyText=reflectingReplies, tokensPerSecond=20)
        self.link = connectInMemory(self.middleware, self.clock, options)
        settle(self.clock, 0.1)
        found = self.middleware.plugin(IConversationMemory)
        assert isinstance(found, Memory)
        self.memory = found

    def say(self, text: str, wait: float = 30.0) -> Any:
        stream = self.middleware.requestReply(
            "mira", text=text, card=exampleCard(), output=TEXT_ONLY,
            player={"displayName": "Ada"}, meta={"client": "c1", "conversation": "slot-1"},
        )  # fmt: skip
        settle(self.clock, wait)
        return stream

    def test_reflectionReachesTheNextInvocation(self) -> None:
        self.say("I found your ring.")
        self.say("My sister Lena lives in Eastwatch.", wait=60)
        self.assertEqual(self.memory.counts["reflections"], 1)
        self.say("Do you trust me?")
        self.assertIn("Mira the Innkeeper's attitude to Ada: trust warm (25)",
                      self.link.engine.invocations[-1].system)  # fmt: skip

    def test_playerLineIsNotHeldBehindAReflection(self) -> None:
        """
        The simulated engine runs one request at a time, FIFO: a reflection
        still generating would hold the player's line back; it is cancelled
        as the line arrives, so the line is the next thing generated.
        """
        self.say("I found your ring.")
        self.say("My sister Lena lives in Eastwatch.", wait=0)
        while not self.memory.reflections.current:
            self.clock.advance(0.1)
        reflection = self.memory.reflections.current
        invoked = len(self.link.engine.invocations)
        stream = self.say("Wait!", wait=0)
        self.assertIn(reflection.requestId, self.link.engine.cancelled)
        settle(self.clock, 30)
        self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        self.assertEqual(self.link.engine.invocations[invoked].user, "Wait!")
        shown = [entry.requestId for entry in self.middleware.timeline.recent()]
        self.assertNotIn(reflection.requestId, shown)


class OffTheReactorTests(TestCase):
    """The answer is read and checked on a thread of its own, never the reactor's."""

    def test_answerCheckedOnTheReflectionThread(self) -> Deferred[None]:
        threads: list[threading.Thread] = []
        real = reflections.readReflection

        def spy(text: str) -> Reflection:
            threads.append(threading.current_thread())
            return real(text)

        self.patch(reflections, "readReflection", spy)
        services = PluginServices(reactor, Settings(), CardHasher(None), Timeline())
        plugin = memory.buildPlugin({"path": ":memory:"}, services)
        assert isinstance(plugin, Memory)
        self.addCleanup(plugin.close)
        plugin.conversation(KEY)
        done: Deferred[Reflection] = Deferred()
        scheduler = plugin.reflections
        scheduler.reflected = lambda conversation, answer, through: done.callback(answer)
        scheduler.current = reflections._Reflecting("memory-reflection-1", KEY, 2)
        completed = Envelope.build("reply.text.completed", requestId="memory-reflection-1")
        completed.fields.update(text="ok", extractedContent={RULE_ID: [GOOD]})
        scheduler.envelope(completed)
        scheduler.envelope(Envelope.build("reply.completed", requestId="memory-reflection-1"))

        def checked(answer: Reflection) -> None:
            self.assertEqual(answer.change, {"trust": 40, "affection": 5})
            self.assertEqual(len(threads), 1)
            self.assertIsNot(threads[0], threading.main_thread())
            self.assertIn("rpmiddleware-memory-reflection", threads[0].name)

        return done.addCallback(checked)
