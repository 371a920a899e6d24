"""
The feelings plugin (issue 35, part 3): what a character feels, sentence by
sentence, told before the sentence is heard; read from the text, or written
by the model and taken out with RPEngine's response processing; the mood
kept per conversation.
"""

from __future__ import annotations

import base64
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from rpmiddleware.builtin import DEFAULT_CHAIN
from rpmiddleware.builtin.animation.feelings import CLIENT_TYPE, FIELD, Feelings, feelings
from rpmiddleware.builtin.animation.feelings_lexicon import read
from rpmiddleware.builtin.animation.feelings_model import PATTERN, RULE, RULE_ID, instruction
from rpmiddleware.builtin.animation.feelings_mood import Mood
from rpmiddleware.client.messages import configureChanges
from rpmiddleware.plugin import (
    FEELING_ENVELOPE,
    FEELINGS,
    MAX_RESPONSE_RULES,
    IEnvelopePlugin,
    eventTokens,
    limitOf,
    mandatoryBlocks,
    promptRequest,
    sentenceBlocks,
    snapshotTransfer,
)
from rpmiddleware.plugin import meta as metakeys
from rpmiddleware.protocol.clienterrors import InvalidMessage
from rpmiddleware.protocol.rules import checkResponseProcessing
from rpmiddleware.testing import PluginHarness, exampleCard, exampleResponseRule, pluginServices
from rpmiddleware.testing.simoptions import SimulatorOptions
from tests.support.chainclients import ChainClientRig, memorySettings
from tests.support.memory import settle

#: Sentences a person reads as one feeling each (labelled by hand, not by the code).
LABELLED = [
    ("I am so happy to see you again!", "joy"),
    ("Thank you, friend, that was wonderful.", "joy"),
    ("I miss her every single day.", "sadness"),
    ("My brother died in that war, and I still grieve.", "sadness"),
    ("How dare you lie to me, you filthy thief!", "anger"),
    ("I hate this town and every fool in it.", "anger"),
    ("I'm terrified of what lives in those woods.", "fear"),
    ("Something is moving out there, I'm scared.", "fear"),
    ("Ugh, the stew smells of rotten fish.", "disgust"),
    ("That cellar is disgusting, full of maggots.", "disgust"),
    ("Whoa, you found the crown?", "surprise"),
    ("I'm speechless, I never expected that.", "surprise"),
    ("The road north runs past the mill.", "neutral"),
    ("Two silver for a room, one for the stew.", "neutral"),
]


class LexiconTests(SynchronousTestCase):
    def test_labelledSentences(self) -> None:
        """
        Each hand-labelled sentence reads as the feeling a person gave it.
        """
        got = [(sentence, read(sentence).feeling) for sentence, _ in LABELLED]
        self.assertEqual(got, LABELLED)

    def test_everyFeelingIsOfTheSet(self) -> None:
        for sentence, _ in LABELLED:
            self.assertIn(read(sentence).feeling, FEELINGS)

    def test_negationTakesTheFeelingAway(self) -> None:
        """
        "not afraid" feels nothing; "not happy" is sad, more faintly than
        plain sadness.
        """
        self.assertEqual(read("I am afraid of wolves.").feeling, "fear")
        self.assertEqual(read("I am not afraid of wolves.").feeling, "neutral")
        notHappy = read("I am not happy about this.")
        self.assertEqual(notHappy.feeling, "sadness")
        self.assertLess(notHappy.intensity, read("I am sad about this.").intensity)

    def test_strongerWordsAreMoreIntense(self) -> None:
        plain = read("I am happy.").intensity
        self.assertGreater(read("I am very happy.").intensity, plain)
        self.assertGreater(read("I am happy!").intensity, plain)
        self.assertLessEqual(read("I am so very happy!!! Wonderful, joyful day!").intensity, 1.0)

    def test_neutralHasNoIntensity(self) -> None:
        reading = read("The mill is by the river.")
        self.assertEqual((reading.feeling, reading.intensity), ("neutral", 0.0))


class MoodTests(SynchronousTestCase):
    def test_moodFadesToNeutral(self) -> None:
        """
        An angry sentence leaves the mood angry; calm sentences after it
        carry it, softer each time, until it is neutral again.
        """
        mood = Mood()
        mood.felt("anger", 0.8)
        self.assertEqual(mood.feeling, "anger")
        carried = []
        for _ in range(6):
            carried.append(mood.carry())
            mood.felt("neutral", 0.0)
        self.assertEqual(carried[0][0], "anger")
        intensities = [i for f, i in carried if f == "anger"]
        self.assertEqual(intensities, sorted(intensities, reverse=True))
        self.assertEqual(carried[-1], ("neutral", 0.0))
        self.assertEqual(mood.feeling, "neutral")

    def test_keptAndReadBack(self) -> None:
        mood = Mood()
        mood.felt("fear", 0.9)
        again = Mood.fromJson(mood.toJson())
        self.assertEqual((again.feeling, again.intensity), (mood.feeling, mood.intensity))

    def test_damagedStateIsNeutral(self) -> None:
        for junk in (None, "angry", [1], {"weights": "x"}, {"weights": {"rage": 1, "fear": "x"}}):
            self.assertEqual(Mood.fromJson(junk).feeling, "neutral", junk)


class ModelRuleTests(SynchronousTestCase):
    def test_ruleIsOneRPEngineTakes(self) -> None:
        checkResponseProcessing({"mode": "buffered", "rules": [RULE]})

    def test_patternTakesOnlyAFeelingAtTheEnd(self) -> None:
        import re

        pattern = re.compile(PATTERN)
        self.assertEqual(pattern.search("Keep moving. <fear>  ")[1], "fear")  # type: ignore[index]
        self.assertIsNone(pattern.search("Ha <laugh>"))
        self.assertIsNone(pattern.search("<joy> and then more"))

    def test_instructionNamesEveryFeelingAndTheMood(self) -> None:
        line = instruction("Mira", "anger")
        for feeling in FEELINGS:
            self.assertIn(f"<{feeling}>", line)
        self.assertIn("Mira feels anger so far", line)
        self.assertNotIn("\n", line)


def told(harness: PluginHarness) -> list[dict[str, Any]]:
    """
    The feelings sent toward the game, in order, as the client's turn tells
    them (its turnId is the request's here: no scene plugin re-ids them).
    """
    return [
        {"type": CLIENT_TYPE, "turnId": e.requestId, **e.fields}
        for e in harness.sentToGame
        if e.type == FEELING_ENVELOPE
    ]


class PluginTests(SynchronousTestCase):
    def setUp(self) -> None:
        clock = Clock()
        self.services = pluginServices(clock)
        plugin = feelings.buildPlugin({}, self.services)
        assert isinstance(plugin, Feelings)
        self.plugin = plugin
        self.harness = PluginHarness(self.plugin, clock)
        self.harness.startSession()

    def ask(self, requestId: str = "r1", **meta: Any) -> None:
        meta.setdefault("client", "c1")
        self.harness.toEngine(self.harness.replyRequest(requestId, meta=meta))

    def stream(self, requestId: str, *pieces: str) -> list[int]:
        """RPEngine streams C{pieces}; how many feelings were told after each."""
        counts = []
        for sequence, piece in enumerate(pieces):
            self.harness.toGame(
                "reply.text.delta", requestId=requestId, sequence=sequence, delta=piece
            )
            counts.append(len(told(self.harness)))
        return counts

    def askModelWithRules(self, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """
        Ask for C{"model"} feelings in a request that brings the client's
        own response rules; the rules RPEngine is sent.
        """
        self.harness.toEngine(
            self.harness.replyRequest(
                "r1",
                meta={"client": "c1", "feelings": "model"},
                output={
                    "modalities": ["text"],
                    "language": "en",
                    "responseProcessing": {"mode": "buffered", "rules": rules},
                },
            )
        )
        sent: list[dict[str, Any]] = self.harness.sentToEngine[-1]["output"]["responseProcessing"][
            "rules"
        ]
        return sent

    def complete(self, requestId: str, text: str, **fields: Any) -> Any:
        self.harness.toGame(
            "reply.text.completed", requestId=requestId, text=text, tokenCount=9, **fields
        )
        completed = self.harness.sentToGame[-1]
        self.harness.toGame("reply.completed", requestId=requestId, modalities=["text"])
        return completed

    def test_offByDefault(self) -> None:
        """
        A request that asks for no feelings is left as it was and nothing
        is told.
        """
        self.ask()
        self.assertNotIn("responseProcessing", self.harness.sentToEngine[-1]["output"])
        self.stream("r1", "I hate ", "you! Go.")
        completed = self.complete("r1", "I hate you! Go.")
        self.assertEqual(told(self.harness), [])
        self.assertNotIn(metakeys.MOOD, completed.meta)

    def test_textFeelingsStreamSentenceBySentence(self) -> None:
        """
        Each sentence's feeling is told as soon as the text after it begins
        (when RPEngine hands that sentence to its voice), the last one with
        the completed text; offsets are code points of the display text.
        """
        self.ask(feelings="text")
        text = "Ah, welcome back, friend — I’m so glad! But the wolves, they terrify me."
        first, second = sentenceBlocks(text, True)
        pieces = ["Ah, welcome back, ", "friend — I’m so glad! ", "But the wolves, ", "they"]
        counts = self.stream("r1", *pieces, text[len("".join(pieces)) :])
        self.assertEqual(counts, [0, 0, 1, 1, 1])
        self.complete("r1", text)
        messages = told(self.harness)
        self.assertEqual([m["feeling"] for m in messages], ["joy", "fear"])
        spans = [text[m["start"] : m["end"]] for m in messages]
        self.assertEqual(spans, [first[0].strip(), second[0].strip()])
        self.assertEqual([m["sentence"] for m in messages], [0, 1])
        self.assertEqual({m["turnId"] for m in messages}, {"r1"})
        listed = self.harness.sentToGame[-2][FIELD]  # reply.text.completed, before reply.completed
        self.assertEqual(
            listed, [{k: m[k] for k in listed[0]} for m in messages], "the line's feelings, listed"
        )
        self.assertEqual(messages[0]["speaker"]["characterId"], "c1")
        self.assertEqual(messages[0]["source"], "text")
        self.assertTrue(0 < messages[0]["intensity"] <= 1)

    def test_offsetsSkipLeadingSpace(self) -> None:
        """
        RPEngine trims the completed text; offsets count as the llm text does.
        """
        self.ask(feelings="text")
        self.stream("r1", "\n  I am so sad. ", "Fine.")
        self.complete("r1", "I am so sad. Fine.")
        first = told(self.harness)[0]
        self.assertEqual("I am so sad. Fine."[first["start"] : first["end"]], "I am so sad.")

    def test_sentenceWithoutCueCarriesTheMood(self) -> None:
        self.ask(feelings="text")
        self.stream("r1", "You filthy liar, I hate you! ", "Now get out of my inn. ", "Go.")
        self.complete("r1", "You filthy liar, I hate you! Now get out of my inn. Go.")
        feelings = [(m["feeling"], m["intensity"]) for m in told(self.harness)]
        self.assertEqual([f for f, _ in feelings], ["anger", "anger", "anger"])
        self.assertGreater(feelings[0][1], feelings[1][1])
        self.assertGreater(feelings[1][1], feelings[2][1])

    def test_moodIsWrittenForMemoryAndCarriedToTheNextTurn(self) -> None:
        """
        The completed text carries the mood (meta) for the memory plugin,
        and the next request of the conversation starts from it.
        """
        self.ask(feelings="text", conversation="save-1")
        completed = self.complete("r1", "I am furious with you!")
        self.assertEqual(completed.meta[metakeys.MOOD]["feeling"], "anger")
        self.ask("r2", feelings="text", conversation="save-1")
        self.complete("r2", "The road is open.")
        self.assertEqual(told(self.harness)[-1]["feeling"], "anger")
        # Another conversation of the same character starts calm.
        self.ask("r3", feelings="text", conversation="save-2")
        self.complete("r3", "The road is open.")
        self.assertEqual(told(self.harness)[-1]["feeling"], "neutral")

    def test_moodGivenBackOnTheRequestWins(self) -> None:
        """
        A mood the memory plugin gives back (meta on the request) is where
        the line starts, whatever this plugin saw last.
        """
        kept = Mood()
        kept.felt("sadness", 1.0)
        self.ask(feelings="text", mood=kept.toJson())
        self.complete("r1", "The road is open.")
        self.assertEqual(told(self.harness)[-1]["feeling"], "sadness")
        self.assertEqual(self.plugin.moodOf("c1", "c1", "game")["feeling"], "sadness")

    def test_modelFeelingIsTaughtAndTakenOut(self) -> None:
        """
        With C{"model"}, the request is taught in one line and given the
        rule (RPEngine's rules accept the request: the harness checks
        them); the feeling the model wrote is told for every sentence, and
        the client's llm has no trace of the rule.
        """
        self.ask(feelings="model")
        request = self.harness.sentToEngine[-1]
        self.assertEqual(request["output"]["responseProcessing"]["rules"], [RULE])
        self.assertIn("<surprise>", request["promptDirective"]["sceneContext"])
        completed = self.complete(
            "r1", "Keep moving. Stay close.", extractedContent={RULE_ID: ["fear"]}
        )
        self.assertNotIn("extractedContent", completed.fields)
        messages = told(self.harness)
        self.assertEqual([m["feeling"] for m in messages], ["fear", "fear"])
        self.assertEqual({m["source"] for m in messages}, {"model"})
        self.assertNotIn("intensity", messages[0])

    def test_clientsOwnRulesKept(self) -> None:
        rules = self.askModelWithRules([exampleResponseRule()])
        self.assertEqual([r["id"] for r in rules], [exampleResponseRule()["id"], RULE_ID])
        own = exampleResponseRule()["id"]
        completed = self.complete("r1", "Hm.", extractedContent={own: ["x"], RULE_ID: ["joy"]})
        self.assertEqual(completed["extractedContent"], {own: ["x"]})
        self.assertEqual(told(self.harness)[-1]["feeling"], "joy")

    def test_noRoomForTheRuleReadsTheText(self) -> None:
        rules = [exampleResponseRule(id=f"rule{i}") for i in range(MAX_RESPONSE_RULES)]
        sent = self.askModelWithRules(rules)
        self.assertEqual(len(sent), MAX_RESPONSE_RULES)
        self.complete("r1", "I hate you!", extractedContent={r["id"]: [] for r in rules})
        self.assertEqual([m["source"] for m in told(self.harness)], ["text"])

    def fullPrompt(self, room: int) -> Any:
        """
        A request whose card's example messages (where the memory plugin puts
        the conversation) leave C{room} tokens of RPEngine's limit, by
        RPEngine's estimate.
        """
        cards = self.harness.cards

        def request(mes: str) -> Any:
            card = cards.canonicalNow(cards.adopt(exampleCard(mes_example=mes)))
            return self.harness.replyRequest(
                "r1",
                card=snapshotTransfer(card.document, card.hash),
                meta={"client": "c1", "feelings": "model"},
                output={"modalities": ["text"], "language": "en"},
            )

        bare = request("")
        prompt = promptRequest(bare.fields, bare["card"]["snapshot"])
        used = sum(b.tokens for b in mandatoryBlocks(prompt)) + eventTokens(prompt)
        name = prompt["card"]["data"]["name"]
        filler = limitOf(prompt) - used - room
        return request(f"<START>\n{name}: " + "a" * (4 * filler))

    def test_fullPromptReadsTheText(self) -> None:
        """
        With the prompt full to RPEngine's limit (the memory plugin fills it
        with the conversation), the instruction would push the newest
        history out: the line's feelings are read from the text instead.
        """
        self.harness.toEngine(self.fullPrompt(room=0))
        self.assertNotIn("responseProcessing", self.harness.sentToEngine[-1]["output"])
        self.complete("r1", "I hate you!")
        self.assertEqual([m["source"] for m in told(self.harness)], ["text"])

    def test_roomForTheInstruction(self) -> None:
        self.harness.toEngine(self.fullPrompt(room=80))
        rules = self.harness.sentToEngine[-1]["output"]["responseProcessing"]["rules"]
        self.assertEqual(rules, [RULE])

    def test_modelWroteNoTagCarriesTheMood(self) -> None:
        self.ask(feelings="model", mood={"weights": {"joy": 0.9}})
        self.complete("r1", "Well met.", extractedContent={RULE_ID: []})
        self.assertEqual(told(self.harness)[-1]["feeling"], "joy")

    def test_sceneSpeaker(self) -> None:
        """
        A scene's line is told with its speaker (the scene plugin, nearer
        the game, gives it the player's turn: EndToEndTests).
        """
        speaker = {"characterId": "mara", "name": "Mara", "voice": "F3"}
        self.ask(feelings="text", speaker=speaker, turn="player-turn")
        self.complete("r1", "Oh, wonderful!")
        self.assertEqual(told(self.harness)[-1]["speaker"], speaker)

    def test_serverDefault(self) -> None:
        plugin = feelings.buildPlugin({"default": "text"}, self.services)
        self.assertIsInstance(plugin, Feelings)
        self.assertTrue(verifyObject(IEnvelopePlugin, plugin))
        harness = PluginHarness(plugin, Clock())
        harness.startSession()
        harness.toEngine(harness.replyRequest("r1", meta={"client": "c1"}))
        harness.toGame("reply.text.completed", requestId="r1", text="I am sad.", tokenCount=3)
        self.assertEqual([m["feeling"] for m in told(harness)], ["sadness"])
        with self.assertRaises(ValueError):
            feelings.buildPlugin({"default": "loud"}, self.services)

    def test_forgottenAtTheEnd(self) -> None:
        self.ask(feelings="text")
        self.complete("r1", "I am sad.")
        before = len(told(self.harness))
        self.harness.toGame("reply.text.completed", requestId="r1", text="Again.", tokenCount=1)
        self.assertEqual(len(told(self.harness)), before)


class ConfigureTests(SynchronousTestCase):
    def test_configureFeelings(self) -> None:
        for source in ("text", "model", "off", None):
            self.assertEqual(
                configureChanges({"type": "configure", "feelings": source}), {"feelings": source}
            )

    def test_badSourceNamed(self) -> None:
        with self.assertRaises(InvalidMessage) as caught:
            configureChanges({"type": "configure", "feelings": "face"})
        self.assertIn("configure.feelings 'face'", str(caught.exception))
        self.assertIn("model, off, text", str(caught.exception))

    def test_inTheDefaultChain(self) -> None:
        self.assertLess(DEFAULT_CHAIN["memory"], DEFAULT_CHAIN["feelings"])
        self.assertLess(DEFAULT_CHAIN["feelings"], DEFAULT_CHAIN["moderation"])


class EndToEndTests(ChainClientRig, SynchronousTestCase):
    """
    A client of the endpoint, the default chain and the simulated RPEngine
    on a Clock: the feelings reach the client before the audio of their
    sentence.
    """

    def setUp(self) -> None:
        self.reply = ""
        self.clock = Clock()
        self.startClients(
            memorySettings(), SimulatorOptions(replyText=lambda request: self.reply), _card()
        )

    def turn(self, reply: str, **options: Any) -> list[dict[str, Any]]:
        self.reply = reply
        before = len(self.writer.sent)
        self.segments: list[int] = []

        def chunk(envelope: Any) -> None:
            if envelope.type == "reply.audio.chunk":
                self.segments.append(envelope["segmentSequence"])

        stop = self.middleware.router.observe(chunk)
        self.clients.say(self.connection, type="text", text="Hello?", **options)
        settle(self.clock, 30.0)
        stop()
        return self.writer.sent[before:]

    def assertFeelingBeforeEachSentencesAudio(self, sent: list[dict[str, Any]], count: int) -> None:
        """
        The feeling of sentence i reaches the client before the first
        tts-chunk of RPEngine's segment i (one per sentence): the client's
        chunks are RPEngine's, one for one and in order, whose segments the
        router saw.
        """
        chunks = [i for i, m in enumerate(sent) if m["type"] == "tts-chunk"]
        self.assertEqual(len(chunks), len(self.segments))
        self.assertEqual(sorted(set(self.segments)), list(range(count)))
        feelingsAt = [i for i, m in enumerate(sent) if m["type"] == CLIENT_TYPE]
        self.assertEqual(len(feelingsAt), count)
        for sentence, at in enumerate(feelingsAt):
            firstAudio = chunks[self.segments.index(sentence)]
            self.assertLess(at, firstAudio, f"sentence {sentence}")

    def test_textFeelingsOverTheClientProtocol(self) -> None:
        self.clients.say(self.connection, type="configure", feelings="text")
        sent = self.turn("I am so glad you came! The wolves took my sheep, I fear.")
        messages = [m for m in sent if m["type"] == CLIENT_TYPE]
        self.assertEqual([m["feeling"] for m in messages], ["joy", "fear"])
        llm = next(m for m in sent if m["type"] == "llm")
        self.assertEqual(
            [llm["text"][m["start"] : m["end"]] for m in messages],
            ["I am so glad you came!", "The wolves took my sheep, I fear."],
        )
        self.assertFeelingBeforeEachSentencesAudio(sent, 2)
        self.assertEqual([f["feeling"] for f in llm[FIELD]], ["joy", "fear"])

    def test_modelFeelingsThroughRPEnginesResponseProcessing(self) -> None:
        """
        The simulated RPEngine applies the rule as RPEngine does: the tag is
        gone from the text and the speech, and its feeling is told.
        """
        sent = self.turn("Keep moving. Stay close. <fear>", options={"feelings": "model"})
        llm = next(m for m in sent if m["type"] == "llm")
        self.assertEqual(llm["text"], "Keep moving. Stay close.")
        self.assertNotIn("extractedContent", llm)
        messages = [m for m in sent if m["type"] == CLIENT_TYPE]
        self.assertEqual([m["feeling"] for m in messages], ["fear", "fear"])
        self.assertFeelingBeforeEachSentencesAudio(sent, 2)
        spoken = b"".join(base64.b64decode(m["data"]) for m in sent if m["type"] == "tts-chunk")
        self.assertGreater(len(spoken), 0)

    def test_moodKeptByMemory(self) -> None:
        """
        The mood a line leaves is kept with the conversation by the memory
        plugin and given back on the next request: a calm line after an
        angry one carries the anger even when the feelings plugin has
        forgotten everything it saw (as after a restart).
        """
        self.clients.say(self.connection, type="configure", feelings="text")
        self.turn("You filthy liar, I hate you!")
        plugin = next(p for p in self.middleware.chain.plugins if isinstance(p, Feelings))
        plugin._moods.clear()
        sent = self.turn("The road is open.")
        told = [m for m in sent if m["type"] == CLIENT_TYPE]
        self.assertEqual([m["feeling"] for m in told], ["anger"])

    def test_sceneLinesEachWithTheirSpeaker(self) -> None:
        """
        In a scene, the answer and the reaction (the scene plugin's own
        request, which keeps the turn's meta feelings) each get their
        feelings, with their speaker and the player's turn.
        """
        lines = {
            "garrick": "Halt, stranger. I hate liars.",
            "mara": "Oh, I am so glad you are back.",
        }
        self.reply = ""
        self.link.engine.options.replyText = lambda request: lines[request["characterId"]]
        cast = [
            {"characterId": characterId, "card": _card(name), "voice": voice}
            for characterId, name, voice in (("garrick", "Garrick", "M2"), ("mara", "Mara", "F3"))
        ]
        self.clients.say(self.connection, type="configure", feelings="text")
        self.clients.say(self.connection, type="scene", op="open", sceneId="gate", cast=cast)
        sent = self.turn("Garrick, may I pass?")
        told = [m for m in sent if m["type"] == CLIENT_TYPE]
        self.assertEqual(
            [(m["speaker"]["characterId"], m["feeling"]) for m in told],
            [("garrick", "neutral"), ("garrick", "anger"), ("mara", "joy")],
        )
        done = next(m for m in sent if m["type"] == "reply-complete")
        self.assertEqual({m["turnId"] for m in told}, {done["turnId"]})

    def test_nothingAfterTheTurnIsCancelled(self) -> None:
        """
        A turn cancelled while its text streams tells no feeling after its
        tts-cancelled (the client's turn, which writes them, drops what
        comes of a cancelled turn).
        """
        self.link.engine.options.tokensPerSecond = 10.0
        self.clients.say(self.connection, type="configure", feelings="text")
        self.reply = "I am so glad! The wolves came. I fear them. They took my sheep. Stay."
        before = len(self.writer.sent)
        self.clients.say(self.connection, type="text", text="Hello?")
        for _ in range(200):
            if any(m["type"] == CLIENT_TYPE for m in self.writer.sent[before:]):
                break
            self.clock.advance(0.05)
        self.clients.say(self.connection, type="cancel")
        settle(self.clock, 30.0)
        sent = [m["type"] for m in self.writer.sent[before:]]
        self.assertIn(CLIENT_TYPE, sent)
        cancelled = sent.index("tts-cancelled")
        self.assertLess(sent.count(CLIENT_TYPE), 5, "the turn was cut before its end")
        self.assertNotIn(CLIENT_TYPE, sent[cancelled:])

    def test_noFeelingsUnlessAsked(self) -> None:
        sent = self.turn("I am so glad you came!")
        self.assertNotIn(CLIENT_TYPE, [m["type"] for m in sent])


def _card(name: str | None = None) -> dict[str, Any]:
    if name is None:
        return exampleCard()
    return exampleCard(name=name, mes_example="", first_mes="")
