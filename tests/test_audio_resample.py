"""
Tests for the audio-resample plugin, rpmiddleware.audio.format and rpmiddleware.audio.pcm.
"""

from __future__ import annotations

import base64
import math
from fractions import Fraction
from typing import Any

import numpy as np
import soxr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.signal.windows import blackmanharris
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.audio import pcm
from rpmiddleware.audio.format import (
    AudioError,
    decodeBase64,
    encodeBase64,
    exactLength,
    strictBase64,
)
from rpmiddleware.audio.pcm import Pcm16Resampler, StreamResampler, decodePcm, encodePcm, resample
from rpmiddleware.builtin.audio_resample import (
    PREPARE_DELAY,
    AudioResample,
    ResampleSettings,
    audioResample,
    endsSegment,
)
from rpmiddleware.plugin.interfaces import IEnvelopePlugin
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import MAX_INPUT_AUDIO_SECONDS
from rpmiddleware.testing.kit import PluginHarness


def tone(freq: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate)), dtype=np.float64) / rate
    return amplitude * np.sin(2 * math.pi * freq * t)


def pcm16(samples: np.ndarray) -> bytes:
    return np.clip(np.rint(samples * 32768), -32768, 32767).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, dtype: str = "<i2") -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def dominantFrequency(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def peakLevelDb(samples: np.ndarray, reference: float) -> float:
    """
    The strongest spectral component of C{samples}, in dB relative to a
    sine of amplitude C{reference}.
    """
    window = blackmanharris(len(samples))
    amplitude = np.abs(np.fft.rfft(samples * window)) * 2 / window.sum()
    return float(20 * math.log10(max(amplitude.max(), 1e-12) / reference))


def makeHarness(**config: Any) -> tuple[PluginHarness, AudioResample]:
    plugin = AudioResample(ResampleSettings.fromMapping(config))
    harness = PluginHarness(plugin)
    harness.startSession()
    return harness, plugin


def replyRequest(
    harness: PluginHarness,
    requestId: str = "r1",
    audio: dict[str, Any] | None = None,
    outputRate: int | None = None,
) -> Envelope:
    meta = {"outputSampleRate": outputRate} if outputRate is not None else None
    envelope = harness.replyRequest(requestId, audio=audio, meta=meta)
    harness.toEngine(envelope)
    return envelope


class SettingsTests(SynchronousTestCase):
    def test_factory(self) -> None:
        self.assertEqual(audioResample.name, "audio-resample")
        plugin = audioResample.buildPlugin({"default_output_rate": 24000}, None)  # type: ignore[arg-type]
        self.assertTrue(IEnvelopePlugin.providedBy(plugin))
        self.assertEqual(plugin.name, "audio-resample")

    def test_defaults(self) -> None:
        config = ResampleSettings.fromMapping({})
        self.assertEqual(
            (config.engine_format, config.default_output_rate, config.quality),
            ("pcm_s16le", 0, "HQ"),
        )

    def test_rejected(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"sample_rate": 16000}, "sample_rate"),
            ({"default_output_rate": "24000"}, "default_output_rate"),
            ({"default_output_rate": 100}, "default_output_rate"),
            ({"default_output_rate": True}, "default_output_rate"),
            ({"engine_format": "mp3"}, "engine_format"),
            ({"quality": "best"}, "quality"),
        ]
        for bad, key in cases:
            with self.assertRaises(ValueError) as caught:
                ResampleSettings.fromMapping(bad)
            self.assertIn(key, str(caught.exception))


class NearTestCase(SynchronousTestCase):
    def assertNear(self, value: float, expected: float, delta: float) -> None:
        self.assertTrue(abs(value - expected) <= delta, f"{value} is not {expected} +/- {delta}")


class InputTests(NearTestCase):
    def assertConverted(self, harness: PluginHarness, inputFrames: int, inRate: int) -> np.ndarray:
        self.assertEqual(harness.sentToGame, [])
        [sent] = harness.sentToEngine
        audio = sent["event"]["audio"]
        self.assertEqual(
            (audio["format"], audio["sampleRate"], audio["channels"]), ("pcm_s16le", 16000, 1)
        )
        samples = unb64(audio["data"]).astype(np.float64) / 32768
        self.assertEqual(len(samples), round(inputFrames * 16000 / inRate))
        return samples

    def test_mono_rates(self) -> None:
        for rate in (8000, 22050, 44100, 48000):
            harness, _ = makeHarness()
            wave = tone(440, 0.731, rate)
            audio = {"format": "pcm_s16le", "sampleRate": rate, "channels": 1, "language": "en"}
            replyRequest(harness, audio={**audio, "data": b64(pcm16(wave))})
            out = self.assertConverted(harness, len(wave), rate)
            self.assertNear(dominantFrequency(out, 16000), 440, delta=16000 / len(out))
            self.assertNear(float(np.abs(out).max()), 0.5, delta=0.02)
            self.assertEqual(harness.sentToEngine[0]["event"]["audio"]["language"], "en")

    def test_stereo_is_averaged(self) -> None:
        harness, _ = makeHarness()
        left = tone(300, 0.5, 48000, 0.6)
        right = tone(300, 0.5, 48000, 0.2)
        frames = np.stack([left, right], axis=1).reshape(-1)
        audio = {"format": "s16", "sampleRate": 48000, "channels": 2, "data": b64(pcm16(frames))}
        replyRequest(harness, audio=audio)
        out = self.assertConverted(harness, len(left), 48000)
        self.assertNear(float(np.abs(out[100:-100]).max()), 0.4, delta=0.01)

    def test_opposite_channels_cancel(self) -> None:
        harness, _ = makeHarness()
        left = tone(300, 0.25, 22050)
        frames = np.stack([left, -left], axis=1).reshape(-1)
        audio = {"format": "pcm_s16le", "sampleRate": 22050, "channels": 2}
        replyRequest(harness, audio={**audio, "data": b64(pcm16(frames))})
        out = self.assertConverted(harness, len(left), 22050)
        self.assertLess(float(np.abs(out).max()), 1e-3)

    def test_float_input(self) -> None:
        harness, _ = makeHarness()
        wave = tone(500, 0.4, 44100).astype("<f4")
        audio = {"format": "f32", "sampleRate": 44100, "channels": 1, "data": b64(wave.tobytes())}
        replyRequest(harness, audio=audio)
        out = self.assertConverted(harness, len(wave), 44100)
        self.assertNear(dominantFrequency(out, 16000), 500, delta=16000 / len(out))

    def test_float_engine_format(self) -> None:
        harness, _ = makeHarness(engine_format="pcm_f32le")
        wave = tone(440, 0.3, 48000)
        audio = {
            "format": "pcm_s16le",
            "sampleRate": 48000,
            "channels": 1,
            "data": b64(pcm16(wave)),
        }
        replyRequest(harness, audio=audio)
        sent = harness.sentToEngine[0]["event"]["audio"]
        self.assertEqual((sent["format"], sent["sampleRate"]), ("pcm_f32le", 16000))
        out = unb64(sent["data"], "<f4")
        self.assertEqual(len(out), round(len(wave) * 16000 / 48000))
        self.assertNear(float(np.abs(out).max()), 0.5, delta=0.02)

    def test_conforming_passes_untouched(self) -> None:
        # Float audio at 16 kHz is accepted by RPEngine, so even with the
        # default engine_format it is not re-encoded.
        for fmt, data in [
            ("pcm_s16le", pcm16(tone(440, 0.2, 16000))),
            ("pcm_f32le", tone(440, 0.2, 16000).astype("<f4").tobytes()),
        ]:
            harness, _ = makeHarness()
            audio = {"format": fmt, "sampleRate": 16000, "channels": 1, "data": b64(data)}
            request = replyRequest(harness, audio=dict(audio))
            [sent] = harness.sentToEngine
            self.assertIs(sent, request)
            self.assertEqual(sent["event"]["audio"], audio)

    def test_text_only_passes(self) -> None:
        harness, _ = makeHarness()
        request = replyRequest(harness)
        self.assertEqual(harness.sentToEngine, [request])
        self.assertEqual(request["event"], {"text": "hi"})

    def test_exactly_thirty_seconds_passes(self) -> None:
        harness, _ = makeHarness()
        data = bytes(2 * 8000 * int(MAX_INPUT_AUDIO_SECONDS))
        replyRequest(harness, audio={"format": "pcm_s16le", "sampleRate": 8000, "data": b64(data)})
        self.assertEqual(len(unb64(harness.sentToEngine[0]["event"]["audio"]["data"])), 480000)

    def test_refusals(self) -> None:
        good = {"format": "pcm_s16le", "sampleRate": 16000, "channels": 1}
        cases = [
            ({**good, "data": "not base64!"}, "event.audio.data is not valid base64"),
            (
                {**good, "data": b64(b"\x00\x01\x02")},
                "event.audio.data has 3 bytes, not a whole number of 2-byte frames "
                "(pcm_s16le, 1 channel)",
            ),
            (
                {**good, "channels": 2, "data": b64(bytes(6))},
                "event.audio.data has 6 bytes, not a whole number of 4-byte frames "
                "(pcm_s16le, 2 channels)",
            ),
            (
                {**good, "format": "mp3", "data": b64(bytes(4))},
                "event.audio.format 'mp3' is not supported (expected pcm_s16le or pcm_f32le, "
                "or s16/f32)",
            ),
            (
                {**good, "channels": 6, "data": b64(bytes(12))},
                "event.audio.channels must be 1 or 2, got 6",
            ),
            ({**good, "data": ""}, "event.audio.data is empty"),
            (
                {**good, "sampleRate": 7000, "data": b64(bytes(4))},
                "event.audio.sampleRate must be a whole number from 8000 to 192000, got 7000",
            ),
            (
                {**good, "sampleRate": 8000, "data": b64(bytes(2 * 8000 * 30 + 2))},
                "event.audio is 30.000 s long; RPEngine accepts at most 30 s",
            ),
            (
                {**good, "sampleRate": 48000, "data": b64(bytes(2 * 48000 * 31))},
                "event.audio is 31.000 s long; RPEngine accepts at most 30 s",
            ),
            (
                {**good, "format": "f32", "data": b64(np.array([np.nan], "<f4").tobytes())},
                "event.audio.data holds NaN or infinite pcm_f32le samples",
            ),
            ("a recording", "event.audio must be an object"),
        ]
        for audio, message in cases:
            harness, _ = makeHarness()
            request = replyRequest(harness, requestId="bad", audio=audio)  # type: ignore[arg-type]
            self.assertEqual(harness.sentToEngine, [], message)
            [error] = harness.sentToGame
            self.assertEqual(error.type, "request.error")
            self.assertEqual(
                {k: error.get(k) for k in ("requestId", "sourceMessageId", "code", "retryable")},
                {
                    "requestId": "bad",
                    "sourceMessageId": request.messageId,
                    "code": "invalid_audio",
                    "retryable": False,
                },
            )
            self.assertEqual(error["message"], message)


def streamReply(
    harness: PluginHarness,
    segments: list[tuple[np.ndarray, list[int]]],
    requestId: str = "r1",
    final: bool = True,
) -> None:
    """
    Send RPEngine's audio for a reply: each segment's PCM16 samples cut at
    the given sizes (the last chunk takes the rest).
    """
    harness.toGame(
        "reply.audio.start", requestId=requestId, format="pcm_s16le", sampleRate=44100, channels=1
    )
    sequence = 0
    for segmentSequence, (samples, sizes) in enumerate(segments):
        data = pcm16(samples)
        bounds = np.cumsum([0, *sizes]).tolist()
        bounds = [b for b in bounds if b < len(samples)] + [len(samples)]
        pieces = [data[2 * a : 2 * b] for a, b in zip(bounds, bounds[1:], strict=False)]
        for index, piece in enumerate(pieces):
            fields: dict[str, Any] = {
                "requestId": requestId,
                "sequence": sequence,
                "segmentSequence": segmentSequence,
                "segmentChunkSequence": index,
                "data": b64(piece),
            }
            if final:
                # RPEngine numbers each segment's chunks (src/socket-adapter.ts).
                fields["segmentChunkCount"] = len(pieces)
            harness.toGame("reply.audio.chunk", **fields)
            sequence += 1
    harness.toGame(
        "reply.audio.completed",
        requestId=requestId,
        segmentCount=len(segments),
        chunkCount=sequence,
        totalBytes=sum(2 * len(s) for s, _ in segments),
    )
    harness.toGame("reply.completed", requestId=requestId)


def chunksBySegment(harness: PluginHarness) -> dict[int, list[Envelope]]:
    segments: dict[int, list[Envelope]] = {}
    for envelope in harness.sentToGame:
        if envelope.type == "reply.audio.chunk":
            segments.setdefault(envelope["segmentSequence"], []).append(envelope)
    return segments


def joined(chunks: list[Envelope]) -> np.ndarray:
    return np.concatenate([unb64(c["data"]) for c in chunks])


class OutputTests(SynchronousTestCase):
    @settings(max_examples=60, deadline=None)
    @given(
        rate=st.sampled_from([24000, 16000]),
        segments=st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=20000),
                st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
            ),
            min_size=1,
            max_size=3,
        ),
        final=st.booleans(),
    )
    def test_exact_lengths(
        self, rate: int, segments: list[tuple[int, list[int]]], final: bool
    ) -> None:
        """
        Whatever the chunking, and whether or not RPEngine marks a segment's
        last chunk, each segment comes out exactly round(n * rate / 44100)
        samples long, and the chunks' sequence stays contiguous.
        """
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=rate)
        audio = [
            (tone(220 + 20 * i, n / 44100, 44100, 0.3)[:n], sizes)
            for i, (n, sizes) in enumerate(segments)
        ]
        streamReply(harness, audio, final=final)
        bySegment = chunksBySegment(harness)
        for index, (n, _) in enumerate(segments):
            chunks = bySegment.get(index, [])
            self.assertEqual(sum(c["samples"] for c in chunks), round(n * rate / 44100))
            self.assertEqual(len(joined(chunks)) if chunks else 0, round(n * rate / 44100))
            self.assertTrue(all(c["sampleRate"] == rate for c in chunks))
        sequences = [e["sequence"] for e in harness.sentToGame if e.type == "reply.audio.chunk"]
        self.assertEqual(sequences, list(range(len(sequences))))
        self.assertEqual(harness.typesToGame()[-2:], ["reply.audio.completed", "reply.completed"])
        completed = harness.sentToGame[-2]
        self.assertEqual(completed["chunkCount"], len(sequences))
        self.assertEqual(
            completed["totalBytes"],
            sum(len(base64.b64decode(e["data"])) for e in harness.sentToGame if "data" in e),
        )

    def test_no_discontinuity_at_chunk_edges(self) -> None:
        for rate in (24000, 16000, 48000):
            harness, _ = makeHarness()
            replyRequest(harness, outputRate=rate)
            wave = tone(440, 1.0, 44100, 0.5)
            sizes = [1, 7, 441, 4410, 333, 2000, 17, 9000]
            streamReply(harness, [(wave, sizes)])
            streamed = joined(chunksBySegment(harness)[0]).astype(np.int32)
            oneShot = soxr.resample(
                np.frombuffer(pcm16(wave), "<i2").astype(np.float32) / 32768, 44100, rate, "HQ"
            )
            reference = np.rint(oneShot * 32768).astype(np.int32)
            self.assertEqual(len(streamed), round(len(wave) * rate / 44100))
            common = min(len(streamed), len(reference))
            self.assertLessEqual(int(np.abs(streamed[:common] - reference[:common]).max()), 1)

    def test_start_and_chunk_fields(self) -> None:
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=24000)
        streamReply(harness, [(tone(300, 0.1, 44100), [2205])])
        start = harness.sentToGame[0]
        self.assertEqual((start.type, start["sampleRate"]), ("reply.audio.start", 24000))
        chunks = chunksBySegment(harness)[0]
        self.assertEqual([endsSegment(c.fields) for c in chunks], [False, True])
        self.assertEqual([c["samples"] for c in chunks], [len(unb64(c["data"])) for c in chunks])

    def test_missing_final_sends_tail_chunks(self) -> None:
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=24000)
        first, second = tone(220, 0.3, 44100), tone(240, 0.2, 44100)
        streamReply(harness, [(first, [4410, 4410]), (second, [4410])], final=False)
        types = harness.typesToGame()
        chunks = [e for e in harness.sentToGame if e.type == "reply.audio.chunk"]
        # Three chunks of segment 0 plus its tail, then two of segment 1 plus its tail.
        self.assertEqual([c["segmentSequence"] for c in chunks], [0, 0, 0, 0, 1, 1, 1])
        self.assertEqual([c["sequence"] for c in chunks], list(range(7)))
        self.assertEqual([c["segmentChunkSequence"] for c in chunks], [0, 1, 2, 3, 0, 1, 2])
        self.assertEqual(
            [c.get("segmentChunkCount") for c in chunks], [None] * 3 + [4] + [None] * 2 + [3]
        )
        self.assertEqual(types.index("reply.audio.completed"), len(types) - 2)
        bySegment = chunksBySegment(harness)
        self.assertEqual(len(joined(bySegment[0])), round(len(first) * 24000 / 44100))
        self.assertEqual(len(joined(bySegment[1])), round(len(second) * 24000 / 44100))
        self.assertEqual(harness.sentToGame[-2]["chunkCount"], 7)

    def test_terminal_flushes_mid_segment(self) -> None:
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=16000)
        harness.toGame("reply.audio.start", requestId="r1", sampleRate=44100)
        data = pcm16(tone(300, 0.1, 44100))
        harness.toGame(
            "reply.audio.chunk", requestId="r1", sequence=0, segmentSequence=0, data=b64(data)
        )
        harness.toGame("reply.cancelled", requestId="r1")
        self.assertEqual(
            harness.typesToGame(),
            ["reply.audio.start", "reply.audio.chunk", "reply.audio.chunk", "reply.cancelled"],
        )
        self.assertEqual(len(joined(chunksBySegment(harness)[0])), round(4410 * 16000 / 44100))

    def test_sample_split_across_chunks(self) -> None:
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=24000)
        data = pcm16(tone(300, 0.05, 44100))
        harness.toGame("reply.audio.start", requestId="r1", sampleRate=44100)
        for sequence, (a, b) in enumerate([(0, 1001), (1001, 2999), (2999, len(data))]):
            harness.toGame(
                "reply.audio.chunk",
                requestId="r1",
                sequence=sequence,
                segmentSequence=0,
                final=b == len(data),
                data=b64(data[a:b]),
            )
        self.assertEqual(
            len(joined(chunksBySegment(harness)[0])), round(len(data) / 2 * 24000 / 44100)
        )

    def test_high_tone_is_filtered(self) -> None:
        """
        A 13 kHz tone lies above 24 kHz's Nyquist frequency: streamed to
        24 kHz it must vanish (no alias at 11 kHz), while a 5 kHz tone passes.
        """
        levels = {}
        for frequency in (13000, 5000):
            harness, _ = makeHarness()
            replyRequest(harness, outputRate=24000)
            streamReply(harness, [(tone(frequency, 1.0, 44100, 0.9), [4410] * 10)])
            out = joined(chunksBySegment(harness)[0]).astype(np.float64) / 32768
            levels[frequency] = peakLevelDb(out, 0.9)
        self.assertLess(levels[13000], -85)
        self.assertGreater(levels[5000], -0.5)

    def test_default_rate(self) -> None:
        harness, _ = makeHarness(default_output_rate=16000)
        replyRequest(harness)
        streamReply(harness, [(tone(300, 0.1, 44100), [])])
        self.assertEqual(chunksBySegment(harness)[0][0]["sampleRate"], 16000)
        self.assertEqual(len(joined(chunksBySegment(harness)[0])), 1600)

    def test_untouched_without_rate(self) -> None:
        harness, _ = makeHarness()
        replyRequest(harness)
        data = b64(pcm16(tone(300, 0.1, 44100)))
        harness.toGame("reply.audio.start", requestId="r1", sampleRate=44100)
        harness.toGame(
            "reply.audio.chunk",
            requestId="r1",
            sequence=0,
            segmentSequence=0,
            final=True,
            data=data,
        )
        self.assertEqual(harness.sentToGame[0]["sampleRate"], 44100)
        self.assertEqual(harness.sentToGame[1]["data"], data)
        self.assertNotIn("sampleRate", harness.sentToGame[1])

    def test_state_forgotten(self) -> None:
        harness, plugin = makeHarness()
        replyRequest(harness, requestId="a", outputRate=24000)
        replyRequest(harness, requestId="b", outputRate=24000)
        streamReply(harness, [(tone(300, 0.1, 44100), [])], requestId="a")
        harness.toGame("reply.audio.start", requestId="b", sampleRate=44100)
        harness.endSession()
        # Neither request's rate is remembered now: their audio passes as it is.
        for requestId in ("a", "b"):
            data = b64(pcm16(tone(300, 0.01, 44100)))
            harness.toGame(
                "reply.audio.chunk", requestId=requestId, sequence=9, segmentSequence=0, data=data
            )
            self.assertEqual(harness.sentToGame[-1]["data"], data)
        self.assertEqual((plugin._rates, plugin._replies), ({}, {}))


class CountingResampler(Pcm16Resampler):
    """
    Counts the resamplers made (and so soxr set-ups), in order.
    """

    made: list[tuple[int, int]] = []

    def __init__(self, inRate: int, outRate: int, quality: str = "HQ") -> None:
        super().__init__(inRate, outRate, quality)
        self.made.append((inRate, outRate))


class PreparedTests(SynchronousTestCase):
    """
    Setting up soxr costs about as much as resampling a chunk, so each
    segment's resampler is made ahead: the first at the request, the next
    ones when the reactor is free after a segment began.
    """

    def setUp(self) -> None:
        self.made: list[tuple[int, int]] = []
        self.patch(CountingResampler, "made", self.made)
        self.patch(pcm, "Pcm16Resampler", CountingResampler)

    def chunk(
        self, harness: PluginHarness, sequence: int, segment: int, samples: int, final: bool
    ) -> Envelope:
        harness.toGame(
            "reply.audio.chunk",
            requestId="r1",
            sequence=sequence,
            segmentSequence=segment,
            final=final,
            data=b64(pcm16(tone(300, samples / 44100, 44100)[:samples])),
        )
        return harness.sentToGame[-1]

    def test_made_ahead(self) -> None:
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=24000)
        self.assertEqual(self.made, [(44100, 24000)])
        harness.toGame("reply.audio.start", requestId="r1", sampleRate=44100)
        self.chunk(harness, 0, 0, 4410, final=False)
        # The chunk used the one made at the request; the next is made once
        # the chunk has been written (on a later reactor turn).
        self.assertEqual(len(self.made), 1)
        harness.clock.advance(0)
        self.assertEqual(len(self.made), 1)
        harness.clock.advance(PREPARE_DELAY)
        self.assertEqual(len(self.made), 2)
        self.chunk(harness, 1, 0, 4410, final=True)
        second = self.chunk(harness, 2, 1, 4410, final=True)
        self.assertEqual(len(self.made), 2)
        self.assertEqual(len(unb64(second["data"])), 2400)
        harness.clock.advance(PREPARE_DELAY)
        self.assertEqual(len(self.made), 3)
        self.chunk(harness, 3, 2, 4410, final=True)
        harness.toGame("reply.completed", requestId="r1")
        # Nothing is made for a reply that ended, nor left waiting to be.
        self.assertEqual(harness.clock.getDelayedCalls(), [])
        harness.clock.advance(PREPARE_DELAY)
        self.assertEqual(len(self.made), 3)

    def test_session_end_cancels(self) -> None:
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=16000)
        harness.toGame("reply.audio.start", requestId="r1", sampleRate=44100)
        self.chunk(harness, 0, 0, 4410, final=False)
        self.assertEqual(len(harness.clock.getDelayedCalls()), 1)
        harness.endSession()
        self.assertEqual(harness.clock.getDelayedCalls(), [])

    def test_other_input_rate(self) -> None:
        """
        A reply whose speech comes at another rate than RPEngine's usual
        44.1 kHz does not use the resampler made for 44.1 kHz.
        """
        harness, _ = makeHarness()
        replyRequest(harness, outputRate=24000)
        harness.toGame("reply.audio.start", requestId="r1", sampleRate=22050)
        chunk = self.chunk(harness, 0, 0, 2205, final=True)
        self.assertEqual(self.made, [(44100, 24000), (22050, 24000)])
        self.assertEqual(len(unb64(chunk["data"])), exactLength(2205, 22050, 24000))

    def test_none_without_conversion(self) -> None:
        harness, plugin = makeHarness()
        replyRequest(harness)
        replyRequest(harness, requestId="r2", outputRate=44100)
        self.assertEqual(self.made, [])
        self.assertEqual(plugin._replies.get("r1"), None)

    def test_refused_request_keeps_nothing(self) -> None:
        harness, plugin = makeHarness()
        audio = {"format": "pcm_s16le", "sampleRate": 16000, "data": "not base64!"}
        replyRequest(harness, audio=audio, outputRate=24000)
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual((plugin._rates, plugin._replies), ({}, {}))


class HelperTests(SynchronousTestCase):
    @settings(max_examples=100, deadline=None)
    @given(
        inRate=st.sampled_from([44100, 48000, 22050, 16000]),
        outRate=st.sampled_from([24000, 16000, 22050, 48000, 44100]),
        sizes=st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
    )
    def test_stream_exact(self, inRate: int, outRate: int, sizes: list[int]) -> None:
        stream = StreamResampler(inRate, outRate)
        rng = np.random.default_rng(len(sizes))
        total = 0
        for size in sizes:
            stream.feed(rng.standard_normal(size).astype(np.float32) * 0.1)
            total += size
            self.assertLessEqual(stream.samplesOut, exactLength(total, inRate, outRate))
        stream.flush()
        self.assertEqual(stream.samplesOut, exactLength(total, inRate, outRate))

    def test_pcm16_stream(self) -> None:
        """
        L{Pcm16Resampler} gives, in PCM16, what L{StreamResampler} gives for
        the same chunks: C{last} is a feed and a flush in one.
        """
        chunks = [pcm16(tone(300, 0.1, 44100)[offset::7]) for offset in range(4)]
        plain = StreamResampler(44100, 24000)
        expected = [encodePcm(plain.feed(decodePcm(c, "pcm_s16le")), "pcm_s16le") for c in chunks]
        expected[-1] += encodePcm(plain.flush(), "pcm_s16le")
        pcm16Stream = Pcm16Resampler(44100, 24000)
        got = [pcm16Stream.feed(c) for c in chunks[:-1]] + [pcm16Stream.feed(chunks[-1], last=True)]
        self.assertEqual(got, expected)
        self.assertEqual(pcm16Stream.flush(), b"")
        self.assertEqual(
            len(b"".join(got)) // 2, exactLength(sum(len(c) for c in chunks) // 2, 44100, 24000)
        )

    def test_exact_length_rounds_half_even(self) -> None:
        self.assertEqual(exactLength(5, 44100, 22050), 2)
        self.assertEqual(exactLength(7, 44100, 22050), 4)
        self.assertEqual(len(resample(np.zeros(5, np.float32), 44100, 22050)), 2)

    @settings(max_examples=300, deadline=None)
    @given(
        inputSamples=st.integers(min_value=0, max_value=10**12),
        inRate=st.integers(min_value=1, max_value=384000),
        outRate=st.integers(min_value=1, max_value=384000),
    )
    def test_exact_length_is_rounded_ratio(
        self, inputSamples: int, inRate: int, outRate: int
    ) -> None:
        self.assertEqual(
            exactLength(inputSamples, inRate, outRate),
            round(Fraction(inputSamples * outRate, inRate)),
        )

    def test_decode_pcm16_every_value(self) -> None:
        every = np.arange(-32768, 32768, dtype="<i2")
        decoded = decodePcm(every.tobytes(), "pcm_s16le")
        self.assertEqual(decoded.dtype, np.float32)
        np.testing.assert_array_equal(decoded, every.astype(np.float64) / 32768)
        self.assertEqual(encodePcm(decoded, "pcm_s16le"), every.tobytes())

    @settings(max_examples=200, deadline=None)
    @given(
        samples=hnp.arrays(
            np.float32,
            st.integers(min_value=0, max_value=64),
            elements=st.one_of(
                st.floats(-1.5, 1.5, width=32),
                # Exactly half-way between two PCM16 values, and the clip edges.
                st.integers(-65538, 65538).map(lambda k: np.float32((k + 0.5) / 65536)),
                st.sampled_from([np.float32(v) for v in (-1.0, 1.0, 32767.5 / 32768)]),
            ),
        ),
    )
    def test_encode_pcm16_as_float64(self, samples: np.ndarray) -> None:
        """
        Float32 samples encode to what rounding their exact float64 values
        gives (halves to even), clipped to PCM16.
        """
        reference = np.clip(np.rint(samples.astype(np.float64) * 32768), -32768, 32767)
        self.assertEqual(encodePcm(samples, "pcm_s16le"), reference.astype("<i2").tobytes())
        self.assertEqual(
            encodePcm(samples.astype(np.float64), "pcm_s16le"), reference.astype("<i2").tobytes()
        )

    def test_stream_any_layout(self) -> None:
        """
        Float64 and strided pieces are taken too; the output is float32 and
        the same as for contiguous float32 pieces.
        """
        wave = tone(440, 0.2, 44100).astype(np.float32)
        plain = StreamResampler(44100, 24000)
        other = StreamResampler(44100, 24000)
        interleaved = np.stack([wave, np.zeros_like(wave)], axis=1).reshape(-1)
        a = np.concatenate([plain.feed(wave[:3000]), plain.feed(wave[3000:]), plain.flush()])
        b = np.concatenate(
            [
                other.feed(wave[:3000].astype(np.float64)),
                other.feed(interleaved[6000::2]),
                other.flush(),
            ]
        )
        self.assertEqual((a.dtype, b.dtype), (np.float32, np.float32))
        np.testing.assert_array_equal(a, b)
        self.assertEqual(len(a), exactLength(len(wave), 44100, 24000))

    @settings(max_examples=1000, deadline=None)
    @given(
        data=st.binary(max_size=64),
        position=st.integers(min_value=0, max_value=100),
        stray=st.sampled_from(list(" \n=!-_.\x00é") + ["==", "A", "AB", "A=", "AA=="]),
    )
    def test_base64_strict_as_the_standard_library(
        self, data: bytes, position: int, stray: str
    ) -> None:
        """
        The fast base64 decoder accepts exactly what
        C{base64.b64decode(validate=True)} accepts, with the same bytes: a
        stray character is an error, never skipped.
        """
        text = encodeBase64(data)
        self.assertEqual(text, base64.b64encode(data).decode("ascii"))
        self.assertEqual(strictBase64(text), data)
        spoiled = text[:position] + stray + text[position:]
        try:
            expected: bytes | None = base64.b64decode(spoiled, validate=True)
        except ValueError:
            expected = None
        try:
            got: bytes | None = strictBase64(spoiled)
        except ValueError:
            got = None
        self.assertEqual(got, expected)
        if expected is None:
            self.assertRaises(AudioError, decodeBase64, spoiled)

    def test_stream_without_soxr_internals(self) -> None:
        """
        Should python-soxr stop keeping the bound C++ method that
        resample_chunk calls, its public resample_chunk is used, with the
        same result.
        """

        real = soxr.ResampleStream

        class PublicOnly:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.stream = real(*args, **kwargs)

            def resample_chunk(self, x: np.ndarray, last: bool = False) -> np.ndarray:
                return self.stream.resample_chunk(x, last)

        wave = tone(440, 0.2, 44100).astype(np.float32)
        fast = StreamResampler(44100, 16000)
        self.patch(soxr, "ResampleStream", PublicOnly)
        public = StreamResampler(44100, 16000)
        a = np.concatenate([fast.feed(wave[:4410]), fast.feed(wave[4410:]), fast.flush()])
        b = np.concatenate([public.feed(wave[:4410]), public.feed(wave[4410:]), public.flush()])
        np.testing.assert_array_equal(a, b)
        self.assertEqual(len(b), exactLength(len(wave), 44100, 16000))
