"""
Benchmark: the audio-resample plugin's streaming path against other resamplers.

For 44.1 -> 24 kHz (RPEngine speech to a 24 kHz game) and 48 -> 16 kHz (a
48 kHz recording to RPEngine's input rate) this measures, per method:

- the real-time factor (processing seconds per second of audio; lower is
  faster), the median of several runs, and its ratio to soxr one-shot
  measured in the same run, so that machines of different speed compare;
- aliasing: the strongest output component left by a tone above the new
  Nyquist frequency, in dB relative to that tone (more negative is better).

Run from the repository root::

    python bench/resample.py [--runs 21] [--seconds 10]

It prints a markdown table and writes it to docs/benchmarks/resample.md.
"""

from __future__ import annotations

import argparse
import base64
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import scipy
import scipy.signal
import soxr
from scipy.signal.windows import blackmanharris

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rpmiddleware.audio.pcm import StreamResampler  # noqa: E402
from rpmiddleware.builtin.audio_resample import AudioResample, ResampleSettings  # noqa: E402
from rpmiddleware.testing.kit import PluginHarness  # noqa: E402

#: A method given the input once returns the call to time and the call that
#: then gives its output; preparing the input (for the plugin: PCM16 chunk
#: envelopes, base64 and all, as RPEngine would send them) is not timed.
Method = Callable[[np.ndarray, int, int], tuple[Callable[[], Any], Callable[[], np.ndarray]]]
CHUNK_SECONDS = 0.1
#: (input rate, output rate, a tone above the output's Nyquist frequency)
CONVERSIONS = [(44100, 24000, 13000.0), (48000, 16000, 10000.0)]


def plain(function: Callable[[np.ndarray, int, int], np.ndarray]) -> Method:
    """
    A method that is one call on the whole float signal.
    """

    def method(samples: np.ndarray, inRate: int, outRate: int) -> Any:
        result: list[np.ndarray] = []

        def run() -> None:
            result[:] = [function(samples, inRate, outRate)]

        return run, lambda: result[0]

    method.__doc__ = function.__doc__
    return method


@plain
def streamed(samples: np.ndarray, inRate: int, outRate: int) -> np.ndarray:
    """
    rpmiddleware.audio.pcm.StreamResampler fed 100 ms pieces, as the plugin does.
    """
    stream = StreamResampler(inRate, outRate, "HQ")
    step = int(inRate * CHUNK_SECONDS)
    pieces = [stream.feed(samples[i : i + step]) for i in range(0, len(samples), step)]
    return np.concatenate([*pieces, stream.flush()])


def plugin(
    samples: np.ndarray, inRate: int, outRate: int
) -> tuple[Callable[[], None], Callable[[], np.ndarray]]:
    """
    The whole plugin path: base64 PCM16 chunk envelopes through a chain, as
    RPEngine sends them (built beforehand) and as the game gets them (read
    afterwards).
    """
    pcm = np.clip(np.rint(samples * 32768), -32768, 32767).astype("<i2").tobytes()
    step = 2 * int(inRate * CHUNK_SECONDS)
    harness = PluginHarness(AudioResample(ResampleSettings(default_output_rate=outRate)))
    harness.startSession()
    start = harness.envelope(
        "reply.audio.start", requestId="b", format="pcm_s16le", sampleRate=inRate
    )
    chunks = [
        harness.envelope(
            "reply.audio.chunk",
            requestId="b",
            sequence=sequence,
            segmentSequence=0,
            final=offset + step >= len(pcm),
            data=base64.b64encode(pcm[offset : offset + step]).decode("ascii"),
        )
        for sequence, offset in enumerate(range(0, len(pcm), step))
    ]

    def run() -> None:
        harness.toGame(start)
        for chunk in chunks:
            harness.toGame(chunk)

    def output() -> np.ndarray:
        sent = harness.sentToGame
        data = b"".join(base64.b64decode(e["data"]) for e in sent if "data" in e)
        return np.frombuffer(data, "<i2").astype(np.float64) / 32768

    return run, output


@plain
def oneShot(samples: np.ndarray, inRate: int, outRate: int) -> np.ndarray:
    return soxr.resample(samples, inRate, outRate, quality="HQ")


@plain
def polyphase(samples: np.ndarray, inRate: int, outRate: int) -> np.ndarray:
    g = math.gcd(inRate, outRate)
    return scipy.signal.resample_poly(samples, outRate // g, inRate // g)


@plain
def linear(samples: np.ndarray, inRate: int, outRate: int) -> np.ndarray:
    count = round(len(samples) * outRate / inRate)
    positions = np.arange(count) * (inRate / outRate)
    return np.interp(positions, np.arange(len(samples)), samples)


PLUGIN = "audio-resample plugin (chunk envelopes, base64, PCM16)"
STREAM = "StreamResampler, 100 ms pieces (soxr HQ stream)"
ONE_SHOT = "soxr.resample one-shot (HQ)"
METHODS: list[tuple[str, Method]] = [
    (PLUGIN, plugin),
    (STREAM, streamed),
    (ONE_SHOT, oneShot),
    ("scipy.signal.resample_poly", polyphase),
    ("numpy.interp (linear)", linear),
]


def tone(frequency: float, seconds: float, rate: int, amplitude: float) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * math.pi * frequency * t)).astype(np.float32)


def aliasDb(method: Method, inRate: int, outRate: int, frequency: float) -> float:
    run, output = method(tone(frequency, 1.0, inRate, 0.5), inRate, outRate)
    run()
    out = np.asarray(output(), np.float64)
    window = blackmanharris(len(out))
    amplitude = np.abs(np.fft.rfft(out * window)) * 2 / window.sum()
    return 20 * math.log10(max(float(amplitude.max()), 1e-15) / 0.5)


def timeOnce(method: Method, samples: np.ndarray, inRate: int, outRate: int) -> float:
    run, _ = method(samples, inRate, outRate)
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(runs: int, seconds: float) -> list[tuple[str, str, float, float, float]]:
    rows = []
    rng = np.random.default_rng(7)
    for inRate, outRate, alias in CONVERSIONS:
        speech = tone(220, seconds, inRate, 0.3) + (
            rng.standard_normal(int(seconds * inRate)) * 0.05
        )
        samples = speech.astype(np.float32)
        times: dict[str, list[float]] = {name: [] for name, _ in METHODS}
        for _name, method in METHODS:
            method(samples[: inRate // 10], inRate, outRate)[0]()  # warm up
        for _ in range(runs):
            # Interleaved, so that a slow moment of the machine hits all methods.
            for name, method in METHODS:
                times[name].append(timeOnce(method, samples, inRate, outRate))
        reference = statistics.median(times[ONE_SHOT])
        for name, method in METHODS:
            median = statistics.median(times[name])
            rows.append(
                (
                    f"{inRate / 1000:g} -> {outRate / 1000:g} kHz",
                    name,
                    median / seconds,
                    median / reference,
                    aliasDb(method, inRate, outRate, alias),
                )
            )
    return rows


def table(rows: list[tuple[str, str, float, float, float]], runs: int, seconds: float) -> str:
    lines = [
        "# Resampling benchmark",
        "",
        f"Generated by `python bench/resample.py` on {datetime.now(UTC):%Y-%m-%d} "
        f"({platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, numpy {np.__version__}, soxr {soxr.__version__}, "
        f"scipy {scipy.__version__}).",
        "",
        f"Median of {runs} runs over {seconds:g} s of audio. RTF = processing time / audio "
        "duration (lower is faster); the ratio is to soxr one-shot in the same run. Aliasing is "
        "the strongest output component left by a tone above the output's Nyquist frequency "
        "(13 kHz for 24 kHz out, 10 kHz for 16 kHz out), relative to the tone; the plugin row "
        "is after PCM16 rounding (below about -100 dB it means the tone rounded to silence), "
        "the others are float. The plugin row times 100 ms PCM16 chunk envelopes, built "
        "beforehand as RPEngine sends them, passing through the plugin in a chain: base64 "
        "and PCM16 decoding, the stream, PCM16 and base64 encoding, the chain's calls; "
        "reading the output back is not timed. Each method runs once per round, the rounds "
        "interleaved, on one CPU.",
        "",
        "| conversion | method | RTF | time vs soxr one-shot | aliasing (dB) |",
        "|---|---|---:|---:|---:|",
    ]
    for conversion, name, rtf, ratio, alias in rows:
        lines.append(f"| {conversion} | {name} | {rtf:.5f} | {ratio:.2f}x | {alias:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--output", default=os.path.join(ROOT, "docs", "benchmarks", "resample.md"))
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        # One CPU for every method: a move between CPUs mid-run costs the
        # short runs here as much as the differences they measure.
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    text = table(measure(args.runs, args.seconds), args.runs, args.seconds)
    print(text)
    if args.output:
        os.makedirs(os.path.dirname(args.output), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
