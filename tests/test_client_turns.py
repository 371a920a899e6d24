"""
One turn, without sockets: RPEngine's reply stream in, client messages out,
with a Clock.

The envelopes are built here in RPEngine's own shapes (the fields app.rs
sends: C{gemma_delta}, C{gemma_completed}, C{take_reply_audio_transport},
C{complete_if_ready}, C{capture_state}, C{capture_level},
C{stt_completed}, C{cancel_request}, C{request_error_code}), not by the
simulator, so these tests say what the endpoint does with what RPEngine
really sends.
"""

from __future__ import annotations

import base64
import io
import re
import wave
from collections import defaultdict
from typing import Any

import numpy as np
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.audio.format import exactLength
from rpmiddleware.client.tts import SpeechOutput
from rpmiddleware.client.turns import AUDIO, TEXT, VOICE, Turn
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.protocol.clienterrors import ENGINE_TO_CLIENT
from rpmiddleware.protocol.envelope import Envelope
from tests.support.turns import Recorder

REQUEST = "r1"
REPLY = "Well met, traveller. The road north is closed! Take the ferry instead."
#: RPEngine's speech rate (app.rs tts_completed refuses any other).
ENGINE_RATE = 44100


def envelope(type: str, **fields: Any) -> Envelope:
    return Envelope.build(type, "s", requestId=REQUEST, **fields)


def sentences(text: str) -> list[str]:
    return re.findall(r"[^.!?]+[.!?]\s*", text)


def engineReply(
    text: str = REPLY,
    wantAudio: bool = True,
    chunkSamples: int = 1000,
    extracted: dict[str, list[str]] | None = None,
    accepted: bool = True,
) -> list[Envelope]:
    """
    The envelopes RPEngine sends for one reply, in its order: each sentence's
    words as deltas, then its speech (start once, then chunks numbered
    globally and within the segment); the completed text with its
    statistics; the audio totals; reply.completed.  With C{extracted}
    (buffered response processing) no deltas are sent,
    reply.text.completed carries C{extractedContent}, and all speech follows.
    """
    out: list[Envelope] = []
    if accepted:
        out.append(envelope("reply.accepted", eventId="e1", resolvedCardHash="h", queueDepth=1))
    delta = sequence = totalBytes = 0
    segments = sentences(text)
    # The last sentence is only known complete at the end of generation
    # (gemma_completed), so its speech follows reply.text.completed.
    tail: list[Envelope] = []
    for index, sentence in enumerate(segments):
        if extracted is None:
            for word in re.findall(r"\S+\s*", sentence):
                out.append(envelope("reply.text.delta", sequence=delta, delta=word))
                delta += 1
        if not wantAudio:
            continue
        # Buffered response processing starts speech only after generation.
        buffered = extracted is not None
        audio = tail if buffered or index == len(segments) - 1 else out
        if index == 0:
            audio.append(
                envelope(
                    "reply.audio.start", format="pcm_s16le", sampleRate=ENGINE_RATE, channels=1
                )
            )
        samples = 2000 + 700 * index
        t = np.arange(samples) / ENGINE_RATE
        pcm = (3000 * np.sin(2 * np.pi * (300 + 50 * index) * t)).astype("<i2").tobytes()
        pieces = [pcm[i : i + 2 * chunkSamples] for i in range(0, len(pcm), 2 * chunkSamples)]
        for n, piece in enumerate(pieces):
            audio.append(
                envelope(
                    "reply.audio.chunk",
                    sequence=sequence,
                    segmentSequence=index,
                    segmentChunkSequence=n,
                    segmentChunkCount=len(pieces),
                    data=base64.b64encode(piece).decode("ascii"),
                )
            )
            sequence += 1
        totalBytes += len(pcm)
    completed: dict[str, Any] = {"text": text, "tokenCount": 17, "elapsedMs": 812.5}
    if extracted is not None:
        completed["extractedContent"] = extracted
    out.append(envelope("reply.text.completed", **completed))
    out.extend(tail)
    if wantAudio:
        out.append(
            envelope(
                "reply.audio.completed",
                chunkCount=sequence,
                totalBytes=totalBytes,
                durationSeconds=totalBytes / 2 / ENGINE_RATE,
                elapsedMs=420.0,
                segmentCount=len(segments),
            )
        )
    modalities = ["text", "audio"] if wantAudio else ["text"]
    out.append(envelope("reply.completed", modalities=modalities))
    return out


def segmentSamples(envelopes: list[Envelope]) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for e in envelopes:
        if e.type == "reply.audio.chunk":
            counts[e["segmentSequence"]] += len(base64.b64decode(e["data"])) // 2
    return counts


def requestError(code: str, retryable: bool = False, message: str | None = None) -> Envelope:
    return envelope(
        "request.error",
        sourceMessageId="m1",
        code=code,
        message=message if message is not None else f"because {code}",
        retryable=retryable,
    )


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
        self.feed(stream, engineReply())
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
        self.assertEqual(complete["modalities"], ["text", "audio"])
        self.assertNotIn("extractedContent", complete)
        self.assertNotIn("extractedContent", send.of("llm")[0])
        envelopes = engineReply()
        audioDone = next(e for e in envelopes if e.type == "reply.audio.completed")
        # RPEngine's statistics as it sent them, text's and audio's apart
        # (both have an elapsedMs).
        self.assertEqual(
            complete["stats"],
            {
                "text": {"tokenCount": 17, "elapsedMs": 812.5},
                "audio": {
                    "chunkCount": audioDone["chunkCount"],
                    "totalBytes": audioDone["totalBytes"],
                    "durationSeconds": audioDone["durationSeconds"],
                    "elapsedMs": 420.0,
                    "segmentCount": 3,
                },
            },
        )
        self.assertEqual(turn.outcome, "completed")
        self.assertEqual(self.ended, [turn])

    def test_statsPassLaterFields(self) -> None:
        """
        A figure a later RPEngine adds to its completed messages reaches the
        client too; the envelope's own fields do not.
        """
        envelopes = engineReply(wantAudio=False)
        for e in envelopes:
            if e.type == "reply.text.completed":
                e["promptTokens"] = 311
        _, stream, send = self.turn(rate=None)
        self.feed(stream, envelopes)
        self.assertEqual(
            send.sent[-1]["stats"],
            {"text": {"tokenCount": 17, "elapsedMs": 812.5, "promptTokens": 311}},
        )

    def test_responseProcessing(self) -> None:
        """
        With buffered response processing RPEngine sends no deltas: the text
        and what the rules extracted come at reply.text.completed, on llm
        and again on reply-complete.
        """
        extracted = {"mood": ["wry"], "quest.id": ["q7", "q9"]}
        turn, stream, send = self.turn()
        self.feed(stream, engineReply(extracted=extracted))
        chunks = send.of("llm-chunk")
        self.assertEqual(
            chunks, [{"type": "llm-chunk", "content": "", "done": True, "turnId": REQUEST}]
        )
        self.assertEqual(
            send.of("llm"),
            [{"type": "llm", "text": REPLY, "extractedContent": extracted, "turnId": REQUEST}],
        )
        complete = send.sent[-1]
        self.assertEqual(complete["type"], "reply-complete")
        self.assertEqual(complete["extractedContent"], extracted)
        self.assertEqual(complete["text"], REPLY)
        self.assertEqual(complete["stats"]["text"], {"tokenCount": 17, "elapsedMs": 812.5})
        self.assertEqual(turn.extractedContent, extracted)
        self.assertEqual(turn.replyText, REPLY)

    def test_extractedContentNotAnObject(self) -> None:
        envelopes = engineReply(wantAudio=False, extracted={})
        for e in envelopes:
            if e.type == "reply.text.completed":
                e["extractedContent"] = ["not", "an", "object"]
        _, stream, send = self.turn(rate=None)
        self.feed(stream, envelopes)
        self.assertNotIn("extractedContent", send.of("llm")[0])
        self.assertNotIn("extractedContent", send.sent[-1])

    def test_resampledHereWithoutPlugin(self) -> None:
        """
        Chunks at 44.1 kHz (no audio-resample plugin in the chain) reach the
        client at its rate, each segment exactly as long as it should be.
        """
        envelopes = engineReply()
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
        envelopes = engineReply()
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
        envelopes = engineReply()
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
        envelopes = engineReply()
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
        _, stream, send = self.turn(streaming=False, maxSeconds=0.1)
        self.feed(stream, engineReply())
        errors = send.of("error")
        self.assertEqual(errors[0]["code"], "TTS_ERROR")
        self.assertIn("streaming", errors[0]["message"])
        self.assertEqual(self.cancels, [REQUEST])
        self.assertEqual(send.types()[-1], "tts-cancelled")

    def test_textOnly(self) -> None:
        _, stream, send = self.turn(rate=None)
        self.feed(stream, engineReply(wantAudio=False))
        kinds = send.types()
        self.assertFalse({"tts-start", "tts-chunk", "tts-complete", "tts"} & set(kinds))
        self.assertEqual(kinds[-1], "reply-complete")

    def test_noTranscriptForARecording(self) -> None:
        """
        RPEngine says nothing of what it heard in a recording's turn (app.rs
        stt_completed reports only captures): no transcript reaches the
        client, and a field RPEngine never sends on reply.accepted is ignored.
        """
        _, stream, send = self.turn(kind=AUDIO)
        envelopes = engineReply()
        envelopes[0]["transcript"] = "invented"
        self.feed(stream, envelopes)
        self.assertNotIn("transcript", send.types())
        self.assertEqual(send.types()[-1], "reply-complete")

    def test_segmentTailSentWithItsLastChunk(self) -> None:
        """
        Resampled here, a sentence's last samples go out with its last chunk
        (RPEngine numbers a segment's chunks), not when the next sentence
        begins.
        """
        envelopes = engineReply()
        first = [
            e for e in envelopes if e.type == "reply.audio.chunk" and e["segmentSequence"] == 0
        ]
        upTo = envelopes.index(first[-1]) + 1
        _, stream, send = self.turn(rate=24000)
        self.feed(stream, envelopes[:upTo])
        samples = sum(len(base64.b64decode(c["data"])) // 2 for c in send.of("tts-chunk"))
        self.assertEqual(samples, exactLength(segmentSamples(envelopes)[0], ENGINE_RATE, 24000))

    def test_cancelSilences(self) -> None:
        turn, stream, send = self.turn()
        envelopes = engineReply()
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
        """
        A turn RPEngine cancelled (not the client) ends with tts-cancelled
        carrying RPEngine's reason as engineReason.
        """
        for reason in ("connection_lost", "not_active", "requested_by_game"):
            self.ended.clear()
            turn, stream, send = self.turn()
            self.feed(stream, engineReply()[:3])
            stream.received(envelope("reply.cancelled", reason=reason))
            self.assertEqual(
                send.sent[-1],
                {
                    "type": "tts-cancelled",
                    "reason": f"RPEngine cancelled this turn ({reason})",
                    "engineReason": reason,
                    "turnId": REQUEST,
                },
            )
            self.assertEqual(turn.outcome, "cancelled")
            self.assertEqual(self.ended, [turn])

    def test_cancelledUpstreamWithoutReason(self) -> None:
        turn, stream, send = self.turn()
        stream.received(envelope("reply.cancelled"))
        self.assertEqual(
            send.sent[-1],
            {"type": "tts-cancelled", "reason": "RPEngine cancelled this turn", "turnId": REQUEST},
        )

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
                        self.feed(stream, engineReply()[:4])
                    stream.received(requestError(engineCode, retryable))
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

    def test_unknownCodeEndsTheTurn(self) -> None:
        """
        A code this middleware does not know (a later RPEngine's) still ends
        the turn for the client: the error (INTERNAL_ERROR naming the code,
        RPEngine's retryable), tts-cancelled once it had begun, and the turn
        is over (its end is reported, nothing more is sent).
        """
        for accepted, retryable in ((False, False), (True, True)):
            self.ended.clear()
            turn, stream, send = self.turn()
            envelopes = engineReply()
            if accepted:
                self.feed(stream, envelopes[:6])
            before = len(send.sent)
            stream.received(requestError("gpu_on_fire", retryable, "the GPU melted"))
            tail = send.sent[before:]
            self.assertEqual(
                tail[0],
                {
                    "type": "error",
                    "code": "INTERNAL_ERROR",
                    "message": "the GPU melted",
                    "retryable": retryable,
                    "engineCode": "gpu_on_fire",
                    "turnId": REQUEST,
                },
            )
            self.assertEqual(
                [m["type"] for m in tail], ["error", "tts-cancelled"] if accepted else ["error"]
            )
            self.assertEqual(turn.outcome, "failed")
            self.assertEqual(self.ended, [turn])
            self.feed(stream, envelopes[6:])
            self.assertEqual(len(send.sent), before + len(tail))

    def test_voiceErrors(self) -> None:
        """
        The capture's own refusals: no words (STT_ERROR), no speech model
        (STT_ERROR), RPEngine's microphone taken (VAD_ERROR); after the
        capture was accepted, tts-cancelled ends the turn.
        """
        for code, clientCode in (
            ("empty_speech", "STT_ERROR"),
            ("stt_model_not_installed", "STT_ERROR"),
            ("voice_capture_active", "VAD_ERROR"),
            ("microphone_not_enabled", "VAD_ERROR"),
        ):
            turn, stream, send = self.turn(kind=VOICE)
            if code == "empty_speech":
                self.feed(stream, [envelope("reply.accepted", eventId="e1", queueDepth=0)])
                stream.received(envelope("voice.capture.state", state="speech_ended", seconds=1.2))
            stream.received(requestError(code))
            [error] = send.of("error")
            self.assertEqual((error["code"], error["engineCode"]), (clientCode, code))
            self.assertFalse(error["retryable"])
            self.assertEqual(send.types()[-1] == "tts-cancelled", code == "empty_speech")
            self.assertEqual(turn.outcome, "failed")

    def test_engineLostMidTurn(self) -> None:
        turn, stream, send = self.turn()
        self.feed(stream, engineReply()[:12])
        stream.received(
            envelope(
                "request.error",
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
        self.feed(stream, engineReply()[:1])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.clock.advance(60)
        self.assertNotIn("error", send.types())

    def test_endStopsTimer(self) -> None:
        turn, stream, send = self.turn(acceptTimeout=30.0)
        stream.received(Envelope.build("reply.cancelled", requestId=REQUEST))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_voiceCapture(self) -> None:
        """
        RPEngine's capture reports as the client's messages: every state as
        voice-state with its fields, speech_started and speech_ended as
        speech-start and speech-end, levels with peak, rms and seconds (and
        level, the peak), the transcript; then the reply streams.
        """
        turn, stream, send = self.turn(kind=VOICE)
        self.assertTrue(turn.capturing and turn.capturePhase)
        state = "voice.capture.state"
        self.feed(
            stream,
            [
                envelope("reply.accepted", eventId="e1", resolvedCardHash="h", queueDepth=0),
                envelope(state, state="listening", seconds=0, autoEndEnabled=True, message=None),
                envelope("voice.capture.level", seconds=0.25, peak=0.5, rms=0.125),
                envelope(state, state="speech_started", seconds=0.4, autoEndEnabled=True),
            ],
        )
        self.assertTrue(turn.capturing)
        stream.received(
            envelope(state, state="speech_ended", seconds=2.0, autoEndEnabled=True, message=None)
        )
        self.assertFalse(turn.capturing)
        self.assertTrue(turn.capturePhase)
        stream.received(
            envelope(
                "voice.capture.transcript", text="Open the gate.", language="en", elapsedMs=80.0
            )
        )
        self.assertFalse(turn.capturePhase)
        self.assertEqual(turn.transcript, "Open the gate.")
        self.assertEqual(
            send.sent,
            [
                {
                    "type": "voice-state",
                    "state": "listening",
                    "seconds": 0,
                    "autoEndEnabled": True,
                    "turnId": REQUEST,
                },
                {
                    "type": "voice-level",
                    "level": 0.5,
                    "peak": 0.5,
                    "rms": 0.125,
                    "seconds": 0.25,
                    "turnId": REQUEST,
                },
                {
                    "type": "voice-state",
                    "state": "speech_started",
                    "seconds": 0.4,
                    "autoEndEnabled": True,
                    "turnId": REQUEST,
                },
                {"type": "speech-start", "turnId": REQUEST},
                {
                    "type": "voice-state",
                    "state": "speech_ended",
                    "seconds": 2.0,
                    "autoEndEnabled": True,
                    "turnId": REQUEST,
                },
                {"type": "speech-end", "turnId": REQUEST},
                {
                    "type": "transcript",
                    "text": "Open the gate.",
                    "isFinal": True,
                    "language": "en",
                    "turnId": REQUEST,
                },
            ],
        )
        # The capture became a reply (RPEngine sends no second reply.accepted).
        self.feed(stream, engineReply(accepted=False))
        self.assertEqual(send.types()[-1], "reply-complete")
        self.assertEqual(send.types().count("transcript"), 1)
        self.assertEqual(turn.outcome, "completed")

    def test_voiceLevelFallbacks(self) -> None:
        """
        level is the peak; the rms when RPEngine gives no peak; a report
        with neither (nor an older level) is not passed on.
        """
        turn, stream, send = self.turn(kind=VOICE)
        level = "voice.capture.level"
        self.feed(
            stream,
            [
                envelope(level, seconds=1.0, peak=None, rms=0.2),
                envelope(level, seconds=1.1),
                envelope(level, level=0.75),
                envelope(level, peak=True, rms="loud"),
            ],
        )
        self.assertEqual(
            send.sent,
            [
                {
                    "type": "voice-level",
                    "level": 0.2,
                    "rms": 0.2,
                    "seconds": 1.0,
                    "turnId": REQUEST,
                },
                {"type": "voice-level", "level": 0.75, "turnId": REQUEST},
            ],
        )

    def test_silentCaptureRestarts(self) -> None:
        """
        With silenceBehavior "restart", a recording with no words is
        followed by listening again: the microphone is open once more (stop
        works again).  An empty transcript is not passed on.
        """
        turn, stream, send = self.turn(kind=VOICE)
        state = "voice.capture.state"
        stream.received(envelope(state, state="speech_started", seconds=0.3))
        stream.received(envelope(state, state="speech_ended", seconds=0.9))
        self.assertFalse(turn.capturing)
        stream.received(envelope("voice.capture.transcript", text=" ", language="en"))
        self.assertNotIn("transcript", send.types())
        self.assertTrue(turn.capturePhase)
        stream.received(
            envelope(
                state,
                state="listening",
                seconds=0,
                autoEndEnabled=True,
                message="No speech was recognized; listening again.",
            )
        )
        self.assertTrue(turn.capturing)
        self.assertEqual(
            send.sent[-1],
            {
                "type": "voice-state",
                "state": "listening",
                "seconds": 0,
                "autoEndEnabled": True,
                "message": "No speech was recognized; listening again.",
                "turnId": REQUEST,
            },
        )
        self.assertIsNone(turn.outcome)

    def test_stopCapture(self) -> None:
        """
        The client's stop: only while the microphone is open; speech the
        client heard start is said to end (RPEngine sends no speech_ended
        for a stopped capture), once.
        """
        turn, stream, send = self.turn(kind=VOICE)
        state = "voice.capture.state"
        stream.received(envelope(state, state="listening", seconds=0))
        self.assertTrue(turn.stopCapture())
        self.assertNotIn("speech-end", send.types())
        self.assertFalse(turn.stopCapture())
        turn, stream, send = self.turn(kind=VOICE)
        stream.received(envelope(state, state="speech_started", seconds=0.4))
        self.assertTrue(turn.stopCapture())
        self.assertEqual(send.sent[-1], {"type": "speech-end", "turnId": REQUEST})
        stream.received(envelope(state, state="speech_ended", seconds=0.6))
        self.assertEqual(send.types().count("speech-end"), 1)
        turn.cancel()
        self.assertFalse(turn.stopCapture())

    def test_replyEndsCapturePhase(self) -> None:
        """
        Without a transcript (an RPEngine that sends none), the reply's
        first text or speech ends the capture phase.
        """
        for first in (1, 2):
            turn, stream, send = self.turn(kind=VOICE)
            envelopes = engineReply(accepted=False)
            self.feed(stream, envelopes[:first])
            self.assertFalse(turn.capturing or turn.capturePhase)

    def test_audioRefusedCancels(self) -> None:
        """
        When the connection holds audio back (the client is not reading),
        the turn cancels itself upstream.
        """
        turn, stream, send = self.turn()
        send.refuseAudio = True
        self.feed(stream, engineReply())
        self.assertEqual(self.cancels, [REQUEST])
        self.assertNotIn("tts-chunk", send.types())
        self.assertEqual(
            send.of("tts-cancelled")[0]["reason"],
            "the client is not reading its messages fast enough",
        )

    def test_badChunkSkipped(self) -> None:
        turn, stream, send = self.turn(rate=24000)
        envelopes = engineReply()
        for e in envelopes:
            if e.type == "reply.audio.chunk" and e["sequence"] == 0:
                e["data"] = "###"
        self.feed(stream, envelopes)
        self.assertEqual(turn.outcome, "completed")
        self.assertEqual(send.types()[-1], "reply-complete")
