"""
Benchmark: WebRTC voice turns, and what a connected peer costs.

The middleware runs in a child process (the asyncio reactor, the default
plugin chain, the simulated RPEngine in-process, answering at once); the
clients are aiortc peers in this process, each one a WebSocket, a data
channel, a microphone track and the server's speech track, as the LLMRTC
web client connects.  Measured:

- latency: from the end of the player's speech (the moment the last speech
  frame leaves the client's microphone track) to the first sound of the
  reply on the speech track, per VAD hangover; broken down into the
  speech-end message (the detector's decision) and the rest.  Baseline in
  the same run: the same recording sent as one C{audio} message over the
  WebSocket, from sending it to the first C{tts-chunk}.
- CPU: the server process's CPU time (user + system, from /proc) per
  second of wall time, with N peers connected and idle (the microphone
  streaming silence, the speech track sending silence: Opus decode, VAD
  and Opus encode all run regardless), and with N peers each taking a
  spoken turn every few seconds; per peer, and how many peers one core
  carries at that rate.  Baseline: the idle server with N plain WebSocket
  clients.

Run from the repository root (needs the webrtc extra)::

    python bench/webrtc.py [--turns 5] [--seconds 10] [--peers 1,5,10,20]

It prints markdown and writes docs/benchmarks/webrtc.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SPEECH_SECONDS = 0.8
TICKS = os.sysconf("SC_CLK_TCK")


# The server (child process).


def serve(portFile: str, hangover: int) -> None:
    from twisted.internet import asyncioreactor

    asyncioreactor.install()
    from twisted.internet import reactor

    from bench.common import benchSettings
    from rpmiddleware.core.middleware import Middleware
    from rpmiddleware.testing.live import startMiddleware
    from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator

    settings = benchSettings()
    settings.webrtc.vad_hangover_ms = hangover
    settings.server.max_connections = 1000
    middleware = Middleware.fromSettings(reactor, settings)
    live = startMiddleware(reactor, settings, middleware=middleware)
    options = SimulatorOptions(tokensPerSecond=None, audioRealtime=False, queueLimit=256)
    options.concurrency = 64

    def connected(_: object) -> None:
        with open(portFile + ".tmp", "w") as f:
            f.write(str(live.port))
        os.rename(portFile + ".tmp", portFile)

    connectSimulator(reactor, live.port, options).addCallback(connected)
    reactor.run()  # type: ignore[attr-defined]


class Server:
    """
    The middleware in a child process, and its CPU time.
    """

    def __init__(self, hangover: int) -> None:
        self.folder = tempfile.mkdtemp(prefix="bench-webrtc-")
        portFile = os.path.join(self.folder, "port")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "serve", portFile, str(hangover)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(300):
            if os.path.exists(portFile):
                break
            time.sleep(0.05)
        else:
            self.stop()
            raise SystemExit("the middleware did not start")
        with open(portFile) as f:
            self.port = int(f.read())

    def cpu(self) -> float:
        """
        Seconds of CPU (user + system) the server has used.
        """
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


# The clients (this process, on the asyncio reactor).


class Client:
    """
    One voice client: a WebSocket (the project's test client), and an
    aiortc peer with the data channel and a microphone, negotiated as the
    LLMRTC client does (data channel first, microphone second).
    """

    def __init__(self, reactor: Any, port: int) -> None:
        from rpmiddleware.testing.live import connectClient

        self.reactor = reactor
        self.ws = connectClient(reactor, f"ws://127.0.0.1:{port}/client/socket")
        self.peer: Any = None
        self.microphone: Any = None

    async def socket(self) -> None:
        from rpmiddleware.testing.kit import exampleCard
        from rpmiddleware.webrtc.bridge import awaitable

        loop = asyncio.get_running_loop()
        await awaitable(self.ws.opened, loop)
        self.ws.send({"type": "character", "characterId": "mira", "card": exampleCard()})

    async def connect(self) -> None:
        from rpmiddleware.testing.webrtc import ClientPeer, PcmTrack

        await self.socket()
        self.peer = ClientPeer()
        await self.peer.negotiate(self.exchange)
        await asyncio.wait_for(self.peer.opened, 10)
        self.microphone = PcmTrack(rate=48000)
        self.peer.addMicrophone(self.microphone)
        await self.peer.negotiate(self.exchange)
        await asyncio.wait_for(self.peer.trackArrived, 10)

    async def nextOnSocket(self, *types: str) -> dict[str, Any]:
        from rpmiddleware.webrtc.bridge import awaitable

        loop = asyncio.get_running_loop()
        while True:
            message: dict[str, Any] = await awaitable(self.ws.next(), loop)
            if message.get("type") in types:
                return message

    async def exchange(self, offer: dict[str, str]) -> dict[str, str]:
        self.ws.send({"type": "offer", "signal": offer})
        message = await asyncio.wait_for(self.nextOnSocket("signal", "error"), 10)
        if message["type"] != "signal":
            raise RuntimeError(f"offer refused: {message}")
        answer: dict[str, str] = message["signal"]
        return answer

    async def close(self) -> None:
        if self.peer is not None:
            await self.peer.close()
        self.ws.drop()


class SoundTimes:
    """
    Wraps a TrackListener to keep when each frame with sound arrived.
    """

    def __init__(self, listener: Any) -> None:
        import numpy as np

        from rpmiddleware.webrtc.microphone import frameToMono

        self.times: list[float] = []
        original = listener.track.recv

        async def recv() -> Any:
            frame = await original()
            samples, _ = frameToMono(frame)
            if float(np.abs(samples).max()) > listener.threshold:
                self.times.append(time.monotonic())
            return frame

        listener.track.recv = recv

    def firstAfter(self, moment: float) -> float | None:
        return next((t for t in self.times if t > moment), None)


async def latency(reactor: Any, hangover: int, turns: int) -> dict[str, list[float]]:
    """
    Spoken turns over WebRTC, and the same recordings as audio messages.
    """
    from rpmiddleware.testing.webrtc import Recording

    server = Server(hangover)
    try:
        client = Client(reactor, server.port)
        await client.connect()
        sounds = SoundTimes(client.peer.listener)
        recording = Recording([("speech", SPEECH_SECONDS)])
        result: dict[str, list[float]] = {"speech-end": [], "first audio": [], "socket": []}
        for _ in range(turns):
            await asyncio.sleep(0.5)
            microphone = client.microphone
            microphone.say(recording.pcm(48000))
            while not microphone.idle:
                await asyncio.sleep(0.001)
            spokenAt = time.monotonic()  # the last speech frame has just been sent
            await client.peer.nextOfType("speech-end", timeout=10)
            result["speech-end"].append(time.monotonic() - spokenAt)
            done = await client.peer.nextOfType("reply-complete", timeout=30)
            first = None
            for _ in range(500):
                first = sounds.firstAfter(spokenAt)
                if first is not None:
                    break
                await asyncio.sleep(0.01)
            if first is None:
                raise RuntimeError(f"no sound for turn {done.get('turnId')}")
            result["first audio"].append(first - spokenAt)
            # Let the reply play out before the next turn.
            while client.peer.listener and time.monotonic() - (sounds.times[-1]) < 0.3:
                await asyncio.sleep(0.05)
        # Baseline: the recording as one audio message, first tts-chunk back.
        wav = base64.b64encode(recording.wav(16000)).decode()
        baseline = Client(reactor, server.port)
        await baseline.socket()
        for _ in range(turns):
            sent = time.monotonic()
            baseline.ws.send({"type": "audio", "data": wav})
            await asyncio.wait_for(baseline.nextOnSocket("tts-chunk"), 30)
            result["socket"].append(time.monotonic() - sent)
            await asyncio.wait_for(baseline.nextOnSocket("reply-complete"), 30)
        await client.close()
        await baseline.close()
        return result
    finally:
        server.stop()


class Load:
    """
    One measurement: server and client CPU seconds per wall second, and the
    replies completed meanwhile.
    """

    def __init__(self, server: float, clients: float, replies: int) -> None:
        self.server = server
        self.clients = clients
        self.replies = replies


def replies(clients: list[Client]) -> int:
    return sum(
        sum(1 for m in c.peer.received if m.get("type") == "reply-complete")
        for c in clients
        if c.peer is not None
    )


async def cpu(
    reactor: Any, counts: list[int], seconds: float, talking: bool, peers: bool = True
) -> dict[int, Load]:
    """
    Server (and client) CPU seconds per wall second with N clients connected.
    """
    from rpmiddleware.testing.webrtc import Recording

    result: dict[int, Load] = {}
    for count in counts:
        server = Server(600)
        clients = [Client(reactor, server.port) for _ in range(count)]
        try:
            await asyncio.gather(*(c.connect() if peers else c.socket() for c in clients))
            await asyncio.sleep(2.0)  # settle
            speech = Recording([("speech", 1.0), ("silence", 3.0)]).pcm(48000)
            stop = asyncio.Event()

            talkers = (
                [
                    asyncio.ensure_future(talk(c, speech, i * 4.0 / count, stop))
                    for i, c in enumerate(clients)
                ]
                if talking
                else []
            )
            if talking:
                await asyncio.sleep(4.0)
            before, ours, done = server.cpu(), time.process_time(), replies(clients)
            start = time.monotonic()
            await asyncio.sleep(seconds)
            wall = time.monotonic() - start
            result[count] = Load(
                (server.cpu() - before) / wall,
                (time.process_time() - ours) / wall,
                replies(clients) - done,
            )
            stop.set()
            for t in talkers:
                t.cancel()
        finally:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
            server.stop()
    return result


async def talk(client: Client, speech: bytes, offset: float, stop: asyncio.Event) -> None:
    """
    Say C{speech} every four seconds, from C{offset}, until C{stop}.
    """
    await asyncio.sleep(offset)
    while not stop.is_set():
        client.microphone.say(speech)
        await asyncio.sleep(4.0)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(
    args: argparse.Namespace,
    lat: dict[int, dict[str, list[float]]],
    idle: dict[int, Load],
    talking: dict[int, Load],
    sockets: dict[int, Load],
) -> str:
    import aiortc
    import av

    lines = [
        "# WebRTC benchmark",
        "",
        f"Generated by `python bench/webrtc.py` on {datetime.now(UTC):%Y-%m-%d} "
        f"({platform.machine()}, {os.cpu_count()} CPUs: {cpuName()}, CPython "
        f"{platform.python_version()}, aiortc {aiortc.__version__}, PyAV {av.__version__}).",
        "",
        "The middleware runs in a child process on the asyncio reactor with the default plugin "
        "chain and the simulated RPEngine in-process, answering at once (no model latency); "
        "the clients are aiortc peers in the benchmark process, over loopback.",
        "",
        "## Latency: end of speech to the reply's first sound",
        "",
        f"Median of {args.turns} turns of {SPEECH_SECONDS:g} s speech-like sound. *speech-end* is "
        "when the detector's message arrives (the hangover is most of it); *first audio* is the "
        "first frame with sound on the client's speech track.  The baseline is the same "
        "recording sent as one `audio` message over the WebSocket, timed from sending it to "
        "the first `tts-chunk`: what the same turn costs without WebRTC, before any "
        "end-of-speech detection (a client doing its own adds its hangover on top).  The "
        "ratio compares the two paths with the hangover taken out: what Opus, RTP, aiortc's "
        "jitter buffers (80 ms each way), the detector and the track add over a WebSocket.",
        "",
        "| VAD hangover | speech-end | first audio | first audio minus hangover | "
        "WebSocket audio message (baseline) | (first audio minus hangover) / baseline |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for hangover, r in lat.items():
        first, base = median(r["first audio"]), median(r["socket"])
        lines.append(
            f"| {hangover} ms | {median(r['speech-end']) * 1000:.0f} ms | {first * 1000:.0f} ms "
            f"| {(first - hangover / 1000) * 1000:.0f} ms | {base * 1000:.0f} ms "
            f"| {(first - hangover / 1000) / base:.1f}x |"
        )
    lines += [
        "",
        "## CPU per connected peer",
        "",
        f"Server process CPU (user + system) per wall-clock second, over {args.seconds:g} s. "
        "*Idle*: connected, the microphone streaming silence (Opus decoding, resampling and "
        "the VAD run all the same), the speech track paused as it is between turns (it sends "
        "a second of silence after a reply, then nothing until the next). "
        "*Talking*: every peer takes a 1 s spoken turn every 4 s (staggered), replies play on "
        "its track. Baseline: the same number of plain WebSocket clients, idle. "
        "Peers per core = 1 / (CPU per peer).",
        "",
        "| peers | WebSocket only (baseline) | idle peers | per idle peer | peers per core, idle "
        "| talking peers | per talking peer | peers per core, talking | replies completed "
        "| client process |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for count in idle:
        i, t, w = idle[count].server, talking[count], sockets[count].server
        expected = int(count * args.seconds / 4.0)
        bound = " (saturated)" if t.replies < 0.8 * expected else ""
        lines.append(
            f"| {count} | {w * 100:.1f}% | {i * 100:.1f}% | {i / count * 100:.2f}% "
            f"| {count / i:.0f} | {t.server * 100:.1f}% | {t.server / count * 100:.2f}% "
            f"| {count / t.server:.0f}{bound} | {t.replies} of ~{expected} "
            f"| {t.clients * 100:.0f}% |"
        )
    lines += [
        "",
        "One core is 100%. *Replies completed* counts the talking peers' replies that "
        "finished during the window, against the ~one per peer per 4 s they ask for. The "
        "benchmark's own aiortc clients (Opus encoding every microphone, decoding every "
        "speech track) run in one process, shown as *client process*, on the same machine: "
        "when the two processes together need more than the machine's cores, turns fall "
        "behind (fewer than 80% of them completed: marked saturated) and the per-peer server "
        "figure of that row is too low to use.  The idle figures fall per peer as the fixed "
        "cost of the process (the reactor, the simulated RPEngine) is shared.",
        "",
    ]
    return "\n".join(lines)


def cpuName() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--peers", default="1,5,10,20")
    parser.add_argument("--hangovers", default="600,300")
    parser.add_argument("--output", default=os.path.join(ROOT, "docs", "benchmarks", "webrtc.md"))
    args = parser.parse_args()
    counts = [int(n) for n in args.peers.split(",")]

    from twisted.internet import asyncioreactor

    asyncioreactor.install()
    from twisted.internet import reactor, task
    from twisted.internet.defer import Deferred

    async def run() -> None:
        lat = {}
        for hangover in (int(h) for h in args.hangovers.split(",")):
            print(f"latency, hangover {hangover} ms ...", flush=True)
            lat[hangover] = await latency(reactor, hangover, args.turns)
        print("CPU, WebSocket clients ...", flush=True)
        sockets = await cpu(reactor, counts, args.seconds, talking=False, peers=False)
        print("CPU, idle peers ...", flush=True)
        idle = await cpu(reactor, counts, args.seconds, talking=False)
        print("CPU, talking peers ...", flush=True)
        talking = await cpu(reactor, counts, args.seconds, talking=True)
        text = report(args, lat, idle, talking, sockets)
        print(text)
        with open(args.output, "w") as f:
            f.write(text)

    def start(_: Any) -> Deferred[None]:
        return Deferred.fromFuture(asyncio.ensure_future(run()))

    task.react(start)


if __name__ == "__main__":
    main()
