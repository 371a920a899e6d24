"""
Synthetic audio for the RPEngine simulator.

RPEngine's speech is 44.1 kHz mono PCM16; the simulator stands in for it with
sine tones whose pitch tells segments apart, so a test (or a person listening
to a demo) can hear and check which sentence a chunk belongs to.  Input audio
for C{event.audio} is generated here too, so tests build valid and invalid
recordings without fixture files.
"""

from __future__ import annotations

import math

import numpy as np

#: RPEngine's speech output format (the seed: 44.1 kHz mono PCM16).
OUTPUT_SAMPLE_RATE = 44100
OUTPUT_FORMAT = "pcm_s16le"
#: Bytes per sample of each input format the seed accepts.
SAMPLE_WIDTHS = {"pcm_s16le": 2, "pcm_f32le": 4}

_FADE_SECONDS = 0.005


def segmentFrequency(segmentSequence: int) -> float:
    """
    The pitch of one sentence segment: 220 Hz, 20 Hz higher per segment, so
    neighbouring segments are audibly and spectrally distinct.
    """
    return 220.0 + 20.0 * segmentSequence


def sampleCount(seconds: float, sampleRate: int = OUTPUT_SAMPLE_RATE) -> int:
    """
    How many samples C{seconds} of audio has (rounded; never negative).
    """
    return max(0, int(round(seconds * sampleRate)))


def sineTone(
    frequency: float,
    seconds: float,
    amplitude: float = 0.3,
    sampleRate: int = OUTPUT_SAMPLE_RATE,
) -> bytes:
    """
    A mono PCM16 little-endian sine tone with 5 ms fades, so consecutive
    segments played back to back do not click.
    """
    count = sampleCount(seconds, sampleRate)
    t = np.arange(count, dtype=np.float64) / sampleRate
    wave = amplitude * np.sin(2.0 * math.pi * frequency * t)
    fade = min(count // 2, sampleCount(_FADE_SECONDS, sampleRate))
    if fade > 0:
        ramp = np.linspace(0.0, 1.0, fade, endpoint=False)
        wave[:fade] *= ramp
        wave[count - fade :] *= ramp[::-1]
    return (np.clip(wave, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def splitSamples(pcm: bytes, chunkSamples: int, sampleWidth: int = 2) -> list[bytes]:
    """
    Cut PCM into chunks of C{chunkSamples} samples; the last may be shorter.
    Empty audio gives one empty chunk, so every segment has a final chunk.
    """
    if chunkSamples <= 0:
        raise ValueError("chunkSamples must be positive")
    step = chunkSamples * sampleWidth
    return [pcm[i : i + step] for i in range(0, len(pcm), step)] or [b""]


def inputDuration(data: bytes, format: str, sampleRate: int, channels: int = 1) -> float:
    """
    Seconds of audio in raw input PCM of the given format.
    """
    return len(data) / (SAMPLE_WIDTHS[format] * sampleRate * channels)


def inputRecording(seconds: float, format: str = "pcm_s16le", sampleRate: int = 16000) -> bytes:
    """
    A mono recording to put in C{event.audio.data} (before base64): a quiet
    voice-band tone of the given length, in either input format.
    """
    count = sampleCount(seconds, sampleRate)
    t = np.arange(count, dtype=np.float64) / sampleRate
    wave = 0.2 * np.sin(2.0 * math.pi * 180.0 * t)
    if format == "pcm_f32le":
        return wave.astype("<f4").tobytes()
    if format == "pcm_s16le":
        return (wave * 32767.0).astype("<i2").tobytes()
    raise ValueError(f"unknown input format {format!r}")


def pcm16Samples(data: bytes) -> np.ndarray:
    """
    PCM16 little-endian bytes as an array of int16 samples (for assertions).
    """
    return np.frombuffer(data, dtype="<i2")
