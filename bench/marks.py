"""
Benchmark: what speech marks cost (issue 35, part 5).

The speech-marks plugin, in a plugin chain on the real reactor with its
thread pool and the real alignment (C{alignment.prepare} and C{align}),
given what the middleware gives it: each line's text deltas as they stream,
then its speech, one sentence segment after another in real time, each
segment's chunks together (RPEngine sends a sentence's chunks at once, once
it is synthesised), at RPEngine's 44.1 kHz in its 32 KiB chunks (the plugin
sits further from the game than audio-resample), for a client at 24 kHz.
The speech is the simulator's, one voiced burst per word
(L{rpmiddleware.testing.simspeech}).

Measured:

  - the delay the plugin adds to a segment's first chunk (the chunk enters
    the plugin -> it leaves toward the game, after the segment's marks): one
    stream, and N streams at once;
  - N streams speaking without pause on one core (this process pinned to
    one CPU: the reactor, the chain, the alignment's threads and the driver):
    whether every sentence's marks left before its audio, the longest delay,
    and the CPU per second of speech, with marks (sentence, word, viseme) and
    with the plugin in the chain but no marks asked.

    python -m bench marks           # writes its section of docs/benchmarks.md
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from twisted.internet.defer import Deferred

from bench.common import Section, median, percentile, table
from rpmiddleware.builtin.animation import alignment
from rpmiddleware.builtin.animation.marks import SpeechMarks
from rpmiddleware.core.chain import PluginChain
from rpmiddleware.plugin import Envelope, encodeBase64, speechmarks
from rpmiddleware.testing.kit import FakeSession
from rpmiddleware.testing.simspeech import spokenWords

#: RPEngine's speech, in its 32 KiB chunks.
RATE = 44100
CHUNK_SAMPLES = 16384
#: The client's rate (the request's outputSampleRate).
CLIENT_RATE = 24000
#: A line: sentences of a game character, short to long.
LINE = (
    "Welcome back, traveller.",
    "The north road is closed tonight, and the bridge at Eastwatch is out again.",
    "Stay by the fire.",
    "If you must go, take the old path past the mill and keep your lantern low.",
    "Nobody has seen the miller since Tuesday.",
)
KINDS = ("sentence", "word", "viseme")
#: From a line's text to its first speech: RPEngine synthesises a sentence
#: once the text after it has begun (a browser voice takes a few hundred ms).
FIRST_AUDIO_SECONDS = 0.25


def _cpuSeconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Speech:
    """The LINE's sentences spoken, cut into chunks once."""

    def __init__(self) -> None:
        self.segments: list[tuple[float, list[str]]] = []
        for sentence in LINE:
            known = spokenWords(sentence, RATE, 0.065)
            pcm = known.pcm
            step = CHUNK_SAMPLES * 2
            chunks = [encodeBase64(pcm[i : i + step]) for i in range(0, len(pcm), step)]
            self.segments.append((known.samples / RATE, chunks))
        self.seconds = sum(s for s, _ in self.segments)


class _TimedAligner:
    """The real alignment, with the CPU time of each align() call kept."""

    def __init__(self) -> None:
        self.alignCpu: list[float] = []

    def prepare(self, text: str, language: str) -> Any:
        return alignment.prepare(text, language)

    def align(self, prepared: Any, samples: bytes, sampleRate: int) -> Any:
        started = time.thread_time()
        result = alignment.align(prepared, samples, sampleRate)
        self.alignCpu.append((time.thread_time() - started) * 1000)
        return result


class _Rig:
    """The plugin in a chain; records when each envelope leaves toward the game."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.aligner = _TimedAligner()
        self.plugin = SpeechMarks(reactor, threads=2, aligner=self.aligner)
        self.left: dict[tuple[str, int], float] = {}
        self.order: list[tuple[str, str, int]] = []
        self.chain = PluginChain([self.plugin], lambda envelope: None, self._toGame, reactor)
        self.chain.engineSessionStarted(FakeSession("bench"))

    def _toGame(self, envelope: Envelope) -> None:
        kind = envelope.type
        requestId = envelope.requestId or ""
        if kind == "reply.audio.chunk" and envelope["segmentChunkSequence"] == 0:
            key = (requestId, envelope["segmentSequence"])
            self.left[key] = time.perf_counter()
            self.order.append(("audio", requestId, envelope["segmentSequence"]))
        elif kind == speechmarks.MARKS_ENVELOPE:
            self.order.append(("marks", requestId, len(envelope["marks"])))

    def send(self, kind: str, **fields: Any) -> None:
        self.chain.sendToGame(Envelope.build(kind, "bench", **fields))


class _Stream:
    """One character speaking lines back to back, in real time."""

    def __init__(self, rig: _Rig, speech: _Speech, name: str, kinds: tuple[str, ...]) -> None:
        self.rig = rig
        self.speech = speech
        self.name = name
        self.kinds = kinds
        self.turns = 0
        self.entered: dict[tuple[str, int], float] = {}
        self.stopped = False

    def startLine(self) -> None:
        if self.stopped:
            return
        self.turns += 1
        requestId = f"{self.name}-{self.turns}"
        request = Envelope.build(
            "reply.request",
            "bench",
            requestId=requestId,
            characterId="mira",
            output={"language": "en"},
        )
        if self.kinds:
            request.meta[speechmarks.META] = self.kinds
        request.meta["outputSampleRate"] = CLIENT_RATE
        self.rig.chain.sendToEngine(request)
        for n, sentence in enumerate(LINE):
            delta = ("" if n == 0 else " ") + sentence
            self.rig.send("reply.text.delta", requestId=requestId, sequence=n, delta=delta)
        self.rig.send("reply.text.completed", requestId=requestId, text=" ".join(LINE))
        self.rig.reactor.callLater(FIRST_AUDIO_SECONDS, self.segment, requestId, 0)

    def segment(self, requestId: str, index: int) -> None:
        if index == len(self.speech.segments):
            self.rig.send("reply.audio.completed", requestId=requestId)
            self.rig.send("reply.completed", requestId=requestId, modalities=["text", "audio"])
            self.startLine()
            return
        if self.stopped:
            return
        seconds, chunks = self.speech.segments[index]
        self.entered[(requestId, index)] = time.perf_counter()
        for n, data in enumerate(chunks):
            self.rig.send(
                "reply.audio.chunk",
                requestId=requestId,
                sequence=n,
                segmentSequence=index,
                segmentChunkSequence=n,
                segmentChunkCount=len(chunks),
                sampleRate=RATE,
                data=data,
            )
        self.rig.reactor.callLater(seconds, self.segment, requestId, index + 1)


async def _load(
    reactor: Any, streams: int, kinds: tuple[str, ...], warmup: float, seconds: float
) -> dict[str, Any]:
    speech = _Speech()
    rig = _Rig(reactor)
    players = [_Stream(rig, speech, f"s{n}", kinds) for n in range(streams)]
    # Spread the streams' first lines over one sentence's length.
    for n, player in enumerate(players):
        reactor.callLater(n * speech.segments[0][0] / streams, player.startLine)
    await _sleep(reactor, warmup)
    cpu0, wall0 = _cpuSeconds(), time.perf_counter()
    await _sleep(reactor, seconds)
    cpu, wall = _cpuSeconds() - cpu0, time.perf_counter() - wall0
    for player in players:
        player.stopped = True
    await _sleep(reactor, 1.0)
    rig.plugin.close()
    delays: list[float] = []
    missing = 0
    for player in players:
        for key, entered in player.entered.items():
            if entered < wall0 or entered > wall0 + wall:
                continue
            left = rig.left.get(key)
            if left is None:
                missing += 1
                continue
            delays.append((left - entered) * 1000)
    # Every segment's first chunk must follow its marks.
    late = 0
    marked: set[str] = set()
    pendingMarks: dict[str, int] = {}
    for what, requestId, _ in rig.order:
        if what == "marks":
            pendingMarks[requestId] = pendingMarks.get(requestId, 0) + 1
        else:
            if kinds and pendingMarks.get(requestId, 0) <= 0:
                late += 1
            pendingMarks[requestId] = pendingMarks.get(requestId, 0) - 1
            marked.add(requestId)
    speechSeconds = streams * wall
    return {
        "streams": streams,
        "kinds": kinds,
        "delays": delays,
        "missing": missing,
        "late": late,
        "cpu": cpu / wall,
        "cpuPerStreamSecond": cpu / speechSeconds * 1000,
        "alignCpu": rig.aligner.alignCpu,
    }


def _sleep(reactor: Any, seconds: float) -> Deferred[None]:
    d: Deferred[None] = Deferred()
    reactor.callLater(seconds, d.callback, None)
    return d


def _max(result: dict[str, Any]) -> float:
    return max(result["delays"] or [0.0])


def _p99(result: dict[str, Any]) -> float:
    return percentile(result["delays"] or [0.0], 99)


def _p50(result: dict[str, Any]) -> float:
    return median(result["delays"] or [0.0])


async def run(reactor: Any, quick: bool = False) -> Section:
    cpus = sorted(os.sched_getaffinity(0))
    warmup, seconds = (2.0, 10.0) if quick else (3.0, 30.0)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    results = []
    # One stream as the daemon runs (every CPU the process may use), then
    # pinned to one CPU.
    print("   1 stream, marks on, unpinned", flush=True)
    results.append(await _load(reactor, 1, KINDS, warmup, seconds))
    results[-1]["cpus"] = len(cpus)
    os.sched_setaffinity(0, {cpus[-1]})
    try:
        for streams, kinds in ((1, KINDS), (16, KINDS), (16, ()), (32, KINDS)):
            print(f"   {streams} stream(s), marks {'on' if kinds else 'off'}, 1 CPU", flush=True)
            results.append(await _load(reactor, streams, kinds, warmup, seconds))
            results[-1]["cpus"] = 1
    finally:
        os.sched_setaffinity(0, set(cpus))
    rows = []
    for r in results:
        delays = r["delays"]
        rows.append(
            [
                r["streams"],
                r["cpus"],
                ", ".join(r["kinds"]) or "none asked",
                len(delays),
                f"{median(delays):.2f}" if delays else "-",
                f"{percentile(delays, 99):.2f}" if delays else "-",
                f"{max(delays):.1f}" if delays else "-",
                r["late"] + r["missing"],
                f"{r['cpu'] * 100:.0f}%",
                f"{r['cpuPerStreamSecond']:.1f}",
                f"{median(r['alignCpu']):.2f}" if r["alignCpu"] else "-",
            ]
        )
    one, onePinned, sixteen, off, thirtyTwo = results
    headers = [
        "streams",
        "CPUs",
        "marks asked",
        "segments",
        "added delay p50 (ms)",
        "p99 (ms)",
        "max (ms)",
        "late",
        "CPU",
        "CPU ms per s of speech",
        "align() CPU p50 (ms)",
    ]
    body = f"""The speech-marks plugin in a plugin chain on the real reactor, with its thread pools
(2 threads align, 1 prepares) and the real alignment; "CPUs" 1: this whole process pinned to one
CPU (the reactor, the chain, the alignment's threads and the driver that plays RPEngine), else
free to use the host's {len(cpus)}, as a daemon is. Each stream
speaks a line of {len(LINE)} sentences ({_Speech().seconds:.1f} s of speech) again and again
without pause: the
line's text first (deltas, as RPEngine streams text ahead of its speech), then, from
{FIRST_AUDIO_SECONDS * 1000:.0f} ms later (synthesis), each sentence's
speech segment in real time, its chunks together (as RPEngine sends a synthesised sentence), at
RPEngine's 44.1 kHz in 32 KiB chunks (the plugin sits further from the game than
audio-resample), for a client at 24 kHz. The speech is the simulator's
(`speech="words"`: one voiced burst per word). Delay: a segment's first chunk enters the plugin
-> it leaves toward the game, after the segment's marks (what the plugin adds to the first
`tts-chunk`; the client endpoint's own hop, benchmark 2, comes on top). "Late" counts segments
whose audio left before their marks, or never left. CPU: the process's CPU time over the window
(100% = the one core), and per second of speech delivered. Measured over {seconds:.0f} s after
{warmup:.0f} s of warm-up; the machine's load average before the run: {load} (other work on its
2 CPUs lengthens every figure).

{table(headers, rows)}

"align() CPU" is the CPU time of each `alignment.align` call on its thread (a 44.1 kHz sentence
of 1.2-5.2 s): the part of the added delay that is work; the rest is the hand-over to the thread
and back, and waiting for a CPU, which this host shares with other work (most when pinned to
one). With no marks asked the plugin holds nothing and starts
no thread: its cost per envelope is one dict lookup. For scale, the bare relay of benchmark 3
spent 2.4 ms of CPU per second of a stream on 2026-12-06 (another host), and 4.5-7.4 ms on this
host on 2026-12-07 (benchmarks/load-marks-off.md), the middleware 1.3-1.6x that.
"""
    goals = [
        (
            "marks add <= 10 ms p50 to a segment's first chunk (one stream, words and visemes)",
            f"{_p50(one):.2f} ms (align() {median(one['alignCpu'] or [0.0]):.2f} ms of CPU; "
            f"pinned to one CPU beside the host's other work: {_p50(onePinned):.2f} ms)",
            bool(one["delays"]) and median(one["delays"]) <= 10,
        ),
        (
            "16 streams speaking without pause keep real time on one core with marks on "
            "(every sentence's marks before its audio, the core not full)",
            f"late {sixteen['late'] + sixteen['missing']}, CPU {sixteen['cpu'] * 100:.0f}%; "
            f"added delay p50 {_p50(sixteen):.2f} ms, p99 {_p99(sixteen):.0f} ms, max "
            f"{_max(sixteen):.0f} ms (32 streams: CPU {thirtyTwo['cpu'] * 100:.0f}%, p99 "
            f"{_p99(thirtyTwo):.0f} ms, max {_max(thirtyTwo):.0f} ms)",
            sixteen["late"] + sixteen["missing"] == 0 and sixteen["cpu"] < 0.9,
        ),
        (
            "no marks asked: the plugin holds nothing (16 streams)",
            f"p50 {_p50(off):.3f} ms, CPU {off['cpuPerStreamSecond']:.2f} ms per s",
            off["late"] + off["missing"] == 0,
        ),
    ]
    return Section("Speech marks: what they cost (issue 35)", body, goals)
