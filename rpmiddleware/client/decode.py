"""
Turning a client's recording (base64 WAV, WebM/Opus or Ogg/Opus) into PCM.

The container is recognised by its first bytes and opened with that format
forced: FFmpeg is never asked to guess from untrusted bytes, and only the
three containers the protocol names are parsed at all.  PCM WAV, the common
case, is read with the stdlib C{wave} module and numpy; anything else in a
WAV (float, extensible) and both Opus containers go through PyAV.

Decoding stops as soon as the recording is longer than RPEngine accepts
(30 s), so an 8 MiB Opus file (hours of speech) costs no more than 30 s of
it.  The result goes to RPEngine as C{event.audio} pcm_s16le at the decoded
rate and channel count; the audio-resample plugin makes that 16 kHz mono.

Errors carry the client code: INVALID_AUDIO_FORMAT when the bytes are not a
format we take, AUDIO_PROCESSING_ERROR when a format we take could not be
turned into usable audio (corrupt, empty, too long).

This module needs numpy, so the endpoint imports it at the first recording,
in the decoding thread (L{rpmiddleware.client.websocket.ClientFactory.decode}),
not at start; the other client modules name L{DecodedAudio} only as a type,
and L{AudioDecodeError} is in L{rpmiddleware.protocol.clienterrors}.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rpmiddleware.audio.format import encodeBase64, strictBase64
from rpmiddleware.audio.pcm import encodePcm, toMono
from rpmiddleware.protocol.clienterrors import (
    AUDIO_PROCESSING_ERROR,
    INVALID_AUDIO_FORMAT,
    AudioDecodeError,
)
from rpmiddleware.protocol.messages import MAX_INPUT_AUDIO_SECONDS

#: Codec padding (an Opus frame is 20 ms) past 30 s that is trimmed, not refused.
LENGTH_TOLERANCE = 0.1
MIN_RATE = 8000
MAX_RATE = 192000

Frames = npt.NDArray[np.float32]


@dataclass(frozen=True)
class DecodedAudio:
    """
    Float frames in -1..1: shape C{(n,)} mono or C{(n, 2)} stereo.
    """

    frames: Frames
    sampleRate: int
    channels: int
    container: str
    #: The frames as base64 pcm_s16le, made with them (in the decoding
    #: thread: for 30 s of stereo it is tens of milliseconds).
    pcmBase64: str = ""

    @property
    def seconds(self) -> float:
        return len(self.frames) / self.sampleRate

    def eventAudio(self, language: str | None = None) -> dict[str, Any]:
        """
        RPEngine's C{event.audio} object for this recording, before the
        audio-resample plugin converts it.
        """
        audio: dict[str, Any] = {
            "format": "pcm_s16le",
            "sampleRate": self.sampleRate,
            "channels": self.channels,
            "data": self.pcmBase64 or encodeBase64(encodePcm(self.frames.reshape(-1), "pcm_s16le")),
        }
        if language is not None:
            audio["language"] = language
        return audio


def decodeBase64Audio(text: str) -> bytes:
    """
    The bytes of a base64 recording, with or without a C{data:} URI prefix.
    """
    if text.startswith("data:"):
        comma = text.find(",")
        if comma < 0 or ";base64" not in text[:comma]:
            raise AudioDecodeError(
                INVALID_AUDIO_FORMAT, "audio.data is a data URI but not a base64 one"
            )
        text = text[comma + 1 :]
    try:
        raw = strictBase64(text)
    except ValueError:
        raise AudioDecodeError(INVALID_AUDIO_FORMAT, "audio.data is not valid base64")
    if not raw:
        raise AudioDecodeError(AUDIO_PROCESSING_ERROR, "audio.data is empty")
    return raw


def sniff(raw: bytes) -> str:
    """
    The container of a recording from its first bytes: C{wav}, C{webm} or C{ogg}.
    """
    if raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
        return "wav"
    if raw[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    if raw[:4] == b"OggS":
        return "ogg"
    raise AudioDecodeError(
        INVALID_AUDIO_FORMAT,
        "audio.data is not WAV, WebM or Ogg (the recording starts with "
        f"{raw[:8].hex(' ')}); send WAV, WebM/Opus or Ogg/Opus",
    )


def decodeAudio(data: str) -> DecodedAudio:
    """
    Decode a client's base64 recording.  Pure and blocking: the endpoint
    runs it in the reactor's thread pool.

    @raise AudioDecodeError: saying what was wrong, with the client code.
    """
    raw = decodeBase64Audio(data)
    container = sniff(raw)
    if container == "wav":
        try:
            frames, rate = _readPcmWav(raw)
        except wave.Error:
            # Not integer PCM (float, extensible, compressed): FFmpeg reads those.
            frames, rate = _readWithAv(raw, "wav")
    else:
        frames, rate = _readWithAv(raw, container)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioDecodeError(
            INVALID_AUDIO_FORMAT,
            f"the recording's sample rate {rate} Hz is outside {MIN_RATE}-{MAX_RATE} Hz",
        )
    if frames.ndim == 2 and frames.shape[1] > 2:
        frames = toMono(frames)
    if not len(frames):
        raise AudioDecodeError(AUDIO_PROCESSING_ERROR, "the recording holds no audio samples")
    frames = _withinLimit(frames, rate)
    channels = 1 if frames.ndim == 1 else int(frames.shape[1])
    frames = np.ascontiguousarray(frames, dtype=np.float32)
    pcm = encodeBase64(encodePcm(frames.reshape(-1), "pcm_s16le"))
    return DecodedAudio(frames, rate, channels, container, pcm)


def _tooLong(seconds: float) -> AudioDecodeError:
    return AudioDecodeError(
        AUDIO_PROCESSING_ERROR,
        f"the recording is longer than RPEngine accepts ({seconds:.2f} s; at most "
        f"{MAX_INPUT_AUDIO_SECONDS:g} s)",
    )


def _limitFrames(rate: int) -> int:
    return int((MAX_INPUT_AUDIO_SECONDS + LENGTH_TOLERANCE) * rate)


def _withinLimit(frames: Frames, rate: int) -> Frames:
    """
    Trim codec padding just past 30 s; refuse anything longer.
    """
    if len(frames) > _limitFrames(rate):
        raise _tooLong(len(frames) / rate)
    return frames[: int(MAX_INPUT_AUDIO_SECONDS * rate)]


def _readPcmWav(raw: bytes) -> tuple[Frames, int]:
    with wave.open(io.BytesIO(raw), "rb") as reader:
        channels = reader.getnchannels()
        width = reader.getsampwidth()
        rate = reader.getframerate()
        count = reader.getnframes()
        if rate and count > _limitFrames(rate):
            raise _tooLong(count / rate)
        if channels < 1 or width not in (1, 2, 3, 4):
            raise AudioDecodeError(
                INVALID_AUDIO_FORMAT,
                f"the WAV has {channels} channels of {width * 8}-bit samples; "
                "send 8, 16, 24 or 32-bit PCM",
            )
        data = reader.readframes(count)
    usable = len(data) - len(data) % (width * channels)
    data = data[:usable]
    if width == 1:
        samples = (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:
        bytes3 = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3)
        wide = (
            bytes3[:, 0].astype(np.int32)
            | (bytes3[:, 1].astype(np.int32) << 8)
            | (bytes3[:, 2].astype(np.int32) << 16)
        )
        wide = np.where(wide >= 1 << 23, wide - (1 << 24), wide)
        samples = wide.astype(np.float32) / float(1 << 23)
    else:
        samples = (np.frombuffer(data, dtype="<i4").astype(np.float64) / float(1 << 31)).astype(
            np.float32
        )
    if channels > 1:
        return samples.reshape(-1, channels), rate
    return samples, rate


def _readWithAv(raw: bytes, container: str) -> tuple[Frames, int]:
    try:
        # Imported here: the endpoint starts, and takes PCM WAV, without PyAV.
        import av
    except ImportError:
        raise AudioDecodeError(
            INVALID_AUDIO_FORMAT,
            f"this installation cannot decode {container.upper()} audio (PyAV is not "
            "installed); send 16-bit PCM WAV",
        )

    try:
        with av.open(io.BytesIO(raw), mode="r", format=container) as source:
            streams = source.streams.audio
            if not streams:
                raise AudioDecodeError(
                    INVALID_AUDIO_FORMAT, f"the {container.upper()} file has no audio stream"
                )
            stream = streams[0]
            pieces: list[Frames] = []
            rate = 0
            total = 0
            converter = av.AudioResampler(format="flt")
            for frame in source.decode(stream):
                if not rate:
                    rate = frame.sample_rate
                elif frame.sample_rate != rate:
                    raise AudioDecodeError(
                        AUDIO_PROCESSING_ERROR, "the recording changes sample rate midway"
                    )
                for packed in converter.resample(frame):
                    channels = len(packed.layout.channels)
                    block = np.asarray(packed.to_ndarray(), dtype=np.float32).reshape(-1, channels)
                    pieces.append(block)
                    total += len(block)
                if rate and total > _limitFrames(rate):
                    raise _tooLong(total / rate)
            for packed in converter.resample(None):
                channels = len(packed.layout.channels)
                tail = np.asarray(packed.to_ndarray(), dtype=np.float32)
                pieces.append(tail.reshape(-1, channels))
    except AudioDecodeError:
        raise
    except Exception as e:
        # FFmpeg's errors, and whatever else corrupt input provokes: the
        # recording is unusable either way, and the client is told why.
        raise AudioDecodeError(
            AUDIO_PROCESSING_ERROR, f"the {container.upper()} recording could not be decoded: {e}"
        )
    if not pieces or not rate:
        raise AudioDecodeError(AUDIO_PROCESSING_ERROR, "the recording holds no audio samples")
    widths = {p.shape[1] for p in pieces}
    if len(widths) != 1:
        raise AudioDecodeError(AUDIO_PROCESSING_ERROR, "the recording changes channel count midway")
    frames = np.concatenate(pieces).astype(np.float32, copy=False)
    if frames.shape[1] == 1:
        frames = frames[:, 0]
    return frames, rate
