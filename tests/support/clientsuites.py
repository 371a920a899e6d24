"""
The client end-to-end suites, run over two transports: by
C{tests/test_client_e2e.py} with RPEngine behind the WebSocket, and by
C{tests/test_mailbox_e2e.py} with it behind the file mailbox.  Each suite is
a test case that a test module subclasses, so that trial finds it there
(and only there): typed and recorded turns, interruptions, voice capture,
and clients sharing one RPEngine; and L{TurnCase}, what they assert with.
"""

from __future__ import annotations

import base64
import io
import wave
from collections import defaultdict
from typing import Any

from twisted.internet.defer import DeferredList, inlineCallbacks

from rpmiddleware.audio.format import exactLength
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.memorynet import runOnNetwork
from rpmiddleware.testing.simmailbox import spokenChunks
from rpmiddleware.testing.simoptions import defaultReplyText
from tests.support.client import (
    MemoryClientCase,
    nextMatching,
    opusBase64,
    pcmSamples,
    requestsOf,
    types,
    wavBase64,
    whenRouted,
)

STORY = "Once upon a time there was a ferry. "
SCENE = {
    "kind": "location",
    "family": "tavern",
    "label": "The Drowned Rat",
    "sceneLine": "A smoky tavern at dusk.",
    "priority": 1,
}
DIRECTIVE = {
    "protocolVersion": 1,
    "sceneContext": "Stay in the tavern.",
    "autoEventGuide": "React briefly.",
    "directUserGuide": "Be brief.",
}
#: RPEngine's listening state after a silent take (app.rs stt_completed).
RESTART_MESSAGE = "No speech was recognized; listening again."
RULES = {
    "mode": "buffered",
    "rules": [
        {
            "id": "mood",
            "matcher": {"type": "regex", "pattern": r"\s*\[mood:(\w+)\]"},
            "captureGroup": 1,
            "occurrence": "last",
            "remove": "match",
            "removeFrom": ["text", "audio"],
        }
    ],
}


def storyteller(request: dict[str, Any]) -> str:
    """
    A long reply for turns that ask for a story (so they are still playing
    when the test interrupts them), the default reply otherwise.
    """
    event = request.get("event") or {}
    if "story" in str(event.get("text", "")):
        return STORY * 150
    return defaultReplyText(request)


def expectedSamples(engine: Any, turnId: str, rate: int) -> int:
    """
    The samples a client at C{rate} should get for a turn: each sentence
    segment RPEngine spoke, converted exactly.
    """
    segments: dict[int, int] = defaultdict(int)
    for chunk in spokenChunks(engine, requestId=turnId):
        segments[chunk["segmentSequence"]] += len(base64.b64decode(chunk["data"])) // 2
    return sum(exactLength(n, 44100, rate) for n in segments.values())


class TurnCase(MemoryClientCase):
    def assertStreamedTurn(
        self, messages: list[dict[str, Any]], audio: bool = True, transcript: bool = True
    ) -> str:
        """
        The order a streamed turn promises; returns its turnId.  A typed
        turn starts with its transcript; a recorded one has none (RPEngine
        does not say what it heard in an event.audio).
        """
        kinds = types(messages)
        turnId = messages[0]["turnId"]
        self.assertTrue(all(m.get("turnId") == turnId for m in messages), kinds)
        if transcript:
            self.assertEqual(kinds[0], "transcript")
            self.assertTrue(messages[0]["isFinal"])
        else:
            self.assertNotIn("transcript", kinds)
        self.assertEqual(kinds[-1], "reply-complete")
        llm = kinds.index("llm")
        self.assertEqual(kinds.count("llm"), 1)
        self.assertEqual(messages[llm - 1]["type"], "llm-chunk")
        self.assertTrue(messages[llm - 1]["done"])
        self.assertNotIn("llm-chunk", kinds[llm:])
        chunks = [m for m in messages if m["type"] == "llm-chunk"]
        self.assertTrue(all(not m["done"] for m in chunks[:-1]))
        self.assertEqual("".join(m["content"] for m in chunks), messages[llm]["text"])
        self.assertEqual(messages[-1]["text"], messages[llm]["text"])
        if audio:
            self.assertEqual(kinds.count("tts-start"), 1)
            self.assertLess(kinds.index("tts-start"), kinds.index("tts-chunk"))
            last = len(kinds) - 1 - kinds[::-1].index("tts-chunk")
            self.assertEqual(kinds[last + 1 :], ["tts-complete", "reply-complete"])
            self.assertTrue(all(m["format"] == "pcm" for m in messages if m["type"] == "tts-chunk"))
        else:
            self.assertFalse({"tts-start", "tts-chunk", "tts-complete", "tts"} & set(kinds))
        self.assertEqual(
            set(kinds)
            - {"transcript", "llm-chunk", "llm", "tts-start", "tts-chunk", "tts-complete"},
            {"reply-complete"},
        )
        return str(turnId)


class VoiceAndTextTurns(TurnCase):
    @runOnNetwork
    def test_voiceTurn(self) -> Any:
        """
        A recorded turn: decoded here, converted to 16 kHz mono by the
        plugin, and the reply streamed back at 24 kHz, every message in order.
        """
        engine = yield self.engine()
        client = yield self.client()
        client.send({"type": "audio", "data": wavBase64(48000, 1.0, channels=2)})
        messages = yield self.turn(client)
        turnId = self.assertStreamedTurn(messages, transcript=False)
        self.assertIn("simulated transcript of 1.00 s of audio", messages[-1]["text"])
        [request] = requestsOf(engine)
        audio = request["event"]["audio"]
        self.assertEqual(
            (audio["format"], audio["sampleRate"], audio["channels"]), ("pcm_s16le", 16000, 1)
        )
        self.assertNotIn("text", request["event"])
        self.assertEqual(request["requestId"], turnId)
        self.assertEqual(request["characterId"], "mira")
        rates = {m["sampleRate"] for m in messages if m["type"] == "tts-chunk"}
        self.assertEqual(rates, {24000})
        self.assertEqual(pcmSamples(messages), expectedSamples(engine, turnId, 24000))
        self.assertEqual(
            messages[-1]["speech"], {"sampleRate": 24000, "samples": pcmSamples(messages)}
        )
        segments = {c["segmentSequence"] for c in spokenChunks(engine)}
        stats = messages[-1]["stats"]
        self.assertEqual(stats["audio"]["segmentCount"], len(segments))
        self.assertEqual(stats["audio"]["chunkCount"], len(spokenChunks(engine)))
        self.assertGreater(stats["text"]["tokenCount"], 0)
        self.assertEqual(messages[-1]["modalities"], ["text", "audio"])
        self.assertEqual(engine.processed[turnId], 1)

    @runOnNetwork
    def test_textTurn(self) -> Any:
        engine = yield self.engine()
        client = yield self.client()
        client.send({"type": "text", "text": "Where does the road go?"})
        messages = yield self.turn(client)
        turnId = self.assertStreamedTurn(messages)
        self.assertEqual(messages[0]["text"], "Where does the road go?")
        self.assertIn("Where does the road go", messages[-1]["text"])
        [request] = requestsOf(engine)
        self.assertEqual(request["event"], {"text": "Where does the road go?"})
        self.assertEqual(
            request["output"],
            {
                "modalities": ["text", "audio"],
                "language": "en",
                "audio": {"model": "gemtavern-supertonic-3", "voice": "F1", "format": "pcm_s16le"},
            },
        )
        self.assertEqual(pcmSamples(messages), expectedSamples(engine, turnId, 24000))

    @runOnNetwork
    def test_wavRatesInAndOut(self) -> Any:
        """
        WAV at 8, 22.05, 44.1 and 48 kHz and stereo in; speech at 24 and
        44.1 kHz out, the samples adding up to the reply's length at that rate.
        """
        engine = yield self.engine()
        client = yield self.client()
        recordings = [(8000, 1), (22050, 1), (44100, 1), (48000, 1), (44100, 2)]
        for out in (24000, 44100):
            client.send({"type": "configure", "output": {"sampleRate": out}})
            for rate, channels in recordings:
                client.send({"type": "audio", "data": wavBase64(rate, 0.5, channels)})
                messages = yield self.turn(client)
                turnId = self.assertStreamedTurn(messages, transcript=False)
                self.assertIn("simulated transcript of 0.50 s of audio", messages[-1]["text"])
                chunks = [m for m in messages if m["type"] == "tts-chunk"]
                self.assertEqual({c["sampleRate"] for c in chunks}, {out})
                self.assertEqual(pcmSamples(messages), expectedSamples(engine, turnId, out))
        audio = [r["event"]["audio"] for r in requestsOf(engine)]
        self.assertEqual(len(audio), 10)
        self.assertEqual({(a["sampleRate"], a["channels"]) for a in audio}, {(16000, 1)})
        # At 44.1 kHz the plugin converts nothing: the samples are RPEngine's own.
        last = requestsOf(engine)[-1]["requestId"]
        spoken = sum(
            len(base64.b64decode(c["data"])) // 2 for c in spokenChunks(engine, requestId=last)
        )
        self.assertEqual(expectedSamples(engine, last, 44100), spoken)

    @runOnNetwork
    def test_opus(self) -> Any:
        """
        WebM/Opus and Ogg/Opus recordings, as browsers' MediaRecorder makes them.
        """
        engine = yield self.engine()
        client = yield self.client()
        for container in ("webm", "ogg"):
            client.send({"type": "audio", "data": opusBase64(container, 1.0)})
            messages = yield self.turn(client)
            self.assertStreamedTurn(messages, transcript=False)
            self.assertIn("simulated transcript of 1.00 s of audio", messages[-1]["text"])
        self.assertEqual(len(requestsOf(engine)), 2)

    @runOnNetwork
    def test_nonStreaming(self) -> Any:
        engine = yield self.engine()
        client = yield self.client()
        client.send({"type": "configure", "output": {"streaming": False, "sampleRate": 16000}})
        client.send({"type": "text", "text": "One WAV, please."})
        messages = yield self.turn(client)
        kinds = types(messages)
        self.assertFalse({"tts-start", "tts-chunk"} & set(kinds))
        self.assertEqual(kinds[-3:], ["tts", "tts-complete", "reply-complete"])
        tts = messages[-3]
        self.assertEqual((tts["format"], tts["sampleRate"]), ("wav", 16000))
        with wave.open(io.BytesIO(base64.b64decode(tts["data"]))) as reader:
            self.assertEqual(reader.getframerate(), 16000)
            self.assertEqual((reader.getnchannels(), reader.getsampwidth()), (1, 2))
            self.assertEqual(reader.getnframes(), expectedSamples(engine, tts["turnId"], 16000))

    @runOnNetwork
    def test_textOnly(self) -> Any:
        engine = yield self.engine()
        client = yield self.client()
        client.send(
            {
                "type": "configure",
                "output": {"modalities": ["text"], "language": "de"},
                "player": {"displayName": "Ada"},
                "interactionMode": "direct_user",
                "promptScene": SCENE,
                "promptDirective": DIRECTIVE,
            }
        )
        client.send({"type": "text", "text": "Hallo"})
        messages = yield self.turn(client)
        self.assertStreamedTurn(messages, audio=False)
        self.assertIn("Ada", messages[-1]["text"])
        self.assertEqual(messages[-1]["modalities"], ["text"])
        self.assertNotIn("audio", messages[-1]["stats"])
        [request] = requestsOf(engine)
        self.assertEqual(request["output"], {"modalities": ["text"], "language": "de"})
        self.assertEqual(request["player"], {"displayName": "Ada"})
        self.assertEqual(request["interactionMode"], "direct_user")
        self.assertEqual(request["promptScene"], SCENE)
        self.assertEqual(request["promptDirective"], DIRECTIVE)

    @runOnNetwork
    def test_responseProcessing(self) -> Any:
        """
        Buffered response processing: no streamed text, the whole text and
        what the rules extracted on llm and reply-complete.
        """
        engine = yield self.engine(replyText=lambda request: "Aye. [mood:wry] Off you go.")
        client = yield self.client()
        client.send({"type": "configure", "output": {"responseProcessing": RULES}})
        client.send({"type": "text", "text": "Well?"})
        messages = yield self.turn(client)
        chunks = [m for m in messages if m["type"] == "llm-chunk"]
        self.assertEqual([(c["content"], c["done"]) for c in chunks], [("", True)])
        [llm] = [m for m in messages if m["type"] == "llm"]
        self.assertEqual(llm["extractedContent"], {"mood": ["wry"]})
        self.assertNotIn("[mood", llm["text"])
        self.assertEqual(messages[-1]["extractedContent"], {"mood": ["wry"]})
        self.assertEqual(messages[-1]["text"], llm["text"])
        [request] = requestsOf(engine)
        self.assertEqual(request["output"]["responseProcessing"], RULES)


class Interruptions(TurnCase):
    @inlineCallbacks
    def storyStarted(self, client: Any) -> Any:
        client.send({"type": "text", "text": "Tell me a long story"})
        first = yield client.nextOfType("llm-chunk")
        return first["turnId"]

    @runOnNetwork
    def test_bargeIn(self) -> Any:
        """
        A new turn while one plays cancels it first: tts-cancelled for the
        old turn before anything of the new one, and nothing of the old one
        after.
        """
        engine = yield self.engine(tokensPerSecond=200.0, replyText=storyteller)
        client = yield self.client()
        old = yield self.storyStarted(client)
        client.send({"type": "text", "text": "Wait, what?"})
        messages = yield self.turn(client, "reply-complete")
        kinds = types(messages)
        cancelled = messages.index(
            {
                "type": "tts-cancelled",
                "turnId": old,
                "reason": "interrupted by a new turn (barge-in)",
            }
        )
        new = [m for m in messages if m.get("turnId") != old]
        self.assertEqual(
            new[0],
            {
                "type": "transcript",
                "text": "Wait, what?",
                "isFinal": True,
                "turnId": new[0]["turnId"],
            },
        )
        self.assertLess(cancelled, messages.index(new[0]))
        self.assertTrue(all(m.get("turnId") != old for m in messages[cancelled + 1 :]))
        self.assertStreamedTurn(new)
        self.assertEqual(kinds[-1], "reply-complete")
        self.assertIn(old, engine.cancelled)
        self.assertEqual(engine.completed, [new[0]["turnId"]])

    @runOnNetwork
    def test_noBargeInQueues(self) -> Any:
        """
        With barge-in off, the new turn waits for the one playing to finish.
        """
        engine = yield self.engine(tokensPerSecond=500.0)
        client = yield self.client()
        client.send({"type": "configure", "bargeIn": False})
        client.send({"type": "text", "text": "First"})
        first = yield client.nextOfType("llm-chunk")
        client.send({"type": "text", "text": "Second"})
        messages = yield self.turn(client, "reply-complete")
        self.assertTrue(all(m["turnId"] == first["turnId"] for m in messages))
        second = yield self.turn(client, "reply-complete")
        self.assertStreamedTurn(second)
        self.assertEqual(second[0]["text"], "Second")
        self.assertEqual(engine.cancelled, [])
        self.assertEqual(len(engine.completed), 2)

    @runOnNetwork
    def test_cancel(self) -> Any:
        engine = yield self.engine(tokensPerSecond=200.0, replyText=storyteller)
        client = yield self.client()
        old = yield self.storyStarted(client)
        upstream = whenRouted(self.middleware, "reply.cancelled", old)
        client.send({"type": "cancel"})
        client.send({"type": "ping", "timestamp": 7})
        messages = yield self.turn(client, "pong")
        cancelled = messages.index({"type": "tts-cancelled", "turnId": old})
        self.assertEqual(types(messages[cancelled + 1 :]), ["pong"])
        yield upstream
        self.assertIn(old, engine.cancelled)
        # The next turn is unaffected.
        client.send({"type": "text", "text": "Hello again"})
        again = yield self.turn(client)
        self.assertStreamedTurn(again)

    @runOnNetwork
    def test_cancelWithNothingPlaying(self) -> Any:
        yield self.engine()
        client = yield self.client()
        client.send({"type": "cancel"})
        client.send({"type": "ping", "timestamp": 1})
        self.assertEqual((yield client.next()), {"type": "pong", "timestamp": 1})

    @runOnNetwork
    def test_disconnectCancelsUpstream(self) -> Any:
        engine = yield self.engine(tokensPerSecond=200.0, replyText=storyteller)
        client = yield self.client()
        old = yield self.storyStarted(client)
        upstream = whenRouted(self.middleware, "reply.cancelled", old)
        client.drop()
        yield upstream
        self.assertIn(old, engine.cancelled)


class VoiceCapture(TurnCase):
    @runOnNetwork
    def test_capture(self) -> Any:
        """
        voice-capture start: RPEngine's microphone states as voice-state,
        speech_started and speech_ended as speech-start and speech-end, its
        levels as voice-level, what it heard as transcript, then the reply.
        """
        engine = yield self.engine(captureSpeechSeconds=1.0)
        client = yield self.client()
        client.send({"type": "voice-capture", "action": "start"})
        messages = yield self.turn(client)
        kinds = types(messages)
        self.assertEqual(
            [m["state"] for m in messages if m["type"] == "voice-state"],
            ["listening", "speech_started", "speech_ended"],
        )
        start, end = kinds.index("speech-start"), kinds.index("speech-end")
        self.assertEqual(kinds[start - 1], "voice-state")
        self.assertEqual(kinds[end - 1], "voice-state")
        levels = [m for m in messages if m["type"] == "voice-level"]
        self.assertTrue(levels)
        self.assertTrue(all({"peak", "rms", "seconds", "level"} <= set(m) for m in levels))
        self.assertTrue(all(m["level"] == m["peak"] for m in levels))
        self.assertLess(max(i for i, k in enumerate(kinds) if k == "voice-level"), end)
        self.assertStreamedTurn(messages[end + 1 :])
        transcript = messages[end + 1]
        self.assertEqual(transcript["type"], "transcript")
        self.assertIn(transcript["text"], messages[-1]["text"])
        [request] = requestsOf(engine, "voice.capture.start")
        self.assertIs(request["returnTranscript"], True)
        self.assertEqual(request["silenceBehavior"], "error")

    @runOnNetwork
    def test_silenceRestarts(self) -> Any:
        """
        With silenceBehavior "restart", a take with no words is followed by
        listening again, and the next take is the turn.
        """
        from rpmiddleware.testing.simoptions import PlayerTake

        yield self.engine(
            captureTakes=[PlayerTake(transcript=""), PlayerTake(transcript="Open the gate.")]
        )
        client = yield self.client()
        client.send({"type": "voice-capture", "action": "start", "silenceBehavior": "restart"})
        messages = yield self.turn(client)
        states = [m["state"] for m in messages if m["type"] == "voice-state"]
        # RPEngine says listening again, then the new window reports it too.
        self.assertEqual(
            [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]],
            ["listening", "speech_started", "speech_ended"] * 2,
        )
        restarted = [m for m in messages if m.get("message") == RESTART_MESSAGE]
        self.assertEqual(len(restarted), 1)
        self.assertEqual(types(messages).count("speech-end"), 2)
        [transcript] = [m for m in messages if m["type"] == "transcript"]
        self.assertEqual(transcript["text"], "Open the gate.")
        self.assertEqual(types(messages)[-1], "reply-complete")

    @runOnNetwork
    def test_silenceFails(self) -> Any:
        from rpmiddleware.testing.simoptions import PlayerTake

        yield self.engine(captureTakes=[PlayerTake(transcript="")])
        client = yield self.client()
        client.send({"type": "voice-capture", "action": "start"})
        messages = yield self.turn(client)
        self.assertNotIn("transcript", types(messages))
        error = messages[-2]
        self.assertEqual(
            (error["code"], error["engineCode"], error["retryable"]),
            ("STT_ERROR", "empty_speech", False),
        )
        self.assertEqual(types(messages)[-1], "tts-cancelled")

    @runOnNetwork
    def test_stopAndCancel(self) -> Any:
        engine = yield self.engine(captureSpeechSeconds=60.0)
        client = yield self.client()
        client.send({"type": "voice-capture", "action": "start"})
        yield client.nextOfType("speech-start")
        client.send({"type": "voice-capture", "action": "stop"})
        messages = yield self.turn(client)
        kinds = [k for k in types(messages) if k != "voice-level"]
        self.assertEqual(kinds[:2], ["speech-end", "transcript"])
        self.assertEqual(kinds[-1], "reply-complete")
        client.send({"type": "voice-capture", "action": "start"})
        started = yield client.nextOfType("speech-start")
        upstream = whenRouted(self.middleware, "reply.cancelled", started["turnId"])
        client.send({"type": "voice-capture", "action": "cancel"})
        cancelled = yield client.nextOfType("tts-cancelled")
        self.assertEqual(cancelled["turnId"], started["turnId"])
        yield upstream
        self.assertEqual(len(requestsOf(engine, "voice.capture.cancel")), 1)
        self.assertEqual(len(requestsOf(engine, "voice.capture.stop")), 1)

    @runOnNetwork
    def test_reportWithoutRequestId(self) -> Any:
        """
        A microphone report without a requestId reaches the one client
        whose capture is in progress.
        """
        yield self.engine(captureSpeechSeconds=60.0)
        bystander = yield self.client()
        client = yield self.client()
        client.send({"type": "voice-capture", "action": "start"})
        started = yield client.nextOfType("speech-start")
        self.middleware.router.deliver(Envelope.build("voice.capture.level", level=0.75))
        level = yield nextMatching(client, lambda m: m.get("level") == 0.75)
        self.assertEqual(level, {"type": "voice-level", "level": 0.75, "turnId": started["turnId"]})
        bystander.send({"type": "ping", "timestamp": 1})
        self.assertEqual((yield bystander.nextOfType("pong", "voice-level"))["type"], "pong")

    @runOnNetwork
    def test_nothingToStop(self) -> Any:
        yield self.engine()
        client = yield self.client()
        for action in ("stop", "cancel"):
            client.send({"type": "voice-capture", "action": action})
            error = yield client.next()
            self.assertEqual(error["code"], "INVALID_MESSAGE")
            self.assertIn("no voice capture is in progress", error["message"])

    @runOnNetwork
    def test_microphoneOff(self) -> Any:
        yield self.engine(microphoneEnabled=False)
        client = yield self.client()
        client.send({"type": "voice-capture", "action": "start"})
        error = yield client.nextOfType("error")
        self.assertEqual(
            (error["code"], error["engineCode"], error["retryable"]),
            ("VAD_ERROR", "microphone_not_enabled", False),
        )


class Sharing(TurnCase):
    @runOnNetwork
    def test_twoClients(self) -> Any:
        """
        Two clients' turns share one RPEngine; each hears only its own reply.
        """
        engine = yield self.engine(concurrency=2)
        alice = yield self.client()
        bob = yield self.client()
        alice.send({"type": "text", "text": "I am Alice"})
        bob.send({"type": "audio", "data": wavBase64(16000, 0.25)})
        results = yield DeferredList([self.turn(alice), self.turn(bob)], fireOnOneErrback=True)
        a, b = (r[1] for r in results)
        aliceTurn = self.assertStreamedTurn(a)
        bobTurn = self.assertStreamedTurn(b, transcript=False)
        self.assertNotEqual(aliceTurn, bobTurn)
        self.assertIn("I am Alice", a[-1]["text"])
        self.assertIn("0.25 s of audio", b[-1]["text"])
        self.assertNotIn("Alice", b[-1]["text"])
        self.assertEqual(dict(engine.processed), {aliceTurn: 1, bobTurn: 1})
        self.assertEqual(pcmSamples(a), expectedSamples(engine, aliceTurn, 24000))
        self.assertEqual(pcmSamples(b), expectedSamples(engine, bobTurn, 24000))

    @runOnNetwork
    def test_engineLossAndRecovery(self) -> Any:
        """
        RPEngine drops mid-turn: that turn ends with a retryable error and
        tts-cancelled; a turn asked while none is connected waits, is told
        why, and is sent once when RPEngine is back.
        """
        engine = yield self.engine(tokensPerSecond=200.0, replyText=storyteller)
        alice = yield self.client()
        bob = yield self.client()
        alice.send({"type": "text", "text": "Tell me a story"})
        first = yield alice.nextOfType("llm-chunk")
        lost = first["turnId"]
        engine.disconnect()
        yield engine.closed
        messages = yield self.turn(alice)
        self.assertEqual(types(messages)[-2:], ["error", "tts-cancelled"])
        error = messages[-2]
        self.assertEqual(
            (error["code"], error["engineCode"], error["retryable"], error["turnId"]),
            ("LLM_ERROR", "engine_disconnected", True, lost),
        )
        capacity = yield nextMatching(
            bob, lambda m: m["type"] == "capacity" and not m["engineConnected"]
        )
        self.assertIn(f"https://rpengine.gemtavern.com/#port={self.live.port}", capacity["message"])
        bob.send({"type": "text", "text": "Anyone there?"})
        echo = yield bob.nextOfType("transcript")
        self.assertEqual(echo["text"], "Anyone there?")
        waiting = yield bob.next()
        self.assertEqual(waiting["type"], "capacity")
        self.assertFalse(waiting["engineConnected"])
        self.assertTrue(waiting["message"].startswith("Your turn waits for RPEngine."))
        carol = yield self.client()
        carol.send({"type": "audio", "data": wavBase64(22050, 0.5)})
        heard = yield carol.nextOfType("capacity")
        self.assertTrue(heard["message"].startswith("Your turn waits for RPEngine."))
        again = yield self.engine()
        results = yield DeferredList([self.turn(bob), self.turn(carol)], fireOnOneErrback=True)
        bobs, carols = (r[1] for r in results)
        self.assertIn("Anyone there", bobs[-1]["text"])
        self.assertIn("0.50 s of audio", carols[-1]["text"])
        waited = [bobs[0]["turnId"], carols[0]["turnId"]]
        self.assertEqual(dict(engine.processed), {lost: 1})
        self.assertEqual(dict(again.processed), {waited[0]: 1, waited[1]: 1})
        self.assertEqual(sorted(r["requestId"] for r in requestsOf(again)), sorted(waited))

    @runOnNetwork
    def test_engineRefusals(self) -> Any:
        """
        RPEngine's refusal reaches the client mapped, with RPEngine's
        retryable (false for service_not_started).  (With the service
        stopped from the start, capacity says so and the capacity gate holds
        the turn instead; here it stops after connecting.)
        """
        engine = yield self.engine()
        client = yield self.client()
        engine.options.serviceStarted = False
        client.send({"type": "text", "text": "Hello"})
        error = yield client.nextOfType("error")
        self.assertEqual(
            (error["code"], error["engineCode"], error["retryable"]),
            ("LLM_ERROR", "service_not_started", False),
        )
