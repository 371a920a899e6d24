"""
The server's peer connection against aiortc as the client, over loopback:
answers and renegotiation, loopback-only candidates, the data channel both
ways, the microphone track as 16 kHz PCM, the speech track back, closing.

Runs on the asyncio reactor (in a child process from the default suite;
see L{tests.support.webrtc}).
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

from twisted.internet.defer import Deferred

from tests.support.webrtc import AsyncioTestCase, inChildProcess

SPEECH_44K = 44100


def tone(seconds: float, rate: int = SPEECH_44K, frequency: float = 330.0) -> bytes:
    import numpy as np

    t = np.arange(int(round(seconds * rate))) / rate
    return (0.3 * np.sin(2 * np.pi * frequency * t) * 32767).astype("<i2").tobytes()


class PeerTests(AsyncioTestCase):
    timeout = 60

    def setUp(self) -> None:
        super().setUp()
        from rpmiddleware.webrtc.peer import Peer, PeerOptions

        self.messages: list[str] = []
        self.pcm: list[bytes] = []
        self.closedWith: list[str] = []
        self.opened = 0
        self._waiting: list[tuple[Any, asyncio.Future[None]]] = []

        def channelOpen() -> None:
            self.opened += 1
            self.changed()

        def message(text: str) -> None:
            self.messages.append(text)
            self.changed()

        def audio(pcm: bytes) -> None:
            self.pcm.append(pcm)
            self.changed()

        def closed(reason: str) -> None:
            self.closedWith.append(reason)
            self.changed()

        self.peer = Peer(
            self.loop,
            PeerOptions(iceServers=[{"urls": "stun:stun.example.invalid:3478"}]),
            onMessage=message,
            onAudio=audio,
            onChannelOpen=channelOpen,
            onClosed=closed,
            label="test",
        )
        self.addCleanup(self.peer.close)

    def run_(self, coro: Any) -> Deferred[Any]:
        from rpmiddleware.webrtc.bridge import deferredFromCoroutine

        return deferredFromCoroutine(coro, self.loop)

    async def client(self, microphone: Any = None) -> Any:
        from rpmiddleware.testing.webrtc import ClientPeer

        client = ClientPeer(microphone)
        self.addCleanup(lambda: self.run_(client.close()))
        return client

    async def exchange(self, offer: dict[str, str]) -> dict[str, str]:
        from rpmiddleware.webrtc.bridge import awaitable

        return await awaitable(self.peer.answer(offer), self.loop)

    async def connected(self, microphone: Any = None) -> Any:
        client = await self.client(microphone)
        await client.negotiate(self.exchange)
        await asyncio.wait_for(client.opened, 10)
        return client

    def assertNear(self, value: float, expected: float, tolerance: float) -> None:
        self.assertTrue(
            abs(value - expected) <= tolerance, f"{value} is not within {tolerance} of {expected}"
        )

    def changed(self) -> None:
        """
        One of the peer's callbacks ran: wake whoever waits for what now holds.
        """
        for entry in list(self._waiting):
            condition, future = entry
            if condition() and not future.done():
                self._waiting.remove(entry)
                future.set_result(None)

    async def whenTrue(self, condition: Any, timeout: float = 10.0) -> None:
        """
        Once C{condition} holds, checked each time one of the peer's
        callbacks runs (never polled); failing after C{timeout} seconds.
        """
        if condition():
            return
        future: asyncio.Future[None] = self.loop.create_future()
        self._waiting.append((condition, future))
        await asyncio.wait_for(future, timeout)

    def test_answerOffersLoopbackHostCandidatesOnly(self) -> Deferred[Any]:
        """
        The answer is complete (candidates inside, no trickle) and every
        candidate is a loopback host candidate, although aioice leaves
        127.0.0.1 out by default and a STUN server is configured.
        """
        from rpmiddleware.webrtc.ice import candidateAddresses

        async def go() -> None:
            client = await self.client()
            answer = await client.negotiate(self.exchange)
            self.assertEqual(answer["type"], "answer")
            addresses = candidateAddresses(answer["sdp"])
            self.assertTrue(addresses)
            for address in addresses:
                self.assertTrue(ipaddress.ip_address(address).is_loopback, address)
            self.assertNotIn("typ srflx", answer["sdp"])
            self.assertNotIn("typ relay", answer["sdp"])
            await asyncio.wait_for(client.opened, 10)

        return self.run_(go())

    def test_otherPeersGatherAsBefore(self) -> Deferred[Any]:
        """
        The loopback restriction is scoped to our answers: an aiortc peer
        of its own (the test client) still gathers as aioice always does.
        """
        import aioice.ice

        from rpmiddleware.webrtc.ice import installLoopbackGathering

        installLoopbackGathering()
        self.assertNotIn("127.0.0.1", aioice.ice.get_host_addresses(True, False))
        return self.run_(asyncio.sleep(0))

    def test_dataChannelBothWays(self) -> Deferred[Any]:
        """
        Text the client sends arrives as it came; L{Peer.send} writes JSON
        the client reads; nothing is sent before the channel is open.
        """

        async def go() -> None:
            self.assertFalse(self.peer.send({"type": "pong"}))
            client = await self.connected()
            await self.whenTrue(lambda: self.peer.channelOpen)
            self.assertEqual(self.opened, 1)
            client.send({"type": "attachments", "attachments": []})
            await self.whenTrue(lambda: self.messages)
            self.assertEqual(self.messages, ['{"type": "attachments", "attachments": []}'])
            self.assertTrue(
                self.peer.send({"type": "transcript", "text": "héllo", "isFinal": True})
            )
            message = await client.nextOfType("transcript")
            self.assertEqual(message, {"type": "transcript", "text": "héllo", "isFinal": True})

        return self.run_(go())

    def test_renegotiationAddsMicrophoneAndSpeech(self) -> Deferred[Any]:
        """
        The LLMRTC client offers its data channel first and its microphone
        later: the second offer is answered too, the speech track rides on
        the microphone's m-line, and the microphone arrives as mono 16 kHz
        PCM16 in which the detector finds the one utterance where it was.
        """
        from rpmiddleware.testing.webrtc import PcmTrack, conversation
        from rpmiddleware.webrtc.vad import SpeechEnded, SpeechStarted, VoiceActivityDetector

        recording = conversation(speech=0.6, before=0.4, after=0.9)

        async def go() -> None:
            client = await self.connected()
            self.assertFalse(self.peer.speaking)
            microphone = PcmTrack(recording.pcm(48000), rate=48000)
            client.addMicrophone(microphone)
            await client.negotiate(self.exchange)
            self.assertEqual(self.peer.offers, 2)
            self.assertTrue(self.peer.speaking)
            await asyncio.wait_for(client.trackArrived, 10)
            wanted = int(recording.seconds * 16000) * 2
            await self.whenTrue(lambda: sum(map(len, self.pcm)) >= wanted, timeout=15)
            pcm = b"".join(self.pcm)
            self.assertEqual(len(pcm) % 2, 0)
            vad = VoiceActivityDetector()
            events = vad.feed(pcm[:wanted]) + vad.flush()
            kinds = [type(e) for e in events]
            self.assertEqual(kinds, [SpeechStarted, SpeechEnded], events)
            # Where the speech began, measured from the track's first sample:
            # 0.4 s of silence, plus network and decoder start-up slack.
            started = events[0]
            assert isinstance(started, SpeechStarted)
            self.assertGreaterEqual(started.sample / 16000, 0.35)
            self.assertLess(started.sample / 16000, 1.2)
            ended = events[1]
            assert isinstance(ended, SpeechEnded)
            # The speech, the 200 ms pre-roll and the 100 ms trail, give or
            # take the frames the syllable rhythm's quiet ends cost.
            self.assertNear(ended.seconds, 0.6 + 0.2 + 0.1, 0.2)

        return self.run_(go())

    def test_speechTrackPlaysToClient(self) -> Deferred[Any]:
        """
        Speech fed to the track reaches the client's receiver: exactly the
        resampled count of samples is sent (frame arithmetic, not a clock),
        and the client hears about as much sound as was sent.
        """
        from rpmiddleware.testing.webrtc import PcmTrack

        async def go() -> None:
            client = await self.connected()
            client.addMicrophone(PcmTrack())
            await client.negotiate(self.exchange)
            listener = await asyncio.wait_for(client.trackArrived, 10)
            speech = self.peer.speech
            speech.feed(tone(0.3))
            speech.feed(tone(0.2))
            drained = self.loop.create_future()
            speech.onDrained = lambda turn: drained.done() or drained.set_result(turn)
            speech.finish()
            await asyncio.wait_for(listener.soundHeard.wait(), 10)
            await asyncio.wait_for(drained, 10)
            self.assertFalse(speech.playing)
            self.assertEqual(speech.speechSamples, 24000)  # 0.5 s at 48 kHz
            await asyncio.sleep(0.3)
            self.assertEqual(listener.rate, 48000)
            # Opus and the jitter buffer smear the edges by a few ms.
            self.assertNear(listener.soundSamples / 48000, 0.5, 0.05)

        return self.run_(go())

    def test_invalidOffersAreRefused(self) -> Deferred[Any]:
        """
        Each malformed offer fails with INVALID_MESSAGE naming the problem;
        the peer still answers a good one afterwards.
        """
        from rpmiddleware.webrtc.peer import INVALID_MESSAGE, OfferRefused

        async def refused(signal: Any) -> str:
            try:
                await self.exchange(signal)
            except OfferRefused as e:
                self.assertEqual(e.code, INVALID_MESSAGE)
                return e.message
            self.fail(f"{signal!r} was answered")

        async def go() -> None:
            self.assertIn("object", await refused("v=0"))
            self.assertIn("'offer'", await refused({"type": "answer", "sdp": "v=0"}))
            self.assertIn("sdp", await refused({"type": "offer", "sdp": ""}))
            self.assertIn("v=0", await refused({"type": "offer", "sdp": "not an sdp at all"}))
            self.assertIn("m=", await refused({"type": "offer", "sdp": "v=0\r\ns=-\r\n"}))
            await self.connected()

        return self.run_(go())

    def test_clientClosing(self) -> Deferred[Any]:
        """
        When the client closes its side the server's peer closes too and
        says so once.
        """

        async def go() -> None:
            client = await self.connected()
            await client.close()
            await self.whenTrue(lambda: self.peer.closed, timeout=15)
            self.assertEqual(len(self.closedWith), 1)

        return self.run_(go())

    def test_closeIsIdempotent(self) -> Deferred[Any]:
        """
        Closing twice closes once; an offer after closing is refused with
        CONNECTION_FAILED.
        """
        from rpmiddleware.webrtc.bridge import awaitable
        from rpmiddleware.webrtc.peer import CONNECTION_FAILED, OfferRefused

        async def go() -> None:
            client = await self.connected()
            first, second = self.peer.close("test"), self.peer.close("again")
            await awaitable(first, self.loop)
            await awaitable(second, self.loop)
            self.assertEqual(self.closedWith, ["test"])
            self.assertEqual(self.peer.pc.connectionState, "closed")
            # (The client's side closed with ours; a new client offers.)
            self.assertEqual(client.pc.connectionState, "closed")
            late = await self.client()
            try:
                await self.exchange(await late.offer())
            except OfferRefused as e:
                self.assertEqual(e.code, CONNECTION_FAILED)
            else:
                self.fail("an offer after close was answered")

        return self.run_(go())


PeerTestsInChild = inChildProcess(__name__, "PeerTests")
