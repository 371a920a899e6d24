"""
One turn, without sockets: RPEngine's reply stream (made by the simulator's
own stream generator) in, client messages out, with a Clock.
"""

from __future__ import annotations

import base64
import io
import wave
from collections import defaultdict
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.api import ReplyStream
from rpmiddleware.audio import exactLength
from rpmiddleware.client.errors import ENGINE_TO_CLIENT
from rpmiddleware.client.tts import SpeechOutput
from rpmiddleware.client.turns import AUDIO, TEXT, VOICE, Turn
from rpmiddleware.envelope import Envelope
from rpmiddleware.testing.replystream import Pacing
from rpmiddleware.testing.replystream import ReplyStream as SimulatedReply

REQUEST = "r1"
REPLY = "Well met, traveller. The road north is closed! Take the ferry instead."


def simulated(
    text: str = REPLY, wantAudio: bool = True, transcript: str | None = None
) -> list[Envelope]:
    """
    The envelopes RPEngine (the simulator) sends for one reply, in order.
    """
    out: list[Envelope] = []
    clock = Clock()
    reply = SimulatedReply(
        REQUEST,
        text,
        wantAudio,
        lambda type, **fields: out.append(Envelope.build(type, "s", **fields)),
        clock,
        Pacing(chunkSamples=1000),
        lambda stream: None,
        transcript=transcript,
    )
    reply.start()
    while not reply.finished:
        clock.advance(0)
    return out


def segmentSamples(envelopes: list[Envelope]) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for e in envelopes:
        if e.type == "reply.audio.chunk":
            counts[e["segmentSequence"]] += len(base64.b64decode(e["data"])) // 2
    return counts


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.refuseAudio = False

    def __call__(self, message: dict[str, Any], audio: bool = False) -> bool:
        if audio and self.refuseAudio:
            return False
        self.sent.append(message)
        return True

    def types(self) -> list[str]:
        return [m["type"] for m in self.sent]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == kind]


class TurnTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.cancels: list[str] = []
        self.ended: list[Turn] = []

    def turn(
        self,
        kind: str = TEXT,
        rate: int | None = 24000,
        streaming: bool = True,
        acceptTimeout: float = 0.0,
        maxSeconds: float = 600.0,
        stream: ReplyStream | None = None,
    ) -> tuple[Turn, ReplyStream, Recorder]:
        stream = stream or ReplyStream(REQUEST, lambda s: self.cancels.append(s.requestId))
        send = Recorder()
        speech = SpeechOutput(rate, streaming, maxSeconds) if rate else None
        turn = Turn(
            kind,
            stream,
            send,
            speech,
            self.clock,
            acceptTimeout,
            self.ended.append,
            "Hello?" if kind == TEXT else None,
        )
        turn.start()
        return turn, stream, send

    def feed(self, stream: ReplyStream, envelopes: list[Envelope]) -> None:
        for envelope in envelopes:
            stream.received(envelope)

    def test_textTurn(self) -> None:
        """
        Every message of a streamed turn, in order, with its turnId.
        """
        turn, stream, send = self.turn()
        self.feed(stream, simulated())
        kinds = send.types()
        self.assertEqual(kinds[0], "transcript")
        self.assertEqual(
            send.sent[0],
            {"type": "transcript", "text": "Hello?", "isFinal": True, "turnId": REQUEST},
        )
        self.assertEqual(kinds[-1], "reply-complete")
        self.assertEqual(kinds.count("tts-start"), 1)
        self.assertLess(kinds.index("tts-start"), kinds.index("tts-chunk"))
        done = kinds.index("llm")
        self.assertEqual(
            send.sent[done - 1],
            {"type": "llm-chunk", "content": "", "done": True, "turnId": REQUEST},
        )
        self.assertEqual(kinds[-2], "tts-complete")
        self.assertGreater(len(kinds) - 1 - kinds[::-1].index("tts-chunk"), done)
        chunks = [m for m in send.of("llm-chunk") if not m["done"]]
        self.assertEqual("".join(m["content"] for m in chunks), REPLY)
        self.assertEqual(send.of("llm")[0]["text"], REPLY)
        self.assertTrue(all(m["turnId"] == REQUEST for m in send.sent))
        complete = send.sent[-1]
        self.assertEqual(complete["text"], REPLY)
        self.assertEqual(complete["stats"]["audioSegments"], 3)
        self.assertEqual(complete["audioStats"]["segments"], 3)
        self.assertEqual(complete["textStats"]["tokens"], len(REPLY.split()))
        self.assertEqual(turn.outcome, "completed")
        self.assertEqual(self.ended, [turn])

    def test_resampledHereWithoutPlugin(self) -> None:
        """
        Chunks at 44.1 kHz (no audio-resample plugin in the chain) reach the
        client at its rate, each segment exactly as long as it should be.
        """
        envelopes = simulated()
        segments = segmentSamples(envelopes)
        for rate in (16000, 24000, 48000):
            _, stream, send = self.turn(rate=rate)
            self.feed(stream, envelopes)
            chunks = send.of("tts-chunk")
            self.assertTrue(all(c["sampleRate"] == rate and c["format"] == "pcm" for c in chunks))
            samples = sum(len(base64.b64decode(c["data"])) // 2 for c in chunks)
            self.assertEqual(samples, sum(exactLength(n, 44100, rate) for n in segments.values()))
            self.assertEqual(send.sent[-1]["speech"], {"sampleRate": rate, "samples": samples})

    def test_sameRatePassesUntouched(self) -> None:
        envelopes = simulated()
        _, stream, send = self.turn(rate=44100)
        self.feed(stream, envelopes)
        self.assertEqual(
            [c["data"] for c in send.of("tts-chunk")],
            [e["data"] for e in envelopes if e.type == "reply.audio.chunk"],
        )

    def test_pluginConvertedPassUntouched(self) -> None:
        """
        Chunks the audio-resample plugin converted say their rate and are
        passed on as they are.
        """
        envelopes = simulated()
        for e in envelopes:
            if e.type in ("reply.audio.start", "reply.audio.chunk"):
                e["sampleRate"] = 24000
        _, stream, send = self.turn(rate=24000)
        self.feed(stream, envelopes)
        self.assertEqual(
            [c["data"] for c in send.of("tts-chunk")],
            [e["data"] for e in envelopes if e.type == "reply.audio.chunk"],
        )

    def test_nonStreaming(self) -> None:
        envelopes = simulated()
        segments = segmentSamples(envelopes)
        _, stream, send = self.turn(rate=22050, streaming=False)
        self.feed(stream, envelopes)
        kinds = send.types()
        self.assertNotIn("tts-start", kinds)
        self.assertNotIn("tts-chunk", kinds)
        self.assertEqual(kinds[-3:], ["tts", "tts-complete", "reply-complete"])
        [tts] = send.of("tts")
        self.assertEqual((tts["format"], tts["sampleRate"]), ("wav", 22050))
        with wave.open(io.BytesIO(base64.b64decode(tts["data"]))) as reader:
            self.assertEqual(reader.getframerate(), 22050)
            self.assertEqual((reader.getnchannels(), reader.getsampwidth()), (1, 2))
            self.assertEqual(
                reader.getnframes(), sum(exactLength(n, 44100, 22050) for n in segments.values())
            )

    def test_nonStreamingTooLong(self) -> None:
        _, stream, send = self.turn(streaming=False, maxSeconds=0.5)
        self.feed(stream, simulated())
        errors = send.of("error")
        self.assertEqual(errors[0]["code"], "TTS_ERROR")
        self.assertIn("streaming", errors[0]["message"])
        self.assertEqual(self.cancels, [REQUEST])
        self.assertEqual(send.types()[-1], "tts-cancelled")

    def test_textOnly(self) -> None:
        _, stream, send = self.turn(rate=None)
        self.feed(stream, simulated(wantAudio=False))
        kinds = send.types()
        self.assertFalse({"tts-start", "tts-chunk", "tts-complete", "tts"} & set(kinds))
        self.assertEqual(kinds[-1], "reply-complete")

    def test_transcriptFromEngine(self) -> None:
        _, stream, send = self.turn(kind=AUDIO)
        self.feed(stream, simulated(transcript="what the player said"))
        self.assertEqual(
            send.sent[0],
            {
                "type": "transcript",
                "text": "what the player said",
                "isFinal": True,
                "turnId": REQUEST,
            },
        )
        self.assertEqual(send.types().count("transcript"), 1)

    def test_cancelSilences(self) -> None:
        turn, stream, send = self.turn()
        envelopes = simulated()
        self.feed(stream, envelopes[:5])
        before = len(send.sent)
        turn.cancel()
        self.assertEqual(send.sent[before:], [{"type": "tts-cancelled", "turnId": REQUEST}])
        self.assertEqual(self.cancels, [REQUEST])
        self.feed(stream, envelopes[5:-1])
        self.feed(stream, [Envelope.build("reply.cancelled", "s", requestId=REQUEST)])
        self.assertEqual(len(send.sent), before + 1)
        self.assertEqual(turn.outcome, "cancelled")
        self.assertEqual(self.ended, [turn])
        turn.cancel()
        self.assertEqual(self.cancels, [REQUEST])

    def test_cancelledUpstream(self) -> None:
        turn, stream, send = self.turn()
        self.feed(stream, simulated()[:3])
        self.feed(stream, [Envelope.build("reply.cancelled", "s", requestId=REQUEST)])
        self.assertEqual(send.types()[-1], "tts-cancelled")
        self.assertEqual(turn.outcome, "cancelled")

    def test_everyErrorCode(self) -> None:
        """
        Table-driven: each RPEngine code reaches the client as its seed
        code, with engineCode and retryable; tts-cancelled follows when the
        reply had begun.
        """
        for engineCode, clientCode in ENGINE_TO_CLIENT.items():
            for accepted in (False, True):
                for retryable in (False, True):
                    self.cancels.clear()
                    turn, stream, send = self.turn()
                    if accepted:
                        self.feed(stream, simulated()[:4])
                    stream.received(
                        Envelope.build(
                            "request.error",
                            "s",
                            requestId=REQUEST,
                            code=engineCode,
                            message=f"because {engineCode}",
                            retryable=retryable,
                        )
                    )
                    [error] = send.of("error")
                    self.assertEqual(
                        error,
                        {
                            "type": "error",
                            "code": clientCode,
                            "message": f"because {engineCode}",
                            "retryable": retryable,
                            "engineCode": engineCode,
                            "turnId": REQUEST,
                        },
                    )
                    cancelled = accepted or engineCode == "engine_disconnected"
                    self.assertEqual(send.types()[-1] == "tts-cancelled", cancelled, engineCode)
                    self.assertEqual(turn.outcome, "failed")

    def test_engineLostMidTurn(self) -> None:
        turn, stream, send = self.turn()
        self.feed(stream, simulated()[:12])
        stream.received(
            Envelope.build(
                "request.error",
                requestId=REQUEST,
                code="engine_disconnected",
                message="RPEngine disconnected during this reply; it can be asked again",
                retryable=True,
            )
        )
        self.assertEqual(send.types()[-2:], ["error", "tts-cancelled"])
        error = send.sent[-2]
        self.assertEqual((error["code"], error["retryable"]), ("LLM_ERROR", True))
        self.assertEqual(error["engineCode"], "engine_disconnected")

    def test_alreadyFailedStream(self) -> None:
        """
        A request answered before the turn started (the stream already
        holds its end) is told at start, and its Deferred is consumed.
        """
        stream = ReplyStream(REQUEST, lambda s: None)
        stream.received(
            Envelope.build(
                "request.error", requestId=REQUEST, code="engine_unavailable", retryable=True
            )
        )
        turn, _, send = self.turn(stream=stream)
        self.assertEqual(send.types(), ["transcript", "error"])
        self.assertEqual(send.sent[1]["code"], "RATE_LIMITED")
        self.assertEqual(turn.outcome, "failed")

    def test_acceptTimeout(self) -> None:
        turn, stream, send = self.turn(acceptTimeout=30.0)
        self.clock.advance(29.9)
        self.assertEqual(send.types(), ["transcript"])
        self.clock.advance(0.1)
        self.assertEqual(send.types(), ["transcript", "error", "tts-cancelled"])
        error = send.sent[1]
        self.assertEqual((error["code"], error["retryable"]), ("LLM_TIMEOUT", True))
        self.assertEqual(self.cancels, [REQUEST])

    def test_acceptedInTime(self) -> None:
        turn, stream, send = self.turn(acceptTimeout=30.0)
        self.feed(stream, simulated()[:1])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(60)
        self.assertNotIn("error", send.types())

    def test_endStopsTimer(self) -> None:
        turn, stream, send = self.turn(acceptTimeout=30.0)
        stream.received(Envelope.build("reply.cancelled", requestId=REQUEST))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_voiceCapture(self) -> None:
        turn, stream, send = self.turn(kind=VOICE)
        self.assertTrue(turn.capturing)
        for state in ("listening", "speaking"):
            stream.received(Envelope.build("voice.capture.state", requestId=REQUEST, state=state))
        stream.received(Envelope.build("voice.capture.level", requestId=REQUEST, level=0.5))
        self.assertTrue(turn.capturing)
        stream.received(
            Envelope.build("voice.capture.state", requestId=REQUEST, state="processing")
        )
        self.assertFalse(turn.capturing)
        self.assertEqual(
            send.sent,
            [
                {"type": "voice-state", "state": "listening", "turnId": REQUEST},
                {"type": "voice-state", "state": "speaking", "turnId": REQUEST},
                {"type": "speech-start", "turnId": REQUEST},
                {"type": "voice-level", "level": 0.5, "turnId": REQUEST},
                {"type": "voice-state", "state": "processing", "turnId": REQUEST},
                {"type": "speech-end", "turnId": REQUEST},
            ],
        )

    def test_audioRefusedCancels(self) -> None:
        """
        When the connection holds audio back (the client is not reading),
        the turn cancels itself upstream.
        """
        turn, stream, send = self.turn()
        send.refuseAudio = True
        self.feed(stream, simulated())
        self.assertEqual(self.cancels, [REQUEST])
        self.assertNotIn("tts-chunk", send.types())
        self.assertEqual(
            send.of("tts-cancelled")[0]["reason"],
            "the client is not reading its messages fast enough",
        )

    def test_badChunkSkipped(self) -> None:
        turn, stream, send = self.turn(rate=24000)
        envelopes = simulated()
        for e in envelopes:
            if e.type == "reply.audio.chunk" and e["sequence"] == 0:
                e["data"] = "###"
        self.feed(stream, envelopes)
        self.assertEqual(turn.outcome, "completed")
        self.assertEqual(send.types()[-1], "reply-complete")
