"""
Recordings in: WAV at the common rates and widths, stereo, float, WebM/Opus
and Ogg/Opus; and every way a recording can be refused.
"""

from __future__ import annotations

import base64
import io
import sys
import wave

import numpy as np
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.audio.format import base64Bytes
from rpmiddleware.audio.format import pcm16Wav as wavBytes
from rpmiddleware.client.decode import decodeAudio, sniff
from rpmiddleware.protocol.clienterrors import AudioDecodeError
from tests.support.client import opusBase64, tone, wavBase64


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class WavTests(SynchronousTestCase):
    def test_rates(self) -> None:
        for rate in (8000, 16000, 22050, 44100, 48000):
            decoded = decodeAudio(wavBase64(rate, 1.0))
            self.assertEqual((decoded.sampleRate, decoded.channels), (rate, 1))
            self.assertEqual(decoded.frames.shape, (rate,))
            self.assertEqual(decoded.container, "wav")
            expected = tone(rate, 1.0)
            self.assertLess(float(np.max(np.abs(decoded.frames - expected))), 1e-3)

    def test_stereo(self) -> None:
        decoded = decodeAudio(wavBase64(44100, 0.5, channels=2))
        self.assertEqual(decoded.channels, 2)
        self.assertEqual(decoded.frames.shape, (22050, 2))
        # The channels are kept apart for the resample plugin to mix.
        self.assertGreater(float(np.max(np.abs(decoded.frames[:, 0] - decoded.frames[:, 1]))), 0.01)

    def test_32bit(self) -> None:
        decoded = decodeAudio(wavBase64(16000, 0.25, width=4))
        self.assertLess(float(np.max(np.abs(decoded.frames - tone(16000, 0.25)))), 1e-6)

    def test_24bit(self) -> None:
        samples = tone(16000, 0.1)
        ints = np.round(samples * (2**23 - 1)).astype(np.int32)
        raw = np.stack([ints & 0xFF, (ints >> 8) & 0xFF, (ints >> 16) & 0xFF], axis=1)
        out = io.BytesIO()
        with wave.open(out, "wb") as writer:
            writer.setnchannels(1)
            writer.setsampwidth(3)
            writer.setframerate(16000)
            writer.writeframes(raw.astype(np.uint8).tobytes())
        decoded = decodeAudio(b64(out.getvalue()))
        self.assertLess(float(np.max(np.abs(decoded.frames - samples))), 1e-6)

    def test_floatWavThroughPyAV(self) -> None:
        """
        A float WAV (which the stdlib cannot read) is decoded by FFmpeg.
        """
        import av

        out = io.BytesIO()
        with av.open(out, mode="w", format="wav") as sink:
            stream = sink.add_stream("pcm_f32le", rate=22050)
            stream.layout = "mono"  # type: ignore[union-attr]
            frame = av.AudioFrame.from_ndarray(
                tone(22050, 0.5).astype(np.float32)[None, :], format="flt", layout="mono"
            )
            frame.sample_rate = 22050
            for packet in stream.encode(frame):  # type: ignore[union-attr]
                sink.mux(packet)
            for packet in stream.encode(None):  # type: ignore[union-attr]
                sink.mux(packet)
        decoded = decodeAudio(b64(out.getvalue()))
        self.assertEqual((decoded.sampleRate, len(decoded.frames)), (22050, 11025))

    def test_dataUri(self) -> None:
        decoded = decodeAudio("data:audio/wav;base64," + wavBase64(16000, 0.1))
        self.assertEqual(len(decoded.frames), 1600)

    def test_eventAudio(self) -> None:
        decoded = decodeAudio(wavBase64(48000, 0.5, channels=2))
        audio = decoded.eventAudio("ja")
        self.assertEqual(
            {k: v for k, v in audio.items() if k != "data"},
            {"format": "pcm_s16le", "sampleRate": 48000, "channels": 2, "language": "ja"},
        )
        self.assertEqual(base64Bytes(audio["data"]), 24000 * 2 * 2)
        self.assertNotIn("language", decoded.eventAudio())

    def test_exactlyThirtySeconds(self) -> None:
        self.assertEqual(decodeAudio(wavBase64(8000, 30.0)).seconds, 30.0)


class OpusTests(SynchronousTestCase):
    def test_webm(self) -> None:
        decoded = decodeAudio(opusBase64("webm", 1.0))
        self.assertEqual(
            (decoded.container, decoded.sampleRate, decoded.channels), ("webm", 48000, 1)
        )
        self.assertLess(abs(decoded.seconds - 1.0), 0.03)
        # A tone at 0.3 survives Opus at roughly that level.
        self.assertLess(abs(float(np.max(np.abs(decoded.frames))) - 0.3), 0.05)

    def test_ogg(self) -> None:
        decoded = decodeAudio(opusBase64("ogg", 1.0))
        self.assertEqual(
            (decoded.container, decoded.sampleRate, decoded.channels), ("ogg", 48000, 1)
        )
        self.assertLess(abs(decoded.seconds - 1.0), 0.03)

    def test_stereo(self) -> None:
        decoded = decodeAudio(opusBase64("ogg", 0.5, channels=2))
        self.assertEqual(decoded.channels, 2)
        self.assertEqual(decoded.frames.shape[1], 2)

    def test_tooLongStopsEarly(self) -> None:
        with self.assertRaises(AudioDecodeError) as caught:
            decodeAudio(opusBase64("ogg", 31.0))
        self.assertEqual(caught.exception.code, "AUDIO_PROCESSING_ERROR")
        self.assertIn("at most 30 s", caught.exception.message)


class RefusalTests(SynchronousTestCase):
    def refused(self, data: str) -> AudioDecodeError:
        with self.assertRaises(AudioDecodeError) as caught:
            decodeAudio(data)
        return caught.exception

    def test_refusals(self) -> None:
        cases = [
            ("not base64!", "INVALID_AUDIO_FORMAT", "not valid base64"),
            ("", "AUDIO_PROCESSING_ERROR", "empty"),
            ("data:audio/wav,plain", "INVALID_AUDIO_FORMAT", "not a base64 one"),
            (b64(b"ID3\x03mp3 bytes here"), "INVALID_AUDIO_FORMAT", "not WAV, WebM or Ogg"),
            (b64(b"OggS" + b"\x00" * 60), "AUDIO_PROCESSING_ERROR", "could not be decoded"),
            (
                b64(b"\x1a\x45\xdf\xa3" + b"\x00" * 60),
                "AUDIO_PROCESSING_ERROR",
                "could not be decoded",
            ),
            (wavBase64(8000, 30.5), "AUDIO_PROCESSING_ERROR", "longer than RPEngine accepts"),
            (b64(wavBytes(b"", 16000)), "AUDIO_PROCESSING_ERROR", "no audio samples"),
        ]
        for data, code, words in cases:
            error = self.refused(data)
            self.assertEqual(error.code, code, words)
            self.assertIn(words, error.message)

    def test_rateOutOfRange(self) -> None:
        error = self.refused(wavBase64(4000, 0.1))
        self.assertEqual(error.code, "INVALID_AUDIO_FORMAT")
        self.assertIn("4000 Hz", error.message)

    def test_withoutPyAV(self) -> None:
        """
        Without PyAV, Opus is refused with the reason and PCM WAV still works.
        """
        ogg = opusBase64("ogg", 0.2)
        saved = sys.modules.get("av")
        sys.modules["av"] = None  # type: ignore[assignment]

        def restore() -> None:
            if saved is None:
                sys.modules.pop("av", None)
            else:
                sys.modules["av"] = saved

        self.addCleanup(restore)
        error = self.refused(ogg)
        self.assertEqual(error.code, "INVALID_AUDIO_FORMAT")
        self.assertIn("PyAV is not installed", error.message)
        self.assertEqual(decodeAudio(wavBase64(16000, 0.1)).sampleRate, 16000)

    def test_sniff(self) -> None:
        self.assertEqual(sniff(b"RIFF\0\0\0\0WAVEfmt "), "wav")
        self.assertEqual(sniff(b"\x1a\x45\xdf\xa3...."), "webm")
        self.assertEqual(sniff(b"OggS...."), "ogg")
        with self.assertRaises(AudioDecodeError):
            sniff(b"RIFF\0\0\0\0AVI ")
