"""
Benchmark 7: RPEngine's file mailbox against its WebSocket.

The middleware (default plugin chain, client endpoint, the mailbox service)
runs in processes of their own pinned to CPU 0: one woken by inotify, one
that only polls (50 ms while messages flow, 250 ms when idle, as RPEngine
itself polls).  This process, pinned to CPU 1, plays RPEngine and the
client, so both ends of a hop read one clock.

1. Hop latency: from the moment RPEngine's file is complete (its C{.ready}
   marker in place; for speech, the phrase's WAV in its slot first) to the
   client's C{llm-chunk} (for a C{reply.text.delta}) or first C{tts-chunk}
   (for a 100 ms phrase in a C{reply.audio.segment}, at 44.1 kHz), one in
   flight at a time; against the same message as a WebSocket frame to the
   same middleware process, measured in the same run (L{bench.hop.Rig}).
2. Idle cost: the CPU a middleware with a mailbox spends with nothing
   happening (no RPEngine, and RPEngine attached but quiet), against one
   without a mailbox, over the same seconds.

RPEngine's own latency is not in these numbers: it polls the game's folder
every 50 ms (so a request waits 25 ms on average before RPEngine reads it)
and batches text for up to 120 ms in file mode.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall, deferLater

from bench.common import Section, median, percentile, pin, processCpu, table
from bench.hop import CHUNK_SAMPLES, Rig, Socket, ofType
from bench.peers import Peer
from rpmiddleware.engine.mailbox.audioslots import pcm16Wav
from rpmiddleware.engine.mailbox.files import FROM_ENGINE, TO_ENGINE
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard

HOP_HEADERS = [
    "hop",
    "WebSocket p50",
    "WebSocket p99",
    "mailbox p50",
    "mailbox p99",
    "p50 ratio",
    "p50 added",
]
#: Slots enough for every phrase of a full run in one peer identity.
AUDIO_SLOTS = 16384
OUTPUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def _publish(directory: str, name: str, data: bytes) -> None:
    """
    Write as the browser's writable streams do: a swap file moved into
    place when closed.
    """
    swap = os.path.join(directory, name + ".crswap")
    with open(swap, "wb") as f:
        f.write(data)
    os.replace(swap, os.path.join(directory, name))


class FileEngine:
    """
    RPEngine's side of the mailbox, reduced to what the benchmark needs:
    envelopes written as RPEngine's adapter writes them (JSON, then the
    marker), the game's read every 2 ms, acknowledged and removed.
    """

    def __init__(self, reactor: Any, root: str) -> None:
        self.reactor = reactor
        self.root = root
        self.fromGame = os.path.join(root, TO_ENGINE)
        self.toGame = os.path.join(root, FROM_ENGINE)
        self.audio = os.path.join(root, "audio")
        self.sessionId: str | None = None
        self.peerInstanceId = ""
        self.nextSlot = 0
        self._stamp = 0
        self._waiting: list[tuple[Callable[[dict[str, Any]], bool], Deferred[Any]]] = []
        self._loop = LoopingCall(self._poll)
        self._loop.clock = reactor
        self._loop.start(0.002)

    def write(self, kind: str, **fields: Any) -> float:
        """
        Publish one envelope; the moment its marker is in place.
        """
        envelope = Envelope.build(kind, self.sessionId, **fields).fields
        self._stamp = max(int(time.time() * 1000), self._stamp + 1)
        stem = f"{self._stamp:013d}-{envelope['messageId']}"
        _publish(self.toGame, stem + ".json", json.dumps(envelope).encode("utf-8"))
        _publish(self.toGame, stem + ".ready", b"")
        return time.perf_counter()

    def phrase(self, requestId: str, sequence: int, pcm: bytes) -> float:
        """
        A phrase as RPEngine sends it in file mode: the WAV into the next
        slot, then the segment naming it.
        """
        slot = self.nextSlot
        self.nextSlot += 1
        name = f"slot_{slot:04d}.wav"
        wav = pcm16Wav(pcm, 44100)
        _publish(self.audio, name, wav)
        return self.write(
            "reply.audio.segment",
            requestId=requestId,
            segmentSequence=sequence,
            spokenText="",
            slotIndex=slot,
            path=f"audio/{name}",
            format="wav_pcm_s16le",
            sampleRate=44100,
            channels=1,
            durationSeconds=len(pcm) / 2 / 44100,
            byteLength=len(wav),
            peerInstanceId=self.peerInstanceId,
        )

    def next(self, predicate: Callable[[dict[str, Any]], bool]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self._waiting.append((predicate, d))
        return d

    def _poll(self) -> None:
        try:
            names = sorted(n for n in os.listdir(self.fromGame) if n.endswith(".ready"))
        except FileNotFoundError:
            return
        for name in names:
            stem = name[:-6]
            try:
                with open(os.path.join(self.fromGame, stem + ".json"), "rb") as f:
                    message = json.loads(f.read())
            except (OSError, ValueError):
                continue
            for suffix in (".ready", ".json"):
                try:
                    os.unlink(os.path.join(self.fromGame, stem + suffix))
                except OSError:
                    pass
            if message.get("type") != "ack":
                self.write("ack", acknowledgedMessageId=message["messageId"])
            if message.get("type") == "welcome":
                self.sessionId = message["sessionId"]
                peer = message.get("peerInstanceId") or ""
                if peer != self.peerInstanceId:
                    self.peerInstanceId = peer
                    self.nextSlot = int(message.get("nextAudioSlot") or 0)
            for entry in list(self._waiting):
                if entry[0](message):
                    self._waiting.remove(entry)
                    entry[1].callback(message)
                    break

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()


class FileRig:
    """
    RPEngine through the mailbox and a client over the WebSocket, on one
    middleware: the file counterpart of L{bench.hop.Rig}.
    """

    def __init__(self, reactor: Any, port: int, root: str) -> None:
        self.reactor = reactor
        self.port = port
        self.root = root
        self.requestId = ""
        self.sequence = 0

    async def start(self, sampleRate: int) -> None:
        engine = self.engine = FileEngine(self.reactor, self.root)
        welcome = engine.next(ofType("welcome"))
        engine.write("hello", clientVersion="bench")
        await welcome
        engine.write("capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=64)
        client = self.client = Socket(
            self.reactor, f"ws://127.0.0.1:{self.port}/client/socket", None
        )
        ready = client.next(ofType("ready"))
        await client.opened()
        await ready
        client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
        client.send({"type": "configure", "output": {"sampleRate": sampleRate, "voice": "F2"}})
        await deferLater(self.reactor, 0.2, lambda: None)

    async def openTurn(self) -> None:
        request = self.engine.next(ofType("reply.request"))
        self.client.send({"type": "text", "text": "go"})
        message = await request
        self.requestId = message["requestId"]
        self.sequence = 0
        self.engine.write("reply.accepted", requestId=self.requestId)

    async def hop(self, kind: str, index: int) -> float:
        if kind == "text":
            word = f"w{index} "
            arrived = self.client.next(
                lambda m: m.get("type") == "llm-chunk" and m.get("content") == word
            )
            sent = self.engine.write(
                "reply.text.delta", requestId=self.requestId, sequence=self.sequence, delta=word
            )
        else:
            arrived = self.client.next(ofType("tts-chunk"))
            sent = self.engine.phrase(self.requestId, self.sequence, pcmBytes(index))
        self.sequence += 1
        _, at = await arrived
        return float(at - sent)

    async def closeTurn(self) -> None:
        done = self.client.next(ofType("reply-complete", "tts-cancelled"))
        for kind in ("reply.audio.completed", "reply.text.completed", "reply.completed"):
            self.engine.write(kind, requestId=self.requestId)
        await done

    def close(self) -> None:
        self.engine.stop()
        self.client.close()


def pcmBytes(index: int) -> bytes:
    t = (np.arange(CHUNK_SAMPLES) + index * CHUNK_SAMPLES) / 44100
    return bytes((0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes())


async def hops(rig: Any, kind: str, count: int) -> list[float]:
    await rig.start(44100)
    try:
        await rig.openTurn()
        if kind == "audio" and isinstance(rig, Rig):
            rig.startAudio()
        times = []
        pauses = random.Random(7)
        for index in range(count + count // 10):
            # A message comes at any moment of the mailbox's poll, not in
            # step with it (one in flight would otherwise send each just
            # after a poll, and wait a whole interval).
            await deferLater(rig.reactor, pauses.uniform(0, 0.05), lambda: None)
            took = await rig.hop(kind, index)
            if index >= count // 10:  # the first tenth warms up
                times.append(took)
        await rig.closeTurn()
        return times
    finally:
        rig.close()
        await deferLater(rig.reactor, 0.1, lambda: None)


async def idleCpu(reactor: Any, peers: dict[str, Peer], seconds: float) -> dict[str, float]:
    """
    Percent of one core each peer spent over the same C{seconds}.
    """
    before = {name: processCpu(peer.pid) for name, peer in peers.items()}
    started = time.perf_counter()
    await deferLater(reactor, seconds, lambda: None)
    elapsed = time.perf_counter() - started
    return {
        name: 100.0 * (processCpu(peer.pid) - before[name]) / elapsed
        for name, peer in peers.items()
    }


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


async def run(reactor: Any, quick: bool = False) -> Section:
    runs = 2 if quick else 3
    count = 200 if quick else 500
    idleSeconds = 10.0 if quick else 30.0
    pin(1)
    base = tempfile.mkdtemp(prefix="rpmiddleware-bench-")
    os.chmod(base, 0o700)
    roots = {"inotify": os.path.join(base, "inotify"), "polling": os.path.join(base, "polling")}
    slots = ("--audio-slots", str(AUDIO_SLOTS))
    woken = Peer(reactor, "middleware", "--pin", "0", "--mailbox", roots["inotify"], *slots)
    polled = Peer(
        reactor, "middleware", "--pin", "0", "--mailbox", roots["polling"], "--no-watch", *slots
    )
    plain = Peer(reactor, "middleware", "--pin", "0")
    try:
        ports = {
            "inotify": int(await woken.line("PORT")),
            "polling": int(await polled.line("PORT")),
            "plain": int(await plain.line("PORT")),
        }
        await deferLater(reactor, 1.0, lambda: None)
        idleAlone = await idleCpu(
            reactor, {"plain": plain, "inotify": woken, "polling": polled}, idleSeconds
        )
        # RPEngine attached and quiet: a session, nothing happening.
        attached = [FileEngine(reactor, roots[name]) for name in ("inotify", "polling")]
        for engine in attached:
            welcome = engine.next(ofType("welcome"))
            engine.write("hello", clientVersion="bench")
            await welcome
        await deferLater(reactor, 3.0, lambda: None)
        idleAttached = await idleCpu(reactor, {"inotify": woken, "polling": polled}, idleSeconds)
        for engine in attached:
            engine.stop()
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(runs):
            for kind in ("text", "audio"):
                for transport in ("websocket", "inotify", "polling"):
                    if transport == "websocket":
                        rig: Any = Rig(reactor, ports["inotify"], relay=False)
                    else:
                        rig = FileRig(reactor, ports[transport], roots[transport])
                    times = await hops(rig, kind, count)
                    results.setdefault((transport, kind), []).append(
                        (percentile(times, 50), percentile(times, 99))
                    )
    finally:
        for peer in (woken, polled, plain):
            await peer.stop()
        shutil.rmtree(base, ignore_errors=True)

    def stat(transport: str, kind: str, which: int) -> float:
        return median([r[which] for r in results[(transport, kind)]])

    rows = []
    goals: list[tuple[str, str, bool]] = []
    labels = {
        "text": "reply.text.delta -> llm-chunk",
        "audio": "100 ms phrase -> first tts-chunk (44.1 kHz)",
    }
    for kind in ("text", "audio"):
        w50, w99 = stat("websocket", kind, 0), stat("websocket", kind, 1)
        for transport in ("inotify", "polling"):
            m50, m99 = stat(transport, kind, 0), stat(transport, kind, 1)
            rows.append(
                (
                    f"{labels[kind]}, mailbox ({transport})",
                    _us(w50),
                    _us(w99),
                    _us(m50),
                    _us(m99),
                    f"{m50 / w50:.1f}x",
                    f"{'+' if m50 >= w50 else ''}{(m50 - w50) * 1000:.2f} ms",
                )
            )
        added = stat("inotify", kind, 0) - w50
        goals.append(
            (
                f"mailbox hop with inotify adds <= 5 ms p50 to the WebSocket's ({labels[kind]})",
                f"{'+' if added >= 0 else ''}{added * 1000:.2f} ms",
                added <= 0.005,
            )
        )
        added = stat("polling", kind, 0) - w50
        goals.append(
            (
                f"mailbox hop without inotify adds <= the 50 ms poll p50 ({labels[kind]})",
                f"+{added * 1000:.1f} ms",
                added <= 0.050,
            )
        )
    cpuRows = [
        ("no mailbox (WebSocket only): the baseline", f"{idleAlone['plain']:.2f}", "—"),
        ("mailbox, inotify, no RPEngine", f"{idleAlone['inotify']:.2f}", "—"),
        ("mailbox, polling only, no RPEngine", f"{idleAlone['polling']:.2f}", "—"),
        ("mailbox, inotify, RPEngine attached and quiet", "—", f"{idleAttached['inotify']:.2f}"),
        (
            "mailbox, polling only, RPEngine attached and quiet",
            "—",
            f"{idleAttached['polling']:.2f}",
        ),
    ]
    worst = max(*idleAlone.values(), *idleAttached.values())
    goals.append(("an idle mailbox costs < 1% of a core", f"{worst:.2f}% at most", worst < 1.0))
    body = f"""
From RPEngine's complete file (its `.ready` marker in place; for speech the phrase's WAV already in
its slot) to the client's message, one in flight at a time, each sent after a random pause of 0 to
50 ms (so that messages come at any moment of a poll, as they do), {count} per run after
{count // 10} to warm up; the median over {runs} runs of each run's p50 and p99, in
microseconds. The WebSocket column is the same message as a frame to the same middleware process
in the same run. The middleware processes run on CPU 0, RPEngine and the client in this process on
CPU 1.

{table(HOP_HEADERS, rows)}

Idle CPU, percent of one core over {idleSeconds:.0f} s (the mailbox polls every 250 ms when idle):

{table(["middleware", "nobody connected (%)", "RPEngine attached, quiet (%)"], cpuRows)}

What RPEngine adds on its side is not in these numbers: it reads the game's folder every 50 ms
while messages flow (250 ms when idle) and holds text deltas for up to 120 ms in file mode.
"""
    os.makedirs(os.path.join(OUTPUT, "benchmarks"), exist_ok=True)
    with open(os.path.join(OUTPUT, "benchmarks", "mailbox.md"), "w", encoding="utf-8") as f:
        f.write("# The file mailbox against the WebSocket (benchmark 7)\n\n")
        f.write(f"Generated by `python -m bench mailbox{' --quick' if quick else ''}`.\n")
        f.write(body)
    return Section("The file mailbox (benchmark 7)", body, goals)
