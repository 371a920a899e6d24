"""
WebRTC end to end: aiortc as the voice client against the client endpoint
with the simulated RPEngine, over loopback.

The client offers its data channel, then its microphone (renegotiation, as
the LLMRTC web client does); speaks a speech-like recording; the server's
detector sends speech-start and speech-end where the speech was, the
utterance reaches RPEngine as one 16 kHz mono turn, and the reply comes
back as messages (on the data channel and the WebSocket) and as sound on
the speech track, with the right number of samples.  Speaking over the
reply cancels it.

Runs on the asyncio reactor (in a child process from the default suite;
see L{tests.support.webrtc}).
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Coroutine
from typing import Any

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.audio.format import exactLength
from tests.support.client import LiveClientCase, requestsOf
from tests.support.webrtc import TOP, AsyncioTestCase, inChildProcess

#: What a streamed voice turn says on the data channel (besides llm-chunk).
#: (No transcript: RPEngine does not say what it heard in an event.audio.)
TURN = [
    "speech-start",
    "speech-end",
    "llm",
    "tts-start",
    "tts-complete",
    "reply-complete",
]
#: The orders the protocol promises (text and speech stream concurrently,
#: so llm and tts-start may come either way round).
BEFORE = [
    ("speech-start", "speech-end"),
    ("speech-end", "llm"),
    ("speech-end", "tts-start"),
    ("tts-start", "tts-complete"),
    ("llm", "reply-complete"),
    ("tts-complete", "reply-complete"),
]


def spoken(engine: Any, turnId: str, rate: int = 48000) -> int:
    """
    The samples RPEngine spoke for a turn, at C{rate}, segment by segment.
    """
    segments: dict[int, int] = defaultdict(int)
    for chunk in engine.sentOfType("reply.audio.chunk", requestId=turnId):
        segments[chunk["segmentSequence"]] += len(base64.b64decode(chunk["data"])) // 2
    return sum(exactLength(n, 44100, rate) for n in segments.values())


class WebRTCTurnTests(AsyncioTestCase, LiveClientCase):
    timeout = 60

    def setUp(self) -> None:
        AsyncioTestCase.setUp(self)
        LiveClientCase.setUp(self)

    def run_(self, coro: Coroutine[Any, Any, Any]) -> Deferred[Any]:
        from rpmiddleware.webrtc.bridge import deferredFromCoroutine

        return deferredFromCoroutine(coro, self.loop)

    def wait(self, d: Deferred[Any]) -> Any:
        from rpmiddleware.webrtc.bridge import awaitable

        return awaitable(d, self.loop)

    async def nextOnSocket(self, ws: Any, *types: str, timeout: float = 10.0) -> dict[str, Any]:
        return await asyncio.wait_for(self.wait(ws.nextOfType(*types)), timeout)

    async def connect(self, **engineOptions: Any) -> tuple[Any, Any, Any]:
        """
        RPEngine, a WebSocket client with a character, and its peer with an
        open data channel (no microphone yet).
        """
        from rpmiddleware.testing.webrtc import ClientPeer

        engineOptions.setdefault("secondsPerCharacter", 0.01)
        engine = await self.wait(self.engine(**engineOptions))
        ws = await self.wait(self.client())
        peer = ClientPeer()
        self.addCleanup(lambda: self.run_(peer.close()))
        await peer.negotiate(lambda offer: self.exchange(ws, offer))
        await asyncio.wait_for(peer.opened, 10)
        return engine, ws, peer

    async def exchange(self, ws: Any, offer: dict[str, str]) -> dict[str, str]:
        ws.send({"type": "offer", "signal": offer})
        message = await self.nextOnSocket(ws, "signal", "error")
        self.assertEqual(message["type"], "signal", message)
        answer: dict[str, str] = message["signal"]
        return answer

    async def speak(self, ws: Any, peer: Any, recording: Any) -> Any:
        """
        Add a microphone playing C{recording} (renegotiating); returns the track.
        """
        from rpmiddleware.testing.webrtc import PcmTrack

        microphone = PcmTrack(recording.pcm(48000), rate=48000)
        peer.addMicrophone(microphone)
        await peer.negotiate(lambda offer: self.exchange(ws, offer))
        return microphone

    def voiceOf(self) -> Any:
        [connection] = [p.connection for p in self.factory.connections]
        return connection.voice

    async def turnMessages(self, peer: Any, end: str = "reply-complete") -> list[dict[str, Any]]:
        seen = []
        while True:
            message = await peer.nextOfType(
                *TURN, "llm-chunk", "tts-cancelled", "error", "tts-chunk"
            )
            seen.append(message)
            if message["type"] in (end, "error"):
                return seen

    def test_voiceTurn(self) -> Deferred[Any]:
        from rpmiddleware.testing.webrtc import conversation

        recording = conversation(speech=0.8, before=0.4, after=1.0)

        async def go() -> None:
            engine, ws, peer = await self.connect()
            await self.speak(ws, peer, recording)
            listener = await asyncio.wait_for(peer.trackArrived, 10)
            messages = await self.turnMessages(peer)
            kinds = [m["type"] for m in messages if m["type"] != "llm-chunk"]
            self.assertEqual(sorted(kinds), sorted(TURN))
            for first, then in BEFORE:
                self.assertLess(kinds.index(first), kinds.index(then), kinds)
            self.assertNotIn("tts-chunk", [m["type"] for m in messages])
            # The turn reached RPEngine as one 16 kHz mono recording of the
            # utterance: the speech with its pre-roll and trail.
            [request] = requestsOf(engine)
            audio = request["event"]["audio"]
            self.assertEqual(
                (audio["format"], audio["sampleRate"], audio["channels"]), ("pcm_s16le", 16000, 1)
            )
            seconds = len(base64.b64decode(audio["data"])) / 32000
            self.assertTrue(0.8 <= seconds <= 0.8 + 0.2 + 0.1 + 0.25, seconds)
            turnId = messages[2]["turnId"]
            self.assertEqual(request["requestId"], turnId)
            # Every sample RPEngine spoke went on the track, at 48 kHz.
            speech = self.voiceOf().peer.speech
            expected = spoken(engine, turnId)
            self.assertGreater(expected, 0)
            self.assertEqual(messages[-1]["speech"], {"sampleRate": 48000, "samples": expected})
            await asyncio.wait_for(listener.soundHeard.wait(), 10)
            for _ in range(250):
                if not speech.playing:
                    break
                await asyncio.sleep(0.02)
            self.assertEqual(speech.speechSamples, expected)
            await asyncio.sleep(0.3)
            # The client heard about that much sound (Opus smears the edges;
            # tone fades and sentence gaps are quiet).
            heard = listener.soundSamples / 48000
            self.assertTrue(0.8 * expected / 48000 <= heard <= expected / 48000 + 0.1, heard)
            # The WebSocket carried the same payload messages.
            onSocket = await self.nextOnSocket(ws, "speech-start")
            self.assertEqual(onSocket, {"type": "speech-start"})

        return self.run_(go())

    def test_bargeIn(self) -> Deferred[Any]:
        """
        Speaking while the character talks cancels its reply upstream, says
        tts-cancelled, silences the track at once, and the new speech is
        the next turn.
        """
        from rpmiddleware.testing.webrtc import Recording, conversation

        def longReply(request: dict[str, Any]) -> str:
            return "This reply goes on for a long while. " * 20

        async def go() -> None:
            # RPEngine speaks sentence by sentence as it generates (paced):
            # the reply is still going upstream when the player interrupts.
            engine, ws, peer = await self.connect(replyText=longReply, audioRealtime=True)
            microphone = await self.speak(ws, peer, conversation(speech=0.6, before=0.3))
            listener = await asyncio.wait_for(peer.trackArrived, 10)
            await peer.nextOfType("tts-start")
            await asyncio.wait_for(listener.soundHeard.wait(), 10)
            speech = self.voiceOf().peer.speech
            self.assertTrue(speech.playing)
            first = requestsOf(engine)[0]["requestId"]
            microphone.say(Recording([("speech", 0.6), ("silence", 1.0)]).pcm(48000))
            cancelled = await peer.nextOfType("tts-cancelled", "speech-start")
            self.assertEqual(cancelled["type"], "tts-cancelled")
            self.assertEqual(cancelled["turnId"], first)
            self.assertFalse(speech.playing)
            self.assertGreater(speech.droppedSamples, 0)
            await peer.nextOfType("speech-start")
            cancels = requestsOf(engine, "request.cancel")
            self.assertEqual([c["requestId"] for c in cancels], [first])
            await peer.nextOfType("speech-end")
            reply = await peer.nextOfType("llm-chunk")
            self.assertNotEqual(reply["turnId"], first)

        return self.run_(go())

    def test_dataChannelMessagesAreClientMessages(self) -> Deferred[Any]:
        """
        A text turn and a malformed message sent on the data channel are
        handled like WebSocket ones; replies come back on both.  A ping on
        the data channel is answered there (and only there); one on the
        WebSocket, on the WebSocket.
        """

        async def go() -> None:
            engine, ws, peer = await self.connect()
            peer.send({"type": "ping", "timestamp": 5})
            peer.send({"type": "nonsense"})
            pong = await peer.nextOfType("pong")
            self.assertEqual(pong, {"type": "pong", "timestamp": 5})
            error = await peer.nextOfType("error")
            self.assertEqual(error["code"], "INVALID_MESSAGE")
            ws.send({"type": "ping", "timestamp": 6})
            pong = await self.nextOnSocket(ws, "pong")
            self.assertEqual(pong["timestamp"], 6)  # not 5: that one went on the channel
            self.assertEqual([m["timestamp"] for m in peer.received if m["type"] == "pong"], [5])
            peer.send({"type": "text", "text": "Hello there"})
            transcript = await peer.nextOfType("transcript")
            self.assertEqual(transcript["text"], "Hello there")
            done = await peer.nextOfType("reply-complete")
            # No speech track negotiated: the audio came as tts-chunk messages.
            self.assertGreater(done["speech"]["samples"], 0)
            self.assertIn("tts-chunk", [m["type"] for m in peer.received])
            self.assertEqual(len(requestsOf(engine)), 1)

        return self.run_(go())

    def test_closingTheSocketClosesThePeer(self) -> Deferred[Any]:
        async def go() -> None:
            engine, ws, peer = await self.connect()
            voice = self.voiceOf()
            ws.drop()
            for _ in range(250):
                if voice.peer.closed and peer.pc.connectionState == "closed":
                    break
                await asyncio.sleep(0.02)
            self.assertTrue(voice.peer.closed)
            self.assertFalse(self.factory.endpoint.answerOffer.__self__.links)

        return self.run_(go())

    def test_bargeInAfterTheReplyEndedUpstream(self) -> Deferred[Any]:
        """
        A reply RPEngine has finished sending but the track still plays is
        silenced too, with tts-cancelled for its turn; nothing to cancel upstream.
        """
        from rpmiddleware.testing.webrtc import Recording, conversation

        def longReply(request: dict[str, Any]) -> str:
            return "This reply goes on for a long while. " * 10

        async def go() -> None:
            engine, ws, peer = await self.connect(replyText=longReply)
            microphone = await self.speak(ws, peer, conversation(speech=0.6, before=0.3))
            listener = await asyncio.wait_for(peer.trackArrived, 10)
            done = await peer.nextOfType("reply-complete")
            await asyncio.wait_for(listener.soundHeard.wait(), 10)
            speech = self.voiceOf().peer.speech
            self.assertTrue(speech.playing)
            microphone.say(Recording([("speech", 0.6), ("silence", 1.0)]).pcm(48000))
            cancelled = await peer.nextOfType("tts-cancelled", "speech-start")
            self.assertEqual(cancelled["type"], "tts-cancelled")
            self.assertEqual(cancelled["turnId"], done["turnId"])
            self.assertFalse(speech.playing)
            await peer.nextOfType("speech-start")
            self.assertEqual(requestsOf(engine, "request.cancel"), [])

        return self.run_(go())


class UnavailableTests(LiveClientCase):
    """
    Without WebRTC (the extra missing, or a reactor other than asyncio, as
    trial's default), an offer is answered with WEBRTC_UNAVAILABLE saying
    why and what to do, and the session goes on.
    """

    def test_offerRefused(self) -> Deferred[Any]:
        from tests.support.webrtc import missingExtra, onAsyncio

        missing = missingExtra()
        if missing is None and onAsyncio():
            self.skipTest("WebRTC is available here (the extra, on the asyncio reactor)")

        async def go() -> None:
            ws = await Deferred.fromCoroutine(self._client())
            ws.send({"type": "offer", "signal": {"type": "offer", "sdp": "v=0\r\n"}})
            error = await ws.nextOfType("error")
            self.assertEqual(error["code"], "WEBRTC_UNAVAILABLE")
            if missing is not None:
                self.assertIn('pip install "rpmiddleware[webrtc]"', error["message"])
            else:
                self.assertIn("--reactor=asyncio", error["message"])
            ws.send({"type": "ping", "timestamp": 1})
            pong = await ws.nextOfType("pong")
            self.assertEqual(pong["timestamp"], 1)
            ws.send({"type": "text", "text": "Still here?"})
            done = await ws.nextOfType("reply-complete")
            self.assertIn("Still here", done["text"])

        return Deferred.fromCoroutine(go())

    async def _client(self) -> Any:
        await self.engine()
        return await self.client()


class WithoutTheExtraTests(SynchronousTestCase):
    def test_clientEndpointWithoutTheExtra(self) -> None:
        """
        The client endpoint's tests and UnavailableTests pass in a child
        process where aiortc and webrtcvad cannot be imported.
        """
        code = (
            "import sys\n"
            "sys.modules['aiortc'] = None\n"
            "sys.modules['webrtcvad'] = None\n"
            "from twisted.scripts.trial import run\n"
            "sys.argv = ['trial', '--temp-directory=' + sys.argv[1],\n"
            "            'tests.test_webrtc_endpoint.UnavailableTests', 'tests.test_client_e2e']\n"
            "run()\n"
        )
        with tempfile.TemporaryDirectory(prefix="webrtc-missing-") as temp:
            result = subprocess.run(
                [sys.executable, "-c", code, os.path.join(temp, "_trial_temp")],
                cwd=TOP,
                capture_output=True,
                text=True,
                timeout=240,
            )
        report = (result.stdout + result.stderr)[-5000:]
        self.assertEqual(result.returncode, 0, report)
        self.assertIn("PASSED", result.stdout, report)


WebRTCTurnTestsInChild = inChildProcess(__name__, "WebRTCTurnTests")
