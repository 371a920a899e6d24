"""
The memory plugin against the simulated RPEngine, which assembles every
prompt as RPEngine's core does (rpmiddleware.protocol.prompt after prompt.rs):
what each model invocation holds, across turns, restarts, summaries and
barge-in.  No sockets and no real time: an in-memory link on a Clock.
"""

from __future__ import annotations

import os
import re
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.memory import IConversationMemory, Memory
from rpmiddleware.builtin.memory.summarizer import SUMMARIZER_ID
from rpmiddleware.client.status import promptSummary
from rpmiddleware.config.settings import Settings
from rpmiddleware.console.metrics import MiddlewareMetrics
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.protocol.prompt import AssembledPrompt
from rpmiddleware.testing.inmemory import InMemoryEngine, connectInMemory
from rpmiddleware.testing.kit import exampleCard, examplePromptContext
from rpmiddleware.testing.simoptions import SimulatorOptions, defaultReplyText
from tests.support.memory import settle

TEXT_ONLY = {"modalities": ["text"], "language": "en"}


class Rig:
    def __init__(
        self,
        path: str = ":memory:",
        options: SimulatorOptions | None = None,
        **memory: Any,
    ) -> None:
        self.clock = Clock()
        settings = Settings()
        settings.plugins["memory"] = {"path": path, **memory}
        self.middleware = Middleware.fromSettings(self.clock, settings)
        self.link: InMemoryEngine = connectInMemory(self.middleware, self.clock, options)
        settle(self.clock, 0.1)
        memoryPlugin = self.middleware.plugin(IConversationMemory)
        assert isinstance(memoryPlugin, Memory)
        self.memory = memoryPlugin
        self.card = exampleCard()

    @property
    def invocations(self) -> list[AssembledPrompt]:
        return self.link.engine.invocations

    def say(self, text: str, client: str = "c1", wait: float = 5.0, **meta: Any) -> ReplyStream:
        stream = self.middleware.requestReply(
            "mira",
            text=text,
            card=self.card,
            output=TEXT_ONLY,
            player={"displayName": "Alex"},
            meta={"client": client, **meta},
        )
        settle(self.clock, wait)
        return stream

    def stop(self) -> None:
        self.memory.store.close()


def summarizingReplies(request: dict[str, Any]) -> str:
    """
    Replies as the simulator makes them, and summaries as a faithful model
    would write them: what the summary so far said, and the brother's name
    when the lines to fold in mention him.
    """
    if request.get("characterId") != SUMMARIZER_ID:
        return defaultReplyText(request)
    text = request["event"]["text"]
    kept = "Alex lost a brother, Tomas, on the north road." if "Tomas" in text else ""
    return f"{kept} They talked at length (summary {text.count(':')})."


class ConversationTests(SynchronousTestCase):
    def test_thirdInvocationHoldsTheFirstTwoExchanges(self) -> None:
        """
        RPEngine is stateless; with memory, the third model invocation holds
        the first two exchanges as chat turns, in order, newest last, and the
        player's third line as the user message.
        """
        rig = Rig()
        first = rig.say("My name is Alex.")
        second = rig.say("I lost my brother Tomas on the north road.")
        third = rig.say("What was my name again?")
        for stream in (first, second, third):
            self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        invocation = rig.invocations[-1]
        self.assertEqual(invocation.user, "What was my name again?")
        self.assertEqual(
            list(invocation.history[-4:]),
            [
                ("user", "My name is Alex."),
                ("assistant", first.text()),
                ("user", "I lost my brother Tomas on the north road."),
                ("assistant", second.text()),
            ],
        )
        # The card's own examples still come first, and nothing was left out.
        self.assertEqual(invocation.history[0], ("user", "Any news?"))
        self.assertEqual(invocation.droppedExamples, 0)

    def test_firstTurnIsAFirstMeeting(self) -> None:
        rig = Rig()
        rig.say("Hello.")
        self.assertEqual(len(rig.invocations[0].history), 2, "the card's examples only")

    def test_clientsDoNotMixUnlessTheyShare(self) -> None:
        rig = Rig()
        rig.say("I am the first player.", client="a")
        rig.say("I am the second player.", client="b")
        said = [c for _, c in rig.invocations[-1].history]
        self.assertNotIn("I am the first player.", said)
        rig.say("We share a save.", client="a", conversation="slot-1")
        rig.say("Do you remember?", client="b", conversation="slot-1")
        self.assertIn("We share a save.", [c for _, c in rig.invocations[-1].history])

    def test_greetingOpensTheConversation(self) -> None:
        rig = Rig()
        rig.memory.greeted("mira", "session:c1")
        rig.say("Thanks, an ale please.")
        first = rig.invocations[-1].history[2]
        self.assertEqual(first, ("assistant", rig.card["data"]["first_mes"]))

    def test_gameEventsAreRemembered(self) -> None:
        rig = Rig()
        rig.middleware.requestReply(
            "mira",
            text="A wagon crashes outside.",
            card=rig.card,
            output=TEXT_ONLY,
            meta={"client": "c1"},
            **examplePromptContext("auto_event"),
        )
        settle(rig.clock)
        rig.say("What was that noise?")
        self.assertIn(
            ("user", "[Game event] A wagon crashes outside."), rig.invocations[-1].history
        )


class WhatHappenedTests(SynchronousTestCase):
    def test_bargeInRemembersWhatTheClientGot(self) -> None:
        """
        A reply cancelled mid-stream is remembered as far as the client got
        it (the deltas before the cancel), marked as cut off.
        """
        rig = Rig(options=SimulatorOptions(tokensPerSecond=10))
        stream = rig.middleware.requestReply(
            "mira",
            text="Tell me a long story.",
            card=rig.card,
            output=TEXT_ONLY,
            meta={"client": "c1"},
        )
        while not any(e.type == "reply.text.delta" for e in stream.envelopes):
            rig.clock.advance(0.05)
        got = stream.text()
        stream.cancel()
        settle(rig.clock)
        self.failureResultOf(stream.done)
        entries = rig.memory.read("mira", "session:c1")["entries"]
        self.assertEqual([e["role"] for e in entries], ["player", "character"])
        self.assertEqual(entries[1]["status"], "interrupted")
        self.assertEqual(entries[1]["text"], got.strip())
        self.assertLess(
            len(got), len(defaultReplyText({"event": {"text": "Tell me a long story."}}))
        )
        rig.say("Go on.")
        self.assertEqual(rig.invocations[-1].history[-1], ("assistant", got.strip() + " —"))

    def test_failedTurnLeavesNothing(self) -> None:
        def fail(request: dict[str, Any]) -> str:
            raise RuntimeError("the model crashed")

        rig = Rig(options=SimulatorOptions(replyText=fail))
        stream = rig.say("Hello?")
        self.failureResultOf(stream.done)
        self.assertEqual(rig.memory.read("mira", "session:c1")["entries"], [])

    def test_recordingIsRememberedAsUnheard(self) -> None:
        rig = Rig()
        audio = {"format": "pcm_s16le", "sampleRate": 16000, "channels": 1, "data": "AAAAAA=="}
        stream = rig.middleware.requestReply(
            "mira", audio=audio, card=rig.card, output=TEXT_ONLY, meta={"client": "c1"}
        )
        settle(rig.clock)
        self.successResultOf(stream.done)
        entries = rig.memory.read("mira", "session:c1")["entries"]
        self.assertEqual((entries[0]["role"], entries[0]["status"]), ("player", "unheard"))
        rig.say("Did you hear me?")
        self.assertIn(
            ("user", "(spoke, but the words were not heard)"), rig.invocations[-1].history
        )


class LongConversationTests(SynchronousTestCase):
    def test_300LongTurnsNeverTooLarge(self) -> None:
        """
        300 turns of long lines: no request meets prompt_too_large, every
        invocation keeps the newest exchange and fits RPEngine's limit with
        nothing left out, and the summary RPEngine wrote rides along, still
        holding what the player said in the first turns.
        """
        rig = Rig(options=SimulatorOptions(replyText=summarizingReplies))
        rig.say("My brother Tomas went missing on the north road.")
        padding = "The rain keeps falling on the old roads and the fields beyond them. " * 5
        for i in range(299):
            stream = rig.say(f"Line {i}. {padding}", wait=3.0)
            self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        mine = [inv for inv in rig.invocations if inv.user.startswith("Line ")]
        self.assertEqual(len(mine), 299)
        for inv in mine:
            self.assertLessEqual(inv.tokens, inv.limit)
            self.assertEqual(inv.droppedExamples, 0)
        last = mine[-1]
        self.assertTrue(last.history[-2][1].startswith("Line 297."), last.history[-2])
        self.assertIn("Tomas", last.system)
        self.assertGreater(rig.memory.counts["summaries"], 3)
        report = rig.middleware.timeline.recent()[-1].details["memory"]
        self.assertTrue(report["summary"]["included"])
        self.assertGreater(report["history"]["summarized"], 400)

    def test_summaryStopsForAPlayerTurn(self) -> None:
        """
        A summary request in flight is cancelled the moment a player's turn
        arrives, never reaches a client, and is asked again later.
        """
        rig = Rig(
            options=SimulatorOptions(replyText=summarizingReplies, tokensPerSecond=5),
            summarize_after_tokens=50,
            keep_recent_tokens=10,
        )
        rig.say("My brother Tomas is lost.", wait=60)
        turn = rig.say("He took the north road, and nobody has seen him since.", wait=0)
        while not turn.done.called:
            rig.clock.advance(0.1)
        settle(rig.clock, rig.memory.settings.idle_seconds + 0.2)
        summary = rig.memory.summaries.current
        assert summary is not None, "a summary request is in flight"
        stream = rig.say("Wait, one more thing.", wait=60)
        self.assertIn(summary.requestId, rig.link.engine.cancelled)
        self.successResultOf(stream.done)
        shown = [entry.requestId for entry in rig.middleware.timeline.recent()]
        self.assertNotIn(summary.requestId, shown)


class StoreTests(SynchronousTestCase):
    def test_restartContinuesTheConversation(self) -> None:
        path = os.path.abspath(self.mktemp())
        rig = Rig(path)
        rig.say("My name is Alex.", conversation="save-1")
        rig.say("I lost my brother Tomas.", conversation="save-1")
        rig.stop()
        again = Rig(path)
        again.say("What was my name?", conversation="save-1")
        said = [c for _, c in again.invocations[-1].history]
        self.assertIn("My name is Alex.", said)
        self.assertIn("I lost my brother Tomas.", said)
        again.stop()

    def test_metrics(self) -> None:
        rig = Rig()
        rig.say("Hello.")
        text = MiddlewareMetrics(rig.middleware).exposition().decode()
        self.assertIn("rpmiddleware_memory_plans_total 1.0", text)
        planned = f"rpmiddleware_memory_planned_tokens_total {float(rig.invocations[-1].tokens)}"
        self.assertIn(planned, text)
        self.assertIn('rpmiddleware_memory_summaries_total{outcome="written"} 0.0', text)
        self.assertIn("rpmiddleware_memory_store_writes_total 0.0", text, "no save slot")

    def test_pinnedFactsAlwaysRide(self) -> None:
        rig = Rig()
        rig.memory.pin("mira", "session:c1", "The player is called Alex.")
        rig.say("Hello.")
        self.assertIn("The player is called Alex.", rig.invocations[-1].system)


class LorebookTests(SynchronousTestCase):
    def test_entryActivatesOnlyOnItsKey(self) -> None:
        rig = Rig()
        book = {
            "entries": [
                {
                    "keys": ["Tomas"],
                    "content": "Tomas is a ranger of the north road.",
                    "enabled": True,
                    "insertion_order": 0,
                    "extensions": {},
                },
                {
                    "keys": ["dragon"],
                    "content": "Dragons sleep under the mountain.",
                    "enabled": True,
                    "insertion_order": 1,
                    "extensions": {},
                },
            ],
            "extensions": {},
        }
        rig.card = exampleCard(character_book=book)
        rig.say("Have you seen Tomas?")
        system = rig.invocations[-1].system
        self.assertIn("Tomas is a ranger of the north road.", system)
        self.assertNotIn("Dragons sleep", system)
        report = rig.middleware.timeline.recent()[-1].details["memory"]
        self.assertEqual([e["name"] for e in report["lore"]["kept"]], ["Tomas"])

    def test_gameKnowledgeScopedToALocation(self) -> None:
        rig = Rig()
        rig.memory.know("The mill burned down last winter.", ("mill",), "location:village")
        rig.say("What happened to the mill?")
        self.assertNotIn("burned down", rig.invocations[-1].system)
        rig.say("What happened to the mill?", location="village")
        self.assertIn("The mill burned down last winter.", rig.invocations[-1].system)
        rig.memory.know("Mira hides a key under the bar.", (), "character:mira", constant=True)
        rig.memory.know("Bram owes the ferry toll.", (), "character:bram", constant=True)
        rig.memory.know("The fair is today.", ("fair",), "scene:market")
        rig.say("Is the fair on?", scene="market")
        system = rig.invocations[-1].system
        self.assertIn("Mira hides a key under the bar.", system)
        self.assertNotIn("Bram owes", system)
        self.assertIn("The fair is today.", system)

    def test_tokensAreRPEnginesEstimate(self) -> None:
        rig = Rig()
        rig.say("Hi.")
        report = rig.middleware.timeline.recent()[-1].details["memory"]
        self.assertEqual(report["estimatedTokens"], rig.invocations[-1].tokens)
        self.assertTrue(re.match(r"\d+", str(report["limit"])))
        shown = promptSummary(report)
        self.assertEqual(shown["estimatedTokens"], rig.invocations[-1].tokens)
        self.assertEqual(
            [b["id"] for b in shown["blocks"]],
            [b.id for b in rig.invocations[-1].blocks if b.mandatory],
        )
        self.assertEqual(shown["history"]["kept"], 0)
