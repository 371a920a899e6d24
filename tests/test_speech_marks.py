"""
The speech-marks plugin (issue 35, part 1): which text each speech segment
says, and marks sent before the audio they describe, timed from its samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, LoopingCall
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rpmiddleware.builtin.animation import alignment
from rpmiddleware.builtin.animation.marks import SpeechMarks, speechMarks
from rpmiddleware.builtin.animation.matching import LineText, plausible, sentencesOf
from rpmiddleware.client.messages import configureChanges, turnOptions
from rpmiddleware.plugin import (
    Envelope,
    InvalidMessage,
    decodeBase64,
    encodeBase64,
    exactLength,
    speechmarks,
)
from rpmiddleware.plugin import meta as metakeys
from rpmiddleware.testing import PluginHarness, exampleCard, pluginServices
from rpmiddleware.testing.simoptions import SimulatorOptions
from rpmiddleware.testing.simspeech import knownWordMarks
from tests.support.chainclients import ChainClientRig, memorySettings
from tests.support.memory import settle
from tests.support.webrtc import missingExtra

RATE = 24000
CHUNK_BYTES = 32768


def segmentChunks(
    segment: int, samples: int, requestId: str = "r1", first: int = 0, rate: int = RATE
) -> list[dict[str, Any]]:
    """
    The C{reply.audio.chunk} fields of one speech segment of C{samples}
    samples, cut as RPEngine cuts them (32 KiB), at C{rate}.
    """
    pcm = bytes(range(256)) * (samples * 2 // 256 + 1)
    pcm = pcm[: samples * 2]
    pieces = [pcm[i : i + CHUNK_BYTES] for i in range(0, len(pcm), CHUNK_BYTES)]
    return [
        {
            "requestId": requestId,
            "sequence": first + n,
            "segmentSequence": segment,
            "segmentChunkSequence": n,
            "segmentChunkCount": len(pieces),
            "sampleRate": rate,
            "data": encodeBase64(piece),
        }
        for n, piece in enumerate(pieces)
    ]


class Runner:
    """Work given to the worker threads, run when the test says."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[], Any], Deferred[Any]]] = []

    def __call__(self, work: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.waiting.append((work, d))
        return d

    def runAll(self) -> None:
        while self.waiting:
            work, d = self.waiting.pop(0)
            d.callback(work())


class FakeAligner:
    """
    The alignment's contract with known answers: the first word of a
    sentence at 0.1 s, its visemes at 0.1 s and 0.2 s.
    """

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.aligned: list[bytes] = []

    def prepare(self, text: str, language: str) -> str:
        self.prepared.append(text)
        return text

    def result(self, text: str) -> alignment.Alignment:
        end = text.index(" ")
        word = alignment.Timed(0.1, 0.3, text[:end], 0, end)
        return alignment.Alignment(
            (word,),
            (
                alignment.Timed(0.1, 0.2, "s", 0, end, 0.25),
                alignment.Timed(0.2, 0.3, "E", 0, end, 0.5),
            ),
            "forced",
        )

    def align(self, prepared: str, samples: bytes, sampleRate: int) -> alignment.Alignment:
        self.aligned.append(samples)
        return self.result(prepared)


class MatchingTests(SynchronousTestCase):
    def texts(self, text: str) -> list[str]:
        return [s.text for s in sentencesOf(text, True)]

    def test_rpEngineSentences(self) -> None:
        """
        The cases the issue names, as RPEngine's real core cuts them
        (docs/checking-against-rpengine.md).
        """
        self.assertEqual(self.texts("Mr. Brennan paid us."), ["Mr.", "Brennan paid us."])
        self.assertEqual(self.texts('"Run!" she shouted.'), ['"Run!"', "she shouted."])
        self.assertEqual(self.texts("One line\nAnother"), ["One line", "Another"])
        self.assertEqual(self.texts("It costs 3.50 today."), ["It costs 3.50 today."])
        self.assertEqual(self.texts("Wait... what"), ["Wait... what"])

    def test_offsetsAreCodePointsOfTheTrimmedText(self) -> None:
        text = "  Ünïcödé — 🎲 rolls. Then «this»."
        trimmed = text.strip()
        for sentence in sentencesOf(text, True):
            self.assertEqual(trimmed[sentence.start : sentence.end], sentence.text)
        self.assertEqual([s.index for s in sentencesOf(text, True)], [0, 1])

    def test_droppedTagKeepsTheSentenceWhole(self) -> None:
        """
        "rich. <laugh> you" is one sentence for RPEngine (a tag reads as a
        lowercase word after a full stop); its display text shows two spaces.
        """
        self.assertEqual(
            self.texts("That is rich.  You are funny."), ["That is rich.  You are funny."]
        )
        self.assertEqual(
            self.texts("That is rich. You are funny."), ["That is rich.", "You are funny."]
        )

    def test_plausibleBounds(self) -> None:
        self.assertTrue(plausible(20 / 15, 20))
        self.assertFalse(plausible(30.0, 20))
        self.assertFalse(plausible(0.01, 200))
        self.assertFalse(plausible(1.0, 0))

    def test_lostOnceLostForTheRestOfTheLine(self) -> None:
        line = LineText()
        line.add("Hello there. How are you? Fine.")
        first = line.matchSegment(12 / 15)
        self.assertTrue(first.matched)
        second = line.matchSegment(60.0)
        self.assertFalse(second.matched)
        self.assertIn("implausible", second.reason)
        third = line.matchSegment(5 / 15)
        self.assertFalse(third.matched)
        self.assertIsNone(third.sentence)

    def test_spokenTextChecked(self) -> None:
        line = LineText()
        line.complete("Ha that is rich. Go.")
        match = line.matchSegment(1.3, spokenText="Ha <laugh> that is rich.")
        self.assertTrue(match.matched)
        other = line.matchSegment(0.4, spokenText="Stay.")
        self.assertFalse(other.matched)

    def test_spokenTextFindsTheSentence(self) -> None:
        """
        With the segment's text (the file mailbox tells it), a tag spoken
        alone takes no sentence, and the next segment is found by its words.
        """
        line = LineText()
        line.complete("Yes! No. Go.")
        self.assertEqual(line.matchSegment(0.3, spokenText="Yes!").sentence.text, "Yes!")  # type: ignore[union-attr]
        laugh = line.matchSegment(0.5, spokenText="<laugh>")
        self.assertFalse(laugh.matched)
        self.assertEqual(line.matchSegment(0.3, spokenText="No.").sentence.text, "No.")  # type: ignore[union-attr]
        self.assertFalse(line.matchSegment(0.3, spokenText="Stop.").matched)


class MailboxSpokenTextTests(SynchronousTestCase):
    def test_firstChunkCarriesTheSpokenText(self) -> None:
        """
        A mailbox audio slot's spokenText rides on its segment's first
        chunk (meta spokenText), for the speech-marks plugin.
        """
        from rpmiddleware.engine.mailbox.audioslots import SegmentStream, WavAudio

        segment = Envelope.build(
            "reply.audio.segment",
            requestId="r1",
            segmentSequence=0,
            spokenText="Ha <laugh> that is rich.",
        )
        made = SegmentStream().envelopes(segment, WavAudio(44100, 1, b"\0\0" * 40000), "s1")
        chunks = [e for e in made if e.type == "reply.audio.chunk"]
        self.assertEqual(len(chunks), 3)
        self.assertEqual(chunks[0].meta[metakeys.SPOKEN_TEXT], "Ha <laugh> that is rich.")
        self.assertNotIn(metakeys.SPOKEN_TEXT, chunks[1].meta)

    def test_pluginMatchesBySpokenText(self) -> None:
        """
        A segment whose duration is implausible for its sentence is still
        matched when the transport said its text.
        """
        harness = PluginHarness(SpeechMarks(None))
        harness.startSession()
        harness.toEngine(harness.replyRequest("r1", meta={speechmarks.META: ("sentence",)}))
        harness.toGame("reply.text.completed", requestId="r1", text="Hi. Bye.")
        for n, fields in enumerate(segmentChunks(0, 20 * RATE)):
            envelope = harness.envelope("reply.audio.chunk", **fields)
            if n == 0:
                envelope.meta[metakeys.SPOKEN_TEXT] = "Hi."
            harness.toGame(envelope)
        [marks] = [e for e in harness.sentToGame if e.type == speechmarks.MARKS_ENVELOPE]
        self.assertEqual(marks["marks"][0]["value"], "Hi.")
        self.assertTrue(marks["marks"][0]["matched"])


class ClientFieldTests(SynchronousTestCase):
    def test_configureKinds(self) -> None:
        changes = configureChanges({"type": "configure", "speechMarks": ["viseme", "sentence"]})
        self.assertEqual(changes["speechMarks"], ("sentence", "viseme"))

    def test_unknownKindNamed(self) -> None:
        with self.assertRaises(InvalidMessage) as caught:
            configureChanges({"type": "configure", "speechMarks": ["sentence", "phoneme"]})
        self.assertIn("configure.speechMarks has unknown kind 'phoneme'", str(caught.exception))

    def test_notAList(self) -> None:
        with self.assertRaises(InvalidMessage) as caught:
            turnOptions({"type": "text", "text": "hi", "options": {"speechMarks": "word"}})
        self.assertIn("text.options.speechMarks must be a list", str(caught.exception))

    def test_emptyIsNone(self) -> None:
        self.assertIsNone(configureChanges({"type": "configure", "speechMarks": []})["speechMarks"])


class SpeechMarksPluginTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.runner = Runner()
        self.plugin = SpeechMarks(None, run=self.runner)
        self.harness = PluginHarness(self.plugin)
        self.harness.startSession()

    def ask(self, kinds: tuple[str, ...], requestId: str = "r1") -> None:
        meta = {speechmarks.META: kinds} if kinds else {}
        self.harness.toEngine(self.harness.replyRequest(requestId, meta=meta))

    def text(self, text: str, requestId: str = "r1") -> None:
        self.harness.toGame("reply.text.delta", requestId=requestId, sequence=0, delta=text)

    def chunks(self, segment: int, samples: int, requestId: str = "r1") -> None:
        for fields in segmentChunks(segment, samples, requestId):
            self.harness.toGame("reply.audio.chunk", **fields)

    def sent(self) -> list[tuple[str, dict[str, Any]]]:
        return [(e.type, e.fields) for e in self.harness.sentToGame]

    def marks(self) -> list[dict[str, Any]]:
        return [
            mark
            for e in self.harness.sentToGame
            if e.type == speechmarks.MARKS_ENVELOPE
            for mark in e["marks"]
        ]

    def test_nobodyAskedNothingHeld(self) -> None:
        """
        A request without speechMarks passes untouched and starts no worker.
        """
        self.ask(())
        self.text("Hello there. Fine.")
        self.chunks(0, 30000)
        self.assertEqual(
            self.harness.typesToGame(),
            ["reply.text.delta", "reply.audio.chunk", "reply.audio.chunk"],
        )
        self.assertEqual(self.runner.waiting, [])
        self.assertFalse(self.plugin.started)

    def test_sentenceMarksBeforeTheirChunksTimedBySamples(self) -> None:
        self.ask(("sentence",))
        text = "Hello there, traveller. The road is long. "
        self.text(text)
        first = 23 * RATE // 15 + 7
        self.chunks(0, first)
        self.text("Rest.")
        self.harness.toGame("reply.text.completed", requestId="r1", text=text + "Rest.")
        second = 17 * RATE // 15 + 3
        self.chunks(1, second)
        types = self.harness.typesToGame()
        marksAt = [i for i, t in enumerate(types) if t == speechmarks.MARKS_ENVELOPE]
        chunkAt = [i for i, t in enumerate(types) if t == "reply.audio.chunk"]
        self.assertEqual(len(marksAt), 2)
        self.assertLess(marksAt[0], chunkAt[0])
        self.assertLess(marksAt[1], chunkAt[len(segmentChunks(0, first))])
        marks = self.marks()
        self.assertEqual([m["sample"] for m in marks], [0, first])
        self.assertEqual([m["samples"] for m in marks], [first, second])
        self.assertEqual(marks[1]["time"], round(first * 1000 / RATE))
        self.assertEqual(
            [m["value"] for m in marks], ["Hello there, traveller.", "The road is long."]
        )
        self.assertEqual(text[marks[1]["start"] : marks[1]["end"]], "The road is long.")
        self.assertTrue(all(m["matched"] for m in marks))
        self.assertEqual(self.runner.waiting, [])

    def test_wordsAndVisemesHoldTheAudioUntilAligned(self) -> None:
        """
        The segment's chunks and what follows them wait for the alignment on
        the worker; then the marks, then everything in order.
        """
        self.ask(("word", "viseme"))
        self.text("Good evening. ")
        self.assertEqual(len(self.runner.waiting), 0)
        self.text("More")
        self.assertEqual(len(self.runner.waiting), 1, "the whole sentence is prepared at once")
        self.chunks(0, 13 * RATE // 15)
        self.text(" words.")
        self.assertEqual(self.harness.typesToGame(), ["reply.text.delta", "reply.text.delta"])
        self.runner.runAll()
        types = self.harness.typesToGame()
        self.assertEqual(types[2], speechmarks.MARKS_ENVELOPE)
        self.assertEqual(types[-1], "reply.text.delta")
        self.assertEqual(set(types[3:-1]), {"reply.audio.chunk"})
        marks = self.marks()
        words = [m for m in marks if m["type"] == "word"]
        self.assertEqual([w["value"] for w in words], ["Good", "evening"])
        self.assertEqual(
            ["Good evening. More"[w["start"] : w["end"]] for w in words], ["Good", "evening"]
        )
        self.assertTrue(any(m["type"] == "viseme" and "mouth" in m for m in marks))
        self.assertEqual([m["time"] for m in marks], sorted(m["time"] for m in marks))
        self.assertNotIn("sentence", {m["type"] for m in marks})

    def test_marksMatchTheAlignment(self) -> None:
        """
        Word and viseme times are the alignment's, offset by the sentence's
        first sample; offsets are the sentence's plus the alignment's.
        """
        fake = FakeAligner()
        self.plugin = SpeechMarks(None, run=self.runner, aligner=fake)
        self.harness = PluginHarness(self.plugin)
        self.harness.startSession()
        self.ask(("word", "viseme"))
        text = "First one. Second sentence here. "
        self.text(text)
        first = 10 * RATE // 15
        self.chunks(0, first)
        self.chunks(1, 22 * RATE // 15)
        self.runner.runAll()
        self.assertEqual(fake.prepared, ["First one.", "Second sentence here."])
        self.assertEqual([len(pcm) // 2 for pcm in fake.aligned], [first, 22 * RATE // 15])
        second = [m for m in self.marks() if m["time"] >= round(first * 1000 / RATE)]
        expected = fake.result("Second sentence here.")
        self.assertEqual(
            [(m["type"], m["time"], m["value"]) for m in second],
            [
                ("word", round((first + 0.1 * RATE) * 1000 / RATE), "Second"),
                ("viseme", round((first + 0.1 * RATE) * 1000 / RATE), "s"),
                ("viseme", round((first + 0.2 * RATE) * 1000 / RATE), "E"),
            ],
        )
        self.assertEqual(second[1]["mouth"], expected.visemes[0].mouth)
        self.assertEqual(text[second[0]["start"] : second[0]["end"]], "Second")

    def test_cancelDropsWhatIsHeld(self) -> None:
        self.ask(("word",))
        self.text("Leave now. Go")
        self.chunks(0, 10 * RATE // 15)
        self.harness.toEngine("request.cancel", requestId="r1", reason="barge_in")
        self.runner.runAll()
        self.assertEqual(self.harness.typesToGame(), ["reply.text.delta"])
        self.harness.toGame("reply.cancelled", requestId="r1", reason="requested_by_game")
        self.assertEqual(self.harness.typesToGame(), ["reply.text.delta", "reply.cancelled"])
        self.assertEqual(self.plugin._lines, {})

    def test_completedWaitsBehindHeldAudio(self) -> None:
        self.ask(("word",))
        self.harness.toGame("reply.text.completed", requestId="r1", text="Only this.")
        self.chunks(0, 10 * RATE // 15)
        self.harness.toGame("reply.audio.completed", requestId="r1")
        self.harness.toGame("reply.completed", requestId="r1", modalities=["text", "audio"])
        self.assertEqual(self.harness.typesToGame(), ["reply.text.completed"])
        self.runner.runAll()
        self.assertEqual(
            self.harness.typesToGame()[-2:], ["reply.audio.completed", "reply.completed"]
        )
        self.assertEqual(self.plugin._lines, {})

    def test_unmatchedSegmentGetsSentenceMarkOnly(self) -> None:
        """
        A segment whose length does not fit its sentence gets a sentence
        mark without text (matched false), and so does every later one.
        """
        self.ask(("sentence", "word"))
        self.harness.toGame("reply.text.completed", requestId="r1", text="Hi. Bye.")
        self.chunks(0, 40 * RATE)
        self.chunks(1, RATE // 2)
        # Sent without waiting for the workers (only the prepared text is there).
        marks = self.marks()
        self.assertEqual([m["matched"] for m in marks], [False, False])
        self.assertNotIn("value", marks[0])
        self.assertEqual(marks[1]["sample"], 40 * RATE)

    def test_countedAtTheClientsRate(self) -> None:
        """
        Further from the game than audio-resample the plugin sees RPEngine's
        44.1 kHz; its marks count the client's samples (the request's
        outputSampleRate), each segment converted to exactly its length.
        """
        meta = {speechmarks.META: ("sentence",), "outputSampleRate": 24000}
        self.harness.toEngine(self.harness.replyRequest("r1", meta=meta))
        self.harness.toGame(
            "reply.audio.start", requestId="r1", format="pcm_s16le", sampleRate=44100, channels=1
        )
        self.text("Hello there, traveller. The road is long. ")
        first, second = 23 * 44100 // 15 + 7, 17 * 44100 // 15 + 3
        for segment, samples in ((0, first), (1, second)):
            for fields in segmentChunks(segment, samples, rate=44100):
                del fields["sampleRate"]
                self.harness.toGame("reply.audio.chunk", **fields)
        marks = self.marks()
        self.assertEqual([m["sample"] for m in marks], [0, exactLength(first, 44100, 24000)])
        self.assertEqual(
            [m["samples"] for m in marks],
            [exactLength(first, 44100, 24000), exactLength(second, 44100, 24000)],
        )
        self.assertEqual(
            {
                e["sampleRate"]
                for e in self.harness.sentToGame
                if e.type == speechmarks.MARKS_ENVELOPE
            },
            {24000},
        )

    def test_eachLineItsOwnTimeBase(self) -> None:
        self.ask(("sentence",), "a")
        self.ask(("sentence",), "b")
        self.text("One two three.", "a")
        self.text("Four five six.", "b")
        self.chunks(0, 14 * RATE // 15, "a")
        self.chunks(0, 14 * RATE // 15, "b")
        self.assertEqual([m["sample"] for m in self.marks()], [0, 0])

    def test_sceneLinesKeepTheirOrder(self) -> None:
        """
        A scene's next line (its request names the turn) waits behind the
        line before it while that line's audio is held, and each line's
        marks name its speaker (meta speaker, as the scene tags its lines).
        """
        garrick = {"characterId": "garrick", "name": "Garrick"}
        mara = {"characterId": "mara", "name": "Mara"}
        meta = {speechmarks.META: ("word",)}
        self.harness.toEngine(self.harness.replyRequest("t1", meta={**meta, "speaker": garrick}))
        self.text("Stay back. ", "t1")
        self.chunks(0, 10 * RATE // 15, "t1")
        reaction = self.harness.replyRequest("r2", meta={**meta, "speaker": mara, "turn": "t1"})
        self.harness.toEngine(reaction)
        self.text("He means it.", "r2")
        self.assertEqual(self.harness.typesToGame(), ["reply.text.delta"])
        self.runner.runAll()
        sent = [(e.type, e.requestId) for e in self.harness.sentToGame]
        self.assertEqual(sent[1], (speechmarks.MARKS_ENVELOPE, "t1"))
        self.assertEqual(sent[-1], ("reply.text.delta", "r2"))
        marksEnvelope = self.harness.sentToGame[1]
        self.assertEqual(marksEnvelope["speaker"], garrick)
        self.assertEqual(marksEnvelope.meta["speaker"], garrick)

    def test_plainLineNamesNoSceneSpeaker(self) -> None:
        self.ask(("sentence",))
        self.text("Hello there. ")
        self.chunks(0, 12 * RATE // 15)
        marksEnvelope = self.harness.sentToGame[1]
        self.assertEqual(marksEnvelope["speaker"], {"characterId": "c1"})
        self.assertNotIn("speaker", marksEnvelope.meta)

    def test_soonestNeededSentencePreparedFirst(self) -> None:
        """
        The prepare thread takes the sentence due first, whatever order the
        sentences were queued in (a new line's first before another's fifth).
        """
        from rpmiddleware.builtin.animation.workers import Prepare, SoonestFirst

        done: list[str] = []
        ordered = SoonestFirst()
        for due, text in ((9.0, "fifth"), (1.0, "first"), (5.0, "third")):
            ordered.push(due, Prepare(text, lambda t, _: done.append(t), "en"))
        for _ in range(3):
            Prepare.finished(ordered.runNext())
        self.assertEqual(done, ["first", "third", "fifth"])

    def test_factory(self) -> None:
        plugin = speechMarks.buildPlugin({"threads": 3}, pluginServices(None))
        self.assertIsInstance(plugin, SpeechMarks)
        with self.assertRaises(ValueError):
            speechMarks.buildPlugin({"threads": 0}, pluginServices(None))


class MarksRig(ChainClientRig, SynchronousTestCase):
    """
    A client of the endpoint, the chain with speech-marks (and the default
    plugins), and the simulated RPEngine speaking words whose times are
    known (speech="words"), on a Clock.
    """

    #: Words the moderation plugin masks in the character's text.
    maskedWords: tuple[str, ...] = ()

    def setUp(self) -> None:
        self.reply = ""
        self.clock = Clock()
        settings = memorySettings()
        settings.chain = {"speech-marks": 250}
        if self.maskedWords:
            settings.plugins["moderation"] = {"words": list(self.maskedWords)}
        self.streams: list[Any] = []
        self.startClients(
            settings,
            SimulatorOptions(replyText=lambda request: self.reply, speech="words"),
            exampleCard(),
        )

    def turn(self, reply: str, **options: Any) -> list[dict[str, Any]]:
        self.reply = reply
        before = len(self.writer.sent)
        self.clients.say(self.connection, type="text", text="Hello?", **options)
        settle(self.clock, 30.0)
        return self.writer.sent[before:]


class EndToEndTests(MarksRig):
    """
    The client gets each sentence's marks before its audio, timed by its
    samples, with the words the simulator spoke.
    """

    def test_marksOfKnownSpeech(self) -> None:
        self.clients.say(
            self.connection,
            type="configure",
            speechMarks=["sentence", "word", "viseme"],
            output={"sampleRate": 24000},
        )
        sent = self.turn("Good evening, traveller. <laugh> Sit by the fire! It is warm.")
        llm = next(m for m in sent if m["type"] == "llm")["text"]
        spoken = self.engineStream()
        # The tag after the full stop joins the first two sentences, as in RPEngine.
        self.assertEqual(
            [s.text for s in spoken], ["Good evening, traveller.  Sit by the fire!", "It is warm."]
        )
        received = 0
        segment = -1
        for message in sent:
            if message["type"] == "speech-marks":
                sentences = [m for m in message["marks"] if m["type"] == "sentence"]
                self.assertEqual(len(sentences), 1)
                self.assertEqual(sentences[0]["sample"], received, "marks before their audio")
                segment += 1
                self.assertEqual(
                    [llm[m["start"] : m["end"]] for m in message["marks"] if m["type"] == "word"],
                    [w.value for w in spoken[segment].words],
                )
            elif message["type"] == "tts-chunk":
                self.assertGreaterEqual(segment, 0, "audio before any marks")
                received += len(decodeBase64(message["data"])) // 2
        self.assertEqual(segment, 1)
        marks = [m for m in sent if m["type"] == "speech-marks"]
        self.assertEqual(marks[0]["speaker"], {"characterId": "mira"})
        known = knownWordMarks(spoken)
        words = [m for message in marks for m in message["marks"] if m["type"] == "word"]
        self.assertEqual([w["value"] for w in words], [k["value"] for k in known])
        # Each word is placed within its own sentence's audio.
        for message in marks:
            sentence = message["marks"][0]
            lo, hi = sentence["time"], sentence["time"] + sentence["samples"] * 1000 // 24000
            for mark in message["marks"][1:]:
                self.assertTrue(lo <= mark["time"] <= hi, mark)

    def test_overWebRTCMarksGoOnTheDataChannelBeforeTheAudio(self) -> None:
        """
        With a WebRTC speech track the reply plays on the track; each
        sentence's marks go on the data channel while none of that
        sentence's audio has been given to the track yet.
        """
        missing = missingExtra()
        if missing is not None:
            raise SkipTest(missing)
        from rpmiddleware.webrtc.speech import FRAME_SECONDS, TRACK_RATE, SpeechTrack
        from rpmiddleware.webrtc.voice import VoiceLink

        fed = [0]
        track = SpeechTrack(clock=self.clock.seconds)
        feed = track.feed

        def counted(pcm16: bytes, rate: int | None = None) -> int:
            fed[0] += len(pcm16) // 2
            return feed(pcm16, rate)

        track.feed = counted  # type: ignore[method-assign]
        channel: list[tuple[dict[str, Any], int]] = []

        class Peer:
            closed = False
            speaking = True
            speech = track

            def send(self, message: dict[str, Any]) -> None:
                channel.append((message, fed[0]))

        link = VoiceLink.__new__(VoiceLink)
        link.connection = self.connection  # type: ignore[assignment]
        link.label = "test"
        link.peer = Peer()  # type: ignore[assignment]
        link.turnIds = {}
        self.connection.voice = link
        frames = LoopingCall(track.nextFrame)
        frames.clock = self.clock
        frames.start(FRAME_SECONDS, now=False)
        self.addCleanup(frames.stop)
        self.clients.say(self.connection, type="configure", speechMarks=["sentence", "word"])
        self.turn("Stay by the fire. The road is long.")
        marks = [(m, at) for m, at in channel if m["type"] == "speech-marks"]
        self.assertEqual(len(marks), 2)
        for message, at in marks:
            self.assertEqual(message["sampleRate"], TRACK_RATE)
            self.assertEqual(message["marks"][0]["sample"], at, "none of its audio on the track")
        self.assertGreater(fed[0], marks[1][0]["marks"][0]["sample"])

    def test_cancelDropsHeldAudioAndMarks(self) -> None:
        """
        The game cancels while a sentence's audio is held for its marks:
        neither that audio nor its marks reach the client, and the turn ends
        with tts-cancelled; the next turn gets its marks as usual.
        """
        [plugin] = [p for p in self.middleware.chain.plugins if isinstance(p, SpeechMarks)]
        runner = Runner()
        plugin._run = runner
        self.clients.say(self.connection, type="configure", speechMarks=["word"])
        self.reply = "Stay by the fire. The road is long."
        before = len(self.writer.sent)
        chunks: list[Any] = []
        stop = self.middleware.router.observe(
            lambda e: chunks.append(e) if e.type == "reply.audio.chunk" else None
        )
        self.addCleanup(stop)
        self.clients.say(self.connection, type="text", text="Hello?")
        settle(self.clock, 5.0)
        self.assertEqual(chunks, [], "the first sentence's audio is held")
        self.assertTrue(
            self.link.engine.knownSpeech or self.link.engine.completed, "RPEngine spoke"
        )
        self.clients.say(self.connection, type="cancel")
        runner.runAll()
        settle(self.clock, 5.0)
        types = [m["type"] for m in self.writer.sent[before:]]
        self.assertIn("tts-cancelled", types)
        self.assertNotIn("speech-marks", types)
        self.assertNotIn("tts-chunk", types)
        plugin._run = None
        sent = self.turn("Good evening.")
        self.assertEqual([m["type"] for m in sent].count("speech-marks"), 1)

    def engineStream(self) -> Any:
        engine = self.link.engine
        return engine.knownSpeech[engine.completed[-1]]


class MaskedTextTests(MarksRig):
    """
    With moderation masking a word of the character's text, the marks show
    the text as the client was shown it.
    """

    maskedWords = ("fire",)

    def test_marksShowTheMaskedText(self) -> None:
        self.clients.say(self.connection, type="configure", speechMarks=["sentence", "word"])
        sent = self.turn("Stay by the fire. The road is long.")
        llm = next(m for m in sent if m["type"] == "llm")["text"]
        self.assertEqual(llm, "Stay by the ****. The road is long.")
        marks = [k for m in sent if m["type"] == "speech-marks" for k in m["marks"]]
        values = [k["value"] for k in marks]
        self.assertIn("Stay by the ****.", values)
        self.assertIn("****", values)
        self.assertNotIn("fire", " ".join(values))
