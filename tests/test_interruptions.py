"""
Every way a turn is interrupted, played as a player plays it: the next line
is sent the moment the interruption happens, never after the clock settled.
The default chain on a Clock with the simulated RPEngine (which assembles
every prompt as RPEngine's core does) and a client of the endpoint.

What each path sends RPEngine and what each character remembers is the
table in docs/memory.md (I{When a turn is interrupted}); each row is a
test here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock, LoopingCall
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from rpmiddleware.builtin.memory import IConversationMemory, Memory
from rpmiddleware.builtin.memory.api import heard
from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.protocol.prompt import AssembledPrompt
from rpmiddleware.testing.inmemory import connectInMemory
from rpmiddleware.testing.kit import exampleAction, exampleCard
from rpmiddleware.testing.simoptions import SimulatorOptions, defaultReplyText
from tests.support.client import clockedEndpoint
from tests.support.connections import OpenConnections
from tests.support.memory import settle
from tests.support.webrtc import missingExtra

STORY = "Tell me a very long story."
NEXT = "Stop, never mind. What is your name?"
#: Each way between the middleware and RPEngine, as over a real connection.
LATENCY = 0.005
LONG = " ".join(f"word{i}." for i in range(40))


class Rig:
    """
    The default chain (memory in it) on a Clock, the simulator paced at
    C{tokensPerSecond}, and one client of the endpoint playing C{mira}.
    C{lines} maps a characterId to what its model says.
    """

    def __init__(
        self,
        lines: dict[str, str] | None = None,
        tokensPerSecond: float | None = 20,
        memory: bool = True,
    ) -> None:
        self.lines = lines if lines is not None else {}
        self.clock = Clock()
        self.settings = Settings()
        self.settings.plugins["memory"] = {"path": ":memory:", "summaries": False}
        if not memory:
            self.settings.chain["memory"] = None
        self.middleware = Middleware.fromSettings(self.clock, self.settings)
        self.link = connectInMemory(
            self.middleware,
            self.clock,
            SimulatorOptions(replyText=self._reply, tokensPerSecond=tokensPerSecond),
            latency=LATENCY,
        )
        self.endpoint = clockedEndpoint(self.middleware, self.settings, self.clock)
        self.clients = OpenConnections(self.endpoint, self.clock)
        self.middleware.router.observe(ExtensionBridge(self.clients))
        settle(self.clock, 0.2)
        self.connection, self.writer = self.clients.connect()
        found = self.middleware.plugin(IConversationMemory)
        assert isinstance(found, Memory) or not memory
        self.memory = found
        self.card = exampleCard(mes_example="", first_mes="")

    def _reply(self, request: dict[str, Any]) -> str:
        said = self.lines.get(str(request.get("characterId")))
        return said if said is not None else defaultReplyText(request)

    @property
    def engine(self) -> Any:
        return self.link.engine

    def say(self, **message: Any) -> None:
        self.clients.say(self.connection, **message)

    def sent(self, *types: str) -> list[dict[str, Any]]:
        return [m for m in self.writer.sent if not types or m["type"] in types]

    def begin(self) -> None:
        self.say(type="character", characterId="mira", card=self.card)
        self.say(type="configure", player={"displayName": "Alex"}, output={"modalities": ["text"]})

    def until(self, predicate: Any, seconds: float = 30.0, step: float = 0.01) -> None:
        """Run the Clock in small steps until C{predicate()} holds."""
        for _ in range(int(seconds / step)):
            if predicate():
                return
            self.clock.advance(step)
        raise AssertionError("never happened")

    def received(self) -> str:
        """The reply text the client got so far, as llm-chunks."""
        return "".join(m["content"] for m in self.sent("llm-chunk"))

    def requests(self, characterId: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.engine.receivedMessages
            if r.get("type") == "reply.request"
            and (characterId is None or r.get("characterId") == characterId)
        ]

    def invocationFor(self, text: str) -> AssembledPrompt:
        for invocation in self.engine.invocations:
            if invocation.user == text:
                return invocation  # type: ignore[no-any-return]
        raise AssertionError(f"no invocation for {text!r}")

    def entries(self, characterId: str = "mira") -> list[tuple[str, str, str]]:
        conversation = self.memory.read(characterId, f"session:{self.connection.session.id}")
        return [(e["role"], e["text"], e["status"]) for e in conversation["entries"]]


class BargeInTests(SynchronousTestCase):
    def test_textBargeInAtOnceHoldsTheInterruptedExchange(self) -> None:
        """
        A new line sent the moment the first llm-chunk arrives: the request
        for it holds the first line and the reply as far as the client got
        it, in order, marked as cut off, before RPEngine has even said
        reply.cancelled.
        """
        rig = Rig({"mira": LONG})
        rig.begin()
        rig.say(type="text", text=STORY)
        rig.until(lambda: rig.sent("llm-chunk"))
        got = rig.received()
        rig.say(type="text", text=NEXT)
        settle(rig.clock, 30)
        invocation = rig.invocationFor(NEXT)
        self.assertEqual(
            list(invocation.history), [("user", STORY), ("assistant", got.strip() + " —")]
        )
        self.assertLess(len(got), len(LONG))
        self.assertEqual(
            rig.entries()[:2],
            [("player", STORY, "complete"), ("character", got.strip(), "interrupted")],
        )

    def interrupted(self, rig: Rig, interrupt: Any) -> str:
        """
        Start the long story, and at its first llm-chunk call C{interrupt}
        and send the next line at once; the reply text the client had.
        """
        rig.begin()
        rig.say(type="text", text=STORY)
        rig.until(lambda: rig.sent("llm-chunk"))
        got = rig.received()
        interrupt()
        return got

    def assertRemembered(self, rig: Rig, got: str) -> None:
        """The request for NEXT held the first exchange as far as the client got it."""
        settle(rig.clock, 30)
        invocation = rig.invocationFor(NEXT)
        self.assertEqual(
            list(invocation.history), [("user", STORY), ("assistant", got.strip() + " —")]
        )
        self.assertLess(len(got.strip()), len(LONG))

    def test_cancelThenTheNextLineAtOnce(self) -> None:
        """
        C{cancel}, then the next line in the same moment: RPEngine gets
        request.cancel, and the next request holds the cut-off exchange.
        """
        rig = Rig({"mira": LONG})

        def interrupt() -> None:
            rig.say(type="cancel")
            rig.say(type="text", text=NEXT)

        got = self.interrupted(rig, interrupt)
        self.assertRemembered(rig, got)
        cancels = [r for r in rig.engine.receivedMessages if r["type"] == "request.cancel"]
        self.assertEqual([c["requestId"] for c in cancels], [rig.requests()[0]["requestId"]])

    def test_audioBargeInAtOnce(self) -> None:
        """
        Speech barging in (a recording, as an C{audio} message or a WebRTC
        microphone's utterance becomes): the same rule.
        """
        rig = Rig({"mira": LONG})
        rig.engine.options.audioTranscript = NEXT
        audio = {"format": "pcm_s16le", "sampleRate": 16000, "channels": 1, "data": "AAAAAA=="}
        got = self.interrupted(rig, lambda: rig.connection.submitAudio(audio))
        settle(rig.clock, 30)
        mine = [r for r in rig.requests() if "audio" in r.get("event", {})]
        self.assertEqual(len(mine), 1)
        invocation = rig.engine.invocations[-1]
        self.assertEqual(
            list(invocation.history), [("user", STORY), ("assistant", got.strip() + " —")]
        )

    def test_voiceCaptureBargeInAtOnce(self) -> None:
        """A C{voice-capture start} that barges in: the same rule."""
        rig = Rig({"mira": LONG})
        got = self.interrupted(rig, lambda: rig.say(type="voice-capture", action="start"))
        settle(rig.clock, 30)
        self.assertEqual(
            list(rig.engine.invocations[-1].history),
            [("user", STORY), ("assistant", got.strip() + " —")],
        )

    def test_clientGoneIsRememberedAtOnce(self) -> None:
        """
        A client that disconnects mid-reply: its exchange is remembered in
        the same moment, before RPEngine answered the cancel.
        """
        rig = Rig({"mira": LONG})
        got = self.interrupted(rig, rig.connection.lost)
        self.assertEqual(
            rig.entries(),
            [("player", STORY, "complete"), ("character", got.strip(), "interrupted")],
        )

    def test_engineLostMidLine(self) -> None:
        """
        RPEngine lost mid-line (its request ends with engine_disconnected):
        remembered as far as the client got it; the next RPEngine's first
        request holds it.
        """
        rig = Rig({"mira": LONG})

        def lose() -> None:
            rig.link.disconnect()
            rig.clock.advance(0)
            self.assertEqual(rig.sent("error")[-1]["code"], "LLM_ERROR")
            rig.link = connectInMemory(
                rig.middleware,
                rig.clock,
                SimulatorOptions(replyText=rig._reply, tokensPerSecond=20),
                latency=LATENCY,
            )
            rig.say(type="text", text=NEXT)

        got = self.interrupted(rig, lose)
        self.assertRemembered(rig, got)

    def test_stall(self) -> None:
        """
        RPEngine falls silent mid-line and the stall rule cancels the turn:
        remembered as far as the client got it.
        """
        rig = Rig({"mira": LONG})
        rig.connection.settings.stall_timeout = 1.0

        def silence() -> None:
            rig.link._received = lambda text: None  # type: ignore[method-assign]

        got = self.interrupted(rig, silence)
        rig.clock.advance(1.0)
        self.assertEqual(rig.sent("error")[-1]["code"], "LLM_TIMEOUT")
        self.assertEqual(
            rig.entries(),
            [("player", STORY, "complete"), ("character", got.strip(), "interrupted")],
        )


#: A reply of whole sentences, each one segment of RPEngine's speech.
FIRST = "I will tell you a story now."
TALE = (
    f"{FIRST} It starts in a small village by the sea. The fishermen there were poor "
    "but happy. One morning a stranger came ashore. He carried a chest of gold and "
    "silver. Nobody knew where he came from."
)
#: Seconds the simulator's voice takes to say the first sentence.
FIRST_SECONDS = len(FIRST) * 0.05


class PlayedSpeechTests(SynchronousTestCase):
    """
    A spoken reply cut off is remembered as far as the player heard it: the
    sentences its speech played whole, not the text sent.  Over WebRTC the
    speech track says how much it played; over the WebSocket the client
    says it (C{played}); a client that says nothing gets the text rule.
    """

    def spoken(self, rig: Rig) -> None:
        rig.begin()
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text=STORY)

    def assertHeardFirstSentence(self, rig: Rig) -> None:
        settle(rig.clock, 30)
        invocation = rig.invocationFor(NEXT)
        self.assertEqual(list(invocation.history), [("user", STORY), ("assistant", FIRST + " —")])
        self.assertEqual(
            rig.entries()[:2],
            [("player", STORY, "complete"), ("character", FIRST, "interrupted")],
        )

    def sentBeyondTheFirst(self, rig: Rig) -> None:
        """Wait until the client was sent the second sentence's text and speech."""
        rig.until(lambda: "by the sea." in rig.received() and len(rig.sent("tts-chunk")) >= 2)
        self.assertEqual(rig.sent("reply-complete"), [], "the reply still streams")

    def test_webSocketClientReportsPlayedMs(self) -> None:
        """
        A barge-in by C{text} whose C{played} says the client played the
        first sentence and a little of the second: the next request holds
        the first sentence alone, cut off, though the client had the text
        of two.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=10)
        self.spoken(rig)
        self.sentBeyondTheFirst(rig)
        rig.say(type="text", text=NEXT, played={"ms": (FIRST_SECONDS + 0.1) * 1000})
        self.assertHeardFirstSentence(rig)

    def test_webSocketCancelReportsPlayedSamples(self) -> None:
        """
        C{cancel} with C{played} in samples at the C{tts-chunk}s' rate, then
        the next line at once: the same.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=10)
        self.spoken(rig)
        self.sentBeyondTheFirst(rig)
        rate = rig.sent("tts-chunk")[0]["sampleRate"]
        rig.say(type="cancel", played={"samples": int((FIRST_SECONDS + 0.1) * rate)})
        rig.say(type="text", text=NEXT)
        self.assertHeardFirstSentence(rig)

    def test_webSocketPlayedNothingWhole(self) -> None:
        """
        A client that played less than the first sentence: the reply is not
        remembered at all, only the player's line.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=10)
        self.spoken(rig)
        self.sentBeyondTheFirst(rig)
        rig.say(type="text", text=NEXT, played={"samples": 10})
        settle(rig.clock, 30)
        self.assertEqual(list(rig.invocationFor(NEXT).history), [("user", STORY)])
        self.assertEqual(
            rig.entries()[:2], [("player", STORY, "complete"), ("player", NEXT, "complete")]
        )

    def test_webSocketSilentClientGetsTheTextRule(self) -> None:
        """
        A spoken turn cut by a client that says nothing of its playback:
        remembered as far as the client got the text.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=10)
        self.spoken(rig)
        self.sentBeyondTheFirst(rig)
        got = rig.received().strip()
        rig.say(type="text", text=NEXT)
        settle(rig.clock, 30)
        self.assertIn("by the sea.", got)
        self.assertEqual(
            list(rig.invocationFor(NEXT).history), [("user", STORY), ("assistant", got + " —")]
        )
        self.assertEqual(rig.entries()[1], ("character", got, "interrupted"))

    def test_playedIsChecked(self) -> None:
        """
        A C{played} that is not one of ms and samples (and, optionally, a
        C{line} from 0) is refused, naming it.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=10)
        self.spoken(rig)
        wrong = (
            {"ms": -1},
            {"samples": 1.5},
            {"ms": 1, "samples": 1},
            {"s": 1},
            3,
            {"ms": 1, "line": -1},
            {"ms": 1, "line": "0"},
            {"line": 0},
        )
        for played in wrong:
            rig.say(type="cancel", played=played)
            error = rig.sent("error")[-1]
            self.assertEqual(error["code"], "INVALID_MESSAGE")
            self.assertIn("cancel.played", error["message"])
        self.assertEqual(rig.sent("tts-cancelled"), [], "a refused cancel cancels nothing")

    def test_webRTCBargeInAfterTheFirstSentencePlayed(self) -> None:
        """
        Over WebRTC the speech track plays the reply in real time; the
        player speaks once the first sentence was played and a little of
        the second: the next request (the utterance, sent at once) holds
        the first sentence alone, cut off, though the text of more was
        sent and more speech was queued on the track.
        """
        from rpmiddleware.webrtc.speech import TRACK_RATE

        rig = Rig({"mira": TALE}, tokensPerSecond=10)
        link, track = trackLink(rig)
        rig.engine.options.audioTranscript = NEXT
        self.spoken(rig)
        rig.until(lambda: track.played(track.turn) >= (FIRST_SECONDS + 0.1) * TRACK_RATE)
        self.assertIn("by the sea.", rig.received())
        self.assertEqual(rig.sent("tts-chunk"), [], "the speech went on the track")
        self.assertGreater(track.queuedSeconds, 0.5, "more was queued than was played")
        playerSpeaks(self, rig, link, track)
        settle(rig.clock, 30)
        self.assertEqual(
            list(rig.engine.invocations[-1].history),
            [("user", STORY), ("assistant", FIRST + " —")],
        )
        self.assertEqual(rig.entries()[1], ("character", FIRST, "interrupted"))


class CutAfterCompletedTests(SynchronousTestCase):
    """
    RPEngine completed the reply (the whole text and speech reached the
    middleware, and memory kept the whole reply) while the player still
    hears it; the player then cuts it off.  What was played is told through
    the chain (C{x-client.played}) before the next line's request, and
    memory cuts the reply to the sentences played whole.  The next line is
    sent at once.
    """

    def completed(self, rig: Rig) -> None:
        """A spoken reply, completed upstream; the player has not heard it all."""
        PlayedSpeechTests.spoken(self, rig)  # type: ignore[arg-type]
        rig.until(lambda: rig.sent("reply-complete"))
        self.assertEqual(rig.entries()[1], ("character", TALE, "complete"))

    def assertHeardFirstSentence(self, rig: Rig) -> None:
        PlayedSpeechTests.assertHeardFirstSentence(self, rig)  # type: ignore[arg-type]
        self.assertNotIn("x-client.played", [m["type"] for m in rig.engine.receivedMessages])

    def firstSentencePlayed(self, rig: Rig) -> int:
        rate: int = rig.sent("tts-chunk")[0]["sampleRate"]
        return int((FIRST_SECONDS + 0.1) * rate)

    def test_webRTCBargeInAfterCompleted(self) -> None:
        """
        Over WebRTC the speech track still plays a reply RPEngine completed;
        the player speaks once the first sentence was played: the track
        falls silent, and the next request (the utterance, sent at once)
        holds the first sentence alone, cut off, not the whole reply that
        was remembered when it completed.
        """
        from rpmiddleware.webrtc.speech import TRACK_RATE

        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        link, track = trackLink(rig)
        rig.engine.options.audioTranscript = NEXT
        PlayedSpeechTests.spoken(self, rig)  # type: ignore[arg-type]
        rig.until(lambda: track.played(track.turn) >= (FIRST_SECONDS + 0.1) * TRACK_RATE)
        self.assertTrue(rig.sent("reply-complete"), "RPEngine completed the reply")
        self.assertEqual(rig.entries()[1], ("character", TALE, "complete"))
        self.assertGreater(track.queuedSeconds, 1, "most of it still plays")
        playerSpeaks(self, rig, link, track)
        settle(rig.clock, 30)
        self.assertEqual(
            list(rig.engine.invocations[-1].history),
            [("user", STORY), ("assistant", FIRST + " —")],
        )
        self.assertEqual(rig.entries()[1], ("character", FIRST, "interrupted"))

    def webRTCCompleted(self, rig: Rig) -> Any:
        """
        Over WebRTC, a reply RPEngine completed, its first sentence (and a
        little of the second) played on the track, most of it still queued.
        """
        from rpmiddleware.webrtc.speech import TRACK_RATE

        link, track = trackLink(rig)
        PlayedSpeechTests.spoken(self, rig)  # type: ignore[arg-type]
        rig.until(lambda: track.played(track.turn) >= (FIRST_SECONDS + 0.1) * TRACK_RATE)
        self.assertTrue(rig.sent("reply-complete"), "RPEngine completed the reply")
        self.assertEqual(rig.entries()[1], ("character", TALE, "complete"))
        self.assertGreater(track.queuedSeconds, 1, "most of it still plays")
        return track

    def assertTrackSilenced(self, rig: Rig, track: Any, told: int) -> None:
        self.assertEqual(track.queuedSeconds, 0, "the track fell silent at once")
        turnId = rig.sent("reply-complete")[-1]["turnId"]
        cancelled = [m for m in rig.sent()[told:] if m["type"] == "tts-cancelled"]
        self.assertEqual([m.get("turnId") for m in cancelled], [turnId])

    def test_webRTCCancelAfterCompletedSilencesTheTrack(self) -> None:
        """
        Over WebRTC, a typed C{cancel} (no C{played}) after C{reply-complete}
        while the track still plays the reply: the track falls silent
        (C{tts-cancelled} for that turn), and the next line, sent at once,
        holds the reply up to the first sentence, cut off: the track's count.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        track = self.webRTCCompleted(rig)
        told = len(rig.sent())
        rig.say(type="cancel")
        self.assertTrackSilenced(rig, track, told)
        rig.say(type="text", text=NEXT)
        self.assertHeardFirstSentence(rig)

    def test_webRTCCancelWithPlayedAfterCompletedUsesTheTrack(self) -> None:
        """
        The same C{cancel} with a C{played} that claims the whole reply (and
        naming the turn): the track knows what it played, and its count is
        the one used.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        track = self.webRTCCompleted(rig)
        turnId = rig.sent("reply-complete")[-1]["turnId"]
        told = len(rig.sent())
        rig.say(type="cancel", turnId="another", played={"ms": 600_000})
        self.assertGreater(track.queuedSeconds, 1, "a cancel naming another turn stops nothing")
        rig.say(type="cancel", turnId=turnId, played={"ms": 600_000})
        self.assertTrackSilenced(rig, track, told)
        rig.say(type="text", text=NEXT)
        self.assertHeardFirstSentence(rig)

    def test_webRTCTextBargeInAfterCompletedSilencesTheTrack(self) -> None:
        """
        Over WebRTC, a typed line after C{reply-complete} while the track
        still plays the reply: the track falls silent, and the request for
        the line holds the reply up to the first sentence, cut off.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        track = self.webRTCCompleted(rig)
        told = len(rig.sent())
        rig.say(type="text", text=NEXT)
        self.assertTrackSilenced(rig, track, told)
        self.assertHeardFirstSentence(rig)

    def test_webSocketCancelPlayedAfterReplyComplete(self) -> None:
        """
        C{cancel} with C{played} (samples) after C{reply-complete}, then the
        next line at once: the reply is remembered up to the first
        sentence, cut off; the cancel is answered with nothing (the turn
        already ended).
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        self.completed(rig)
        told = len(rig.sent())
        rig.say(type="cancel", played={"samples": self.firstSentencePlayed(rig)})
        self.assertEqual(rig.sent()[told:], [], "nothing is answered")
        rig.say(type="text", text=NEXT)
        self.assertHeardFirstSentence(rig)

    def test_webSocketCancelNamingTheTurnAfterReplyComplete(self) -> None:
        """
        The same with the turn's C{turnId}; a C{cancel} naming another turn
        changes nothing.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        self.completed(rig)
        turnId = rig.sent("reply-complete")[-1]["turnId"]
        played = {"samples": self.firstSentencePlayed(rig)}
        rig.say(type="cancel", turnId="another", played=played)
        settle(rig.clock, 1)
        self.assertEqual(rig.entries()[1], ("character", TALE, "complete"))
        rig.say(type="cancel", turnId=turnId, played=played)
        rig.say(type="text", text=NEXT)
        self.assertHeardFirstSentence(rig)

    def test_textBargeInPlayedAfterReplyComplete(self) -> None:
        """
        A barge-in by C{text} with C{played} (ms) after C{reply-complete}:
        the request for it holds the first sentence alone, cut off.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        self.completed(rig)
        rig.say(type="text", text=NEXT, played={"ms": (FIRST_SECONDS + 0.1) * 1000})
        self.assertHeardFirstSentence(rig)

    def test_playedAllOfItChangesNothing(self) -> None:
        """A client that played the whole reply: remembered whole."""
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        self.completed(rig)
        rig.say(type="cancel", played={"ms": 600_000})
        rig.say(type="text", text=NEXT)
        settle(rig.clock, 30)
        self.assertEqual(
            list(rig.invocationFor(NEXT).history), [("user", STORY), ("assistant", TALE)]
        )

    def test_noMemoryPluginDropsItQuietly(self) -> None:
        """
        A chain without memory: what was played goes nowhere, quietly (no
        warning, nothing to RPEngine, no error to the client), and the next
        line is answered.
        """
        events = EventLoggingObserver()
        globalLogPublisher.addObserver(events)
        self.addCleanup(globalLogPublisher.removeObserver, events)
        rig = Rig({"mira": TALE}, tokensPerSecond=None, memory=False)
        self.assertNotIn("memory", rig.middleware.pluginNames)
        PlayedSpeechTests.spoken(self, rig)  # type: ignore[arg-type]
        rig.until(lambda: rig.sent("reply-complete"))
        rig.say(type="cancel", played={"samples": 10})
        rig.say(type="text", text=NEXT)
        settle(rig.clock, 30)
        self.assertEqual(len(rig.sent("reply-complete")), 2, "the next line was answered")
        self.assertEqual(rig.sent("error"), [])
        self.assertNotIn("x-client.played", [m["type"] for m in rig.engine.receivedMessages])
        self.assertEqual(list(rig.invocationFor(NEXT).history), [])
        warned = [e for e in events if e.get("log_level") in (LogLevel.warn, LogLevel.error)]
        self.assertEqual(warned, [])

    def test_notTheNewestEntryIsLeftWhole(self) -> None:
        """
        The character heard another line after its reply completed (a
        scene's, an action's outcome): a cut that comes after it is logged
        and the reply left whole, since what followed was heard after it.
        """
        rig = Rig({"mira": TALE}, tokensPerSecond=None)
        self.completed(rig)
        line = heard(
            "rpmiddleware",
            "mira",
            "event",
            "",
            "The bell rang.",
            {"client": rig.connection.session.id},
        )
        rig.middleware.submit(line)
        rig.say(type="cancel", played={"samples": self.firstSentencePlayed(rig)})
        rig.say(type="text", text=NEXT)
        settle(rig.clock, 30)
        self.assertEqual(
            rig.entries()[:3],
            [
                ("player", STORY, "complete"),
                ("character", TALE, "complete"),
                ("event", "The bell rang.", "complete"),
            ],
        )
        self.assertEqual(
            list(rig.invocationFor(NEXT).history)[:2], [("user", STORY), ("assistant", TALE)]
        )


def playerSpeaks(case: SynchronousTestCase, rig: Rig, link: Any, track: Any) -> None:
    """
    The player speaks on the microphone track: the detector's speech-start
    (the barge-in), then the utterance; the speech track falls silent at
    once.
    """
    from rpmiddleware.webrtc.vad import SpeechStarted

    link._speechStarted(SpeechStarted(0))
    rig.connection.submitAudio(
        {"format": "pcm_s16le", "sampleRate": 16000, "channels": 1, "data": "AAAAAA=="}
    )
    case.assertEqual(track.queuedSeconds, 0, "the track fell silent at once")


def trackLink(rig: Rig) -> tuple[Any, Any]:
    """
    A WebRTC link for the rig's connection with a negotiated speech track
    (no real peer: the track's frames are taken every 20 ms of the Clock,
    as aiortc's sender takes them in real time).
    """
    # Skipped only when the extra (aiortc, webrtcvad) is missing: an import
    # error of our own modules fails the test instead of hiding it.
    missing = missingExtra()
    if missing is not None:
        raise SkipTest(missing)
    from rpmiddleware.webrtc.speech import FRAME_SECONDS, SpeechTrack
    from rpmiddleware.webrtc.voice import VoiceLink

    class Peer:
        closed = False
        speaking = True

        def __init__(self) -> None:
            self.speech = SpeechTrack(clock=rig.clock.seconds)
            self.sent: list[dict[str, Any]] = []

        def send(self, message: dict[str, Any]) -> None:
            self.sent.append(message)

    peer = Peer()
    link = VoiceLink.__new__(VoiceLink)
    link.connection = rig.connection  # type: ignore[assignment]
    link.label = "test"
    link.peer = peer  # type: ignore[assignment]
    link.turnIds = {}
    rig.connection.voice = link
    frames = LoopingCall(peer.speech.nextFrame)
    frames.clock = rig.clock
    frames.start(FRAME_SECONDS, now=False)
    return link, peer.speech


GARRICK = "Halt. The gate is shut."
MARA = " ".join(f"mara{i}" for i in range(40)) + "."


def sceneCard(name: str, description: str) -> dict[str, Any]:
    return exampleCard(name=name, description=description, mes_example="", first_mes="")


CAST: list[dict[str, Any]] = [
    {"characterId": "garrick", "card": sceneCard("Garrick", "The north gate's guard.")},
    {"characterId": "mara", "card": sceneCard("Mara", "The innkeeper by the gate.")},
]


class SceneInterruptionTests(SynchronousTestCase):
    def openScene(self, rig: Rig, **extra: Any) -> None:
        rig.say(type="character", characterId="garrick", card=CAST[0]["card"])
        rig.say(type="configure", player={"displayName": "Alex"}, output={"modalities": ["text"]})
        rig.say(type="scene", op="open", sceneId="gate", cast=CAST, **extra)
        assert rig.sent("scene-state")[-1]["scene"]["sceneId"] == "gate"

    def maraReceived(self, rig: Rig) -> str:
        return "".join(
            m["content"] for m in rig.sent("llm-chunk") if m["speaker"]["characterId"] == "mara"
        )

    def test_bargeInDuringAReactionStopsIt(self) -> None:
        """
        The player's line to Garrick is answered; while Mara's reaction
        streams (the client has seen three words of it), the player sends a
        new line at once.  Mara's request is cancelled upstream within one
        round trip, no further reaction is asked, and no character's memory
        holds words of hers the client never received.
        """
        rig = Rig({"garrick": GARRICK, "mara": MARA})
        self.openScene(rig, reactions=2)
        rig.say(type="text", text="Garrick, may I pass?")
        rig.until(lambda: self.maraReceived(rig).count("mara") >= 3)
        got = self.maraReceived(rig)
        maraRequest = rig.requests("mara")[0]["requestId"]
        asked = len(rig.requests())
        rig.say(type="text", text="Mara, what is your name?")
        rig.lines.update(mara="I am Mara.", garrick="She is Mara.")
        rig.clock.advance(2 * LATENCY)
        cancels = [
            r["requestId"] for r in rig.engine.receivedMessages if r["type"] == "request.cancel"
        ]
        self.assertIn(maraRequest, cancels)
        settle(rig.clock, 30)
        after = [r["event"]["text"] for r in rig.requests()[asked:]]
        self.assertEqual(after[0], "Mara, what is your name?", "the new line came next")
        self.assertFalse(
            [text for text in after if "mara" in text], "no reaction to the abandoned line"
        )
        self.assertNotIn(MARA, " ".join(text for _, text, _ in rig.entries("mara")))
        self.assertIn(("character", got.strip(), "interrupted"), rig.entries("mara"))
        # Garrick heard her as far as the player did.
        self.assertIn(("other", got.strip(), "interrupted"), rig.entries("garrick"))
        for characterId in ("garrick", "mara"):
            for _, text, _ in rig.entries(characterId):
                self.assertNotIn("mara39", text, characterId)
        # Mara's next request holds her cut-off line, marked, and the new line.
        invocation = rig.invocationFor("Mara, what is your name?")
        self.assertIn(("assistant", got.strip() + " —"), list(invocation.history))

    def test_bargeInDuringTheAddressedLine(self) -> None:
        """
        The player cuts Garrick off while his answer streams: his request is
        cancelled, Mara is never asked to react, and both remember his line
        as far as the player got it, cut off, in the request for the next.
        """
        rig = Rig({"garrick": MARA.replace("mara", "garrick"), "mara": "Hush."})
        self.openScene(rig)
        rig.say(type="text", text="Garrick, may I pass?")
        rig.until(lambda: rig.received().count("garrick") >= 2)
        got = rig.received().strip()
        rig.say(type="text", text="Mara, never mind him.")
        settle(rig.clock, 30)
        self.assertEqual(
            [r["characterId"] for r in rig.requests()],
            ["garrick", "mara", "garrick"],
            "no reaction to the line cut off; Mara answers the new line, Garrick reacts",
        )
        self.assertIn(("character", got, "interrupted"), rig.entries("garrick"))
        invocation = rig.invocationFor("Mara, never mind him.")
        self.assertEqual(
            list(invocation.history),
            [("user", "(to Garrick) Garrick, may I pass?"), ("user", f"Garrick: {got} —")],
        )


class ScenePlayedTests(SynchronousTestCase):
    def test_listenersHeardTheAddressedLineAsFarAsItWasPlayed(self) -> None:
        """
        A spoken scene: the player barges in on Garrick's line with
        C{played} (the first sentence and a little more), though the client
        had the text of two: Mara, who heard him, remembers his line as far
        as it was played, cut off, as he does.
        """
        rig = Rig({"garrick": TALE, "mara": "Hush."}, tokensPerSecond=10)
        SceneInterruptionTests.openScene(self, rig, reactions=0)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text="Garrick, tell me a story.")
        rig.until(lambda: "by the sea." in rig.received() and len(rig.sent("tts-chunk")) >= 2)
        rig.say(
            type="text",
            text="Mara, never mind him.",
            played={"ms": (FIRST_SECONDS + 0.1) * 1000},
        )
        settle(rig.clock, 30)
        self.assertIn(("character", FIRST, "interrupted"), rig.entries("garrick"))
        self.assertIn(("other", FIRST, "interrupted"), rig.entries("mara"))
        for _, text, _ in rig.entries("mara"):
            self.assertNotIn("by the sea", text)
        invocation = rig.invocationFor("Mara, never mind him.")
        self.assertIn(("user", f"Garrick: {FIRST} —"), list(invocation.history))

    def maraSpeaking(self, rig: Rig) -> None:
        """
        A spoken scene: Garrick answers the player, and Mara's reaction
        streams until the client had the text of two of its sentences and
        speech of more than one.
        """
        SceneInterruptionTests.openScene(self, rig, reactions=1)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text="Garrick, may I pass?")

        def maraSpoke() -> bool:
            said = SceneInterruptionTests.maraReceived(self, rig)  # type: ignore[arg-type]
            chunks = [m for m in rig.sent("tts-chunk") if m["speaker"]["characterId"] == "mara"]
            return "by the sea." in said and len(chunks) >= 2

        rig.until(maraSpoke)

    def assertHeardFirstSentence(
        self, rig: Rig, nextLine: str, speaker: str, listener: str
    ) -> None:
        """
        C{speaker}'s line up to its first sentence, cut off, for the speaker
        and for C{listener}, and nothing after it in either memory; the next
        line's request holds it so.
        """
        settle(rig.clock, 30)
        self.assertIn(("character", FIRST, "interrupted"), rig.entries(speaker))
        self.assertIn(("other", FIRST, "interrupted"), rig.entries(listener))
        for characterId in (speaker, listener):
            for _, text, _ in rig.entries(characterId):
                self.assertNotIn("by the sea", text, characterId)
        invocation = rig.invocationFor(nextLine)
        label = speaker.capitalize()
        self.assertIn(("user", f"{label}: {FIRST} —"), list(invocation.history))

    def assertMaraHeardFirstSentence(self, rig: Rig, nextLine: str) -> None:
        self.assertHeardFirstSentence(rig, nextLine, "mara", "garrick")
        reaction = [i for i in rig.engine.invocations if i.user.startswith("Garrick: ")][-1]
        self.assertIn(("assistant", FIRST + " —"), list(reaction.history))

    def test_reactionCutWithPlayedIsRememberedAsPlayed(self) -> None:
        """
        The player barges in on Mara's reaction with C{played} (its first
        sentence and a little more), though the client had the text of
        two: the scene's cancel of her request carries the played amount,
        so she remembers her line as far as it was played, cut off, as
        Garrick, who heard her, does; the next line's request and her next
        reaction hold it so.
        """
        rig = Rig({"garrick": GARRICK, "mara": TALE}, tokensPerSecond=10)
        self.maraSpeaking(rig)
        rig.lines.update(mara="Hush.", garrick="As you wish.")
        nextLine = "Garrick, never mind her."
        rig.say(type="text", text=nextLine, played={"ms": (FIRST_SECONDS + 0.1) * 1000})
        self.assertMaraHeardFirstSentence(rig, nextLine)

    def test_reactionCutOverWebRTCIsRememberedAsPlayed(self) -> None:
        """
        The same over WebRTC, the player's speech cutting Mara's reaction
        once the track played its first sentence: the track's count.
        """
        from rpmiddleware.webrtc.speech import TRACK_RATE

        rig = Rig({"garrick": GARRICK, "mara": TALE}, tokensPerSecond=10)
        link, track = trackLink(rig)
        nextLine = "Garrick, never mind her."
        rig.engine.options.audioTranscript = nextLine
        SceneInterruptionTests.openScene(self, rig, reactions=1)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text="Garrick, may I pass?")
        rig.until(lambda: rig.requests("mara") and track.turn >= 2)
        rig.until(lambda: track.played(track.turn) >= (FIRST_SECONDS + 0.1) * TRACK_RATE)
        self.assertIn("by the sea.", SceneInterruptionTests.maraReceived(self, rig))  # type: ignore[arg-type]
        rig.lines.update(mara="Hush.", garrick="As you wish.")
        playerSpeaks(self, rig, link, track)
        self.assertMaraHeardFirstSentence(rig, nextLine)

    def garrickToldWhole(self, rig: Rig, reactions: int) -> None:
        """
        A spoken scene: Garrick's line is complete as text (so Mara was
        told it whole) while its speech still streams.
        """
        SceneInterruptionTests.openScene(self, rig, reactions=reactions)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.engine.options.audioRealtime = True
        rig.say(type="text", text="Garrick, tell me a story.")
        rig.until(lambda: rig.sent("llm") and len(rig.sent("tts-chunk")) >= 2)
        self.assertEqual(rig.sent("reply-complete"), [], "the turn still plays")
        self.assertIn(("other", TALE, "complete"), self.heardOf(rig, "mara"))

    def heardOf(self, rig: Rig, characterId: str) -> list[tuple[str, str, str]]:
        """What C{characterId} remembers, with the lines it reacts to (still in flight)."""
        entries = rig.entries(characterId)
        turns = rig.memory._turns.values() if rig.memory is not None else []
        return entries + [
            (t.player[0], t.player[2], t.player[3])
            for t in turns
            if t.player is not None and t.key.characterId == characterId
        ]

    def test_listenerToldTheWholeLineIsCutWithItsSpeech(self) -> None:
        """
        Garrick's line was complete as text, so Mara (who hears him) was
        told it whole; the player cuts its speech with C{played} (the first
        sentence and a little more): Mara's entry is cut as his is.
        """
        rig = Rig({"garrick": TALE, "mara": "Hush."}, tokensPerSecond=10)
        self.garrickToldWhole(rig, reactions=0)
        nextLine = "Mara, never mind him."
        rig.say(type="text", text=nextLine, played={"ms": (FIRST_SECONDS + 0.1) * 1000})
        self.assertHeardFirstSentence(rig, nextLine, "garrick", "mara")

    def test_reactorToldTheWholeLineIsCutWithItsSpeech(self) -> None:
        """
        The same when Mara was asked to react to his whole line (her
        request, waiting, opens with it): her reaction is cancelled, and the
        line she remembers hearing is cut as his is.
        """
        rig = Rig({"garrick": TALE, "mara": "Hush."}, tokensPerSecond=10)
        self.garrickToldWhole(rig, reactions=1)
        rig.clock.advance(2 * LATENCY)
        self.assertTrue(rig.requests("mara"), "Mara's reaction was asked for")
        nextLine = "Mara, never mind him."
        rig.lines.update(mara="As you wish.", garrick="Fine.")
        rig.say(type="text", text=nextLine, played={"ms": (FIRST_SECONDS + 0.1) * 1000})
        self.assertHeardFirstSentence(rig, nextLine, "garrick", "mara")

    def test_listenerCutAfterCompletedToo(self) -> None:
        """
        A scene's turn of one line, completed upstream, cut by C{cancel}
        with C{played} while the client still plays it: Garrick's entry
        and Mara's (told whole) are cut to the first sentence.
        """
        rig = Rig({"garrick": TALE, "mara": "Hush."}, tokensPerSecond=None)
        SceneInterruptionTests.openScene(self, rig, reactions=0)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text="Garrick, tell me a story.")
        rig.until(lambda: rig.sent("reply-complete"))
        self.assertIn(("other", TALE, "complete"), rig.entries("mara"))
        rate = rig.sent("tts-chunk")[0]["sampleRate"]
        rig.say(type="cancel", played={"samples": int((FIRST_SECONDS + 0.1) * rate)})
        nextLine = "Mara, never mind him."
        rig.say(type="text", text=nextLine)
        self.assertHeardFirstSentence(rig, nextLine, "garrick", "mara")

    def test_listenerEntryNotTheNewestIsLeftWhole(self) -> None:
        """
        Mara heard something more after Garrick's whole line: a cut of his
        speech after that leaves her entry whole (and logs it); his own is cut.
        """
        rig = Rig({"garrick": TALE, "mara": "Hush."}, tokensPerSecond=None)
        SceneInterruptionTests.openScene(self, rig, reactions=0)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text="Garrick, tell me a story.")
        rig.until(lambda: rig.sent("reply-complete"))
        bell = heard(
            "rpmiddleware",
            "mara",
            "event",
            "",
            "The bell rang.",
            {"client": rig.connection.session.id},
        )
        rig.middleware.submit(bell)
        rate = rig.sent("tts-chunk")[0]["sampleRate"]
        rig.say(type="cancel", played={"samples": int((FIRST_SECONDS + 0.1) * rate)})
        rig.say(type="text", text="Mara, never mind him.")
        settle(rig.clock, 30)
        self.assertIn(("character", FIRST, "interrupted"), rig.entries("garrick"))
        self.assertIn(("other", TALE, "complete"), rig.entries("mara"))
        self.assertIn(("event", "The bell rang.", "complete"), rig.entries("mara"))

    # A scene's turn of several lines, each its own request: the played
    # amount is about the line that was playing; earlier lines stay whole,
    # later ones were not heard at all.

    def bothCompleted(self, rig: Rig, garrick: str, mara: str) -> None:
        """
        A spoken scene: Garrick answers the player and Mara reacts; both
        lines completed upstream (C{reply-complete}), remembered whole,
        while the player still hears them.
        """
        SceneInterruptionTests.openScene(self, rig, reactions=1)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text=PASS)
        rig.until(lambda: rig.sent("reply-complete"))
        self.assertEqual(len(rig.sent("reply-complete")[0]["lines"]), 2)
        self.assertEqual(
            rig.entries("garrick"),
            [
                ("player", PASS, "complete"),
                ("character", garrick, "complete"),
                ("other", mara, "complete"),
            ],
        )
        self.assertEqual(
            rig.entries("mara"),
            [
                ("player", f"(to Garrick) {PASS}", "complete"),
                ("other", garrick, "complete"),
                ("character", mara, "complete"),
            ],
        )

    def assertReactionHeardFirstSentence(self, rig: Rig, nextLine: str) -> None:
        """
        Garrick's line whole, Mara's reaction up to its first sentence, cut
        off, for both; the next line's request holds them so.
        """
        settle(rig.clock, 30)
        self.assertEqual(
            rig.entries("garrick")[:3],
            [
                ("player", PASS, "complete"),
                ("character", GARRICK, "complete"),
                ("other", FIRST, "interrupted"),
            ],
        )
        self.assertEqual(
            rig.entries("mara")[:3],
            [
                ("player", f"(to Garrick) {PASS}", "complete"),
                ("other", GARRICK, "complete"),
                ("character", FIRST, "interrupted"),
            ],
        )
        self.assertNextLineFollows(rig, 3, nextLine)
        self.assertEqual(
            list(rig.invocationFor(nextLine).history),
            [("user", PASS), ("assistant", GARRICK), ("user", f"Mara: {FIRST} —")],
        )

    def assertNextLineFollows(self, rig: Rig, at: int, nextLine: str) -> None:
        """
        The next exchange follows at once in both memories: Garrick's the
        player's line (typed, or a recording, remembered without words);
        Mara's the typed line she heard, or (a recording, whose words those
        who hear it are not told) Garrick's answer to it.
        """
        self.assertEqual(rig.entries("garrick")[at][0], "player")
        self.assertIn(
            rig.entries("mara")[at],
            [("player", f"(to Garrick) {nextLine}", "complete"), ("other", ANSWER, "complete")],
        )

    def assertFirstLineHeardFirstSentence(self, rig: Rig, nextLine: str) -> None:
        """
        Garrick's line up to its first sentence, cut off, for both; Mara's
        reaction to it in no one's memory; the next line's request holds it so.
        """
        settle(rig.clock, 30)
        self.assertEqual(
            rig.entries("garrick")[:2],
            [
                ("player", PASS, "complete"),
                ("character", FIRST, "interrupted"),
            ],
        )
        self.assertEqual(
            rig.entries("mara")[:2],
            [
                ("player", f"(to Garrick) {PASS}", "complete"),
                ("other", FIRST, "interrupted"),
            ],
        )
        self.assertNextLineFollows(rig, 2, nextLine)
        for characterId in ("garrick", "mara"):
            for _, text, _ in rig.entries(characterId):
                self.assertNotIn(REACTION, text, characterId)
                self.assertNotIn("by the sea", text, characterId)
        self.assertEqual(
            list(rig.invocationFor(nextLine).history),
            [("user", PASS), ("assistant", FIRST + " —")],
        )

    def test_reactionCutAfterBothLinesCompleted(self) -> None:
        """
        Both lines completed upstream; the player cuts Mara's reaction with
        C{cancel} C{played} (its first sentence and a little more, counted
        from its C{tts-start}), the next line sent at once: Mara's line is
        cut for her and for Garrick, who heard it; Garrick's stays whole.
        """
        rig = Rig({"garrick": GARRICK, "mara": TALE}, tokensPerSecond=None)
        self.bothCompleted(rig, GARRICK, TALE)
        rate = rig.sent("tts-chunk")[0]["sampleRate"]
        rig.lines.update(garrick=ANSWER, mara="Hush.")
        rig.say(type="cancel", played={"samples": int((FIRST_SECONDS + 0.1) * rate)})
        nextLine = "Garrick, never mind her."
        rig.say(type="text", text=nextLine)
        self.assertReactionHeardFirstSentence(rig, nextLine)

    def test_reactionCutAfterBothLinesCompletedOverWebRTC(self) -> None:
        """
        The same over WebRTC: the player speaks once the track played the
        first sentence of Mara's reaction (the track's count of that line).
        """
        from rpmiddleware.webrtc.speech import TRACK_RATE

        rig = Rig({"garrick": GARRICK, "mara": TALE}, tokensPerSecond=None)
        link, track = trackLink(rig)
        nextLine = "Garrick, never mind her."
        rig.engine.options.audioTranscript = nextLine
        self.bothCompleted(rig, GARRICK, TALE)
        rig.until(
            lambda: (
                track.sounding == track.turn == 2
                and track.played(2) >= (FIRST_SECONDS + 0.1) * TRACK_RATE
            )
        )
        self.assertGreater(track.queuedSeconds, 1, "most of her line still plays")
        rig.lines.update(garrick=ANSWER, mara="Hush.")
        playerSpeaks(self, rig, link, track)
        self.assertReactionHeardFirstSentence(rig, nextLine)

    def test_cutDuringTheFirstLineForgetsTheToldReaction(self) -> None:
        """
        Both lines completed upstream; the player cuts Garrick's line while
        it plays (C{played} with C{line: 0}), though Mara's reaction to it
        was already told to both: Garrick's line is cut for both, and her
        reaction, never heard, is in no one's memory.
        """
        rig = Rig({"garrick": TALE, "mara": REACTION}, tokensPerSecond=None)
        self.bothCompleted(rig, TALE, REACTION)
        rate = rig.sent("tts-chunk")[0]["sampleRate"]
        rig.lines.update(garrick=ANSWER, mara="Hush.")
        rig.say(type="cancel", played={"samples": int((FIRST_SECONDS + 0.1) * rate), "line": 0})
        nextLine = "Garrick, never mind her."
        rig.say(type="text", text=nextLine)
        self.assertFirstLineHeardFirstSentence(rig, nextLine)

    def test_cutDuringTheFirstLineWhileTheReactionStreams(self) -> None:
        """
        Over WebRTC, the turn still playing: Garrick's line completed
        upstream and its speech still sounds on the track while Mara's
        reaction streams (some of its speech already queued behind it); the
        player speaks once his first sentence was played.  Her request is
        cancelled, his line is cut for both (the track's count of his
        line), and nothing of hers is remembered.
        """
        from rpmiddleware.webrtc.speech import TRACK_RATE

        rig = Rig({"garrick": TALE, "mara": TALE.replace("story", "tale")}, tokensPerSecond=40)
        link, track = trackLink(rig)
        nextLine = "Garrick, never mind her."
        rig.engine.options.audioTranscript = nextLine
        SceneInterruptionTests.openScene(self, rig, reactions=1)  # type: ignore[arg-type]
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.say(type="text", text=PASS)
        rig.until(
            lambda: (
                track.turn >= 2
                and track.sounding == 1
                and track.played(1) >= (FIRST_SECONDS + 0.1) * TRACK_RATE
            )
        )
        self.assertEqual(rig.sent("reply-complete"), [], "the turn still plays")
        maraRequest = rig.requests("mara")[0]["requestId"]
        rig.lines.update(garrick=ANSWER, mara="Hush.")
        playerSpeaks(self, rig, link, track)
        rig.clock.advance(2 * LATENCY)
        cancels = [
            r["requestId"] for r in rig.engine.receivedMessages if r["type"] == "request.cancel"
        ]
        self.assertIn(maraRequest, cancels)
        self.assertFirstLineHeardFirstSentence(rig, nextLine)
        for characterId in ("garrick", "mara"):
            for _, text, _ in rig.entries(characterId):
                self.assertNotIn("tale", text, characterId)


PASS = "Garrick, may I pass?"
REACTION = "Let him pass, Garrick."
ANSWER = "As you wish."

OPEN_GATE = exampleAction(characters=["garrick"])
GUARD_LINE = 'Fine, I will open the north gate. [[open_gate {"gate": "north"}]] Stand back.'
SAID_LINE = "Fine, I will open the north gate.  Stand back."


class OrderTests(SynchronousTestCase):
    """
    Memory entries are in the order things happened to the character: an
    action's outcome after the line that called it, a refused call the
    same, a reaction after the line it answers.
    """

    def rig(self, garrick: str, reactions: int = 0) -> Rig:
        rig = Rig({"garrick": garrick, "mara": "About time, Garrick."})
        SceneInterruptionTests.openScene(self, rig, reactions=reactions)  # type: ignore[arg-type]
        # Spoken, so a turn plays on after its text is complete.
        rig.say(type="configure", output={"modalities": ["text", "audio"]})
        rig.engine.options.audioRealtime = True
        rig.say(type="actions", op="declare", actions=[OPEN_GATE])
        return rig

    def test_outcomeAnsweredWhileTheTurnPlaysFollowsTheLine(self) -> None:
        """
        The game answers tool-result the moment tool-call-start arrives,
        while the turn still plays: the outcome is remembered after
        Garrick's line, not before the player's.
        """
        rig = self.rig(GUARD_LINE)
        rig.say(type="text", text="Garrick, open the north gate, please.")
        rig.until(lambda: rig.sent("tool-call-start"))
        self.assertEqual(rig.sent("reply-complete"), [], "the turn still plays")
        callId = rig.sent("tool-call-start")[-1]["callId"]
        rig.say(type="tool-result", callId=callId, result={"open": True})
        settle(rig.clock, 30)
        self.assertEqual(
            [(role, text) for role, text, _ in rig.entries("garrick")],
            [
                ("player", "Garrick, open the north gate, please."),
                ("character", SAID_LINE),
                ("event", 'Garrick did open_gate {"gate": "north"}: {"open": true}'),
            ],
        )

    def test_refusedCallFollowsTheLine(self) -> None:
        rig = self.rig('[[open_gate {"gate": "west"}]] There.')
        rig.say(type="text", text="Garrick, open the west gate.")
        settle(rig.clock, 30)
        roles = [role for role, _, _ in rig.entries("garrick")]
        self.assertEqual(roles, ["player", "character", "event"])
        self.assertIn("but it was not done", rig.entries("garrick")[2][1])

    def test_reactionFollowsTheLineItAnswers(self) -> None:
        """
        Garrick's memory: the player's line, his own line, then Mara's
        reaction to it; Mara's: the player's line to Garrick, his line, hers.
        """
        rig = self.rig(GUARD_LINE, reactions=1)
        rig.say(type="text", text="Garrick, open the north gate, please.")
        rig.until(lambda: rig.sent("tool-call-start"))
        rig.say(type="tool-result", callId=rig.sent("tool-call-start")[-1]["callId"], result=None)
        settle(rig.clock, 30)
        self.assertEqual(
            [(role, text) for role, text, _ in rig.entries("garrick")],
            [
                ("player", "Garrick, open the north gate, please."),
                ("character", SAID_LINE),
                ("event", 'Garrick did open_gate {"gate": "north"}'),
                ("other", "About time, Garrick."),
            ],
        )
        self.assertEqual(
            [(role, text) for role, text, _ in rig.entries("mara")],
            [
                ("player", "(to Garrick) Garrick, open the north gate, please."),
                ("other", SAID_LINE),
                ("character", "About time, Garrick."),
            ],
        )


class TableTests(SynchronousTestCase):
    def test_everyRowOfTheTableIsATestHere(self) -> None:
        """
        docs/memory.md's table of interruptions names a test of this module
        on every row, and each exists.
        """
        text = (Path(__file__).resolve().parent.parent / "docs" / "memory.md").read_text("utf-8")
        section = text[text.index("## When a turn is interrupted") :]
        section = section[: section.index("\n## ")]
        rows = [line for line in section.splitlines() if line.startswith("| ") and "`test_" in line]
        self.assertGreaterEqual(len(rows), 9)
        names = {
            name
            for case in globals().values()
            if isinstance(case, type) and issubclass(case, SynchronousTestCase)
            for name in vars(case)
        }
        for row in rows:
            for name in re.findall(r"`(test_\w+)`", row):
                self.assertIn(name, names, row)
