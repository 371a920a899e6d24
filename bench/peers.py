"""
Peers that benchmarks run in processes of their own, so that what they cost
does not land on the reactor being measured.

    python -m bench.peers engine --port 38471 [--realtime] [--concurrency 4]

connects a simulated RPEngine (L{rpmiddleware.testing.simulator}) and keeps
it connected, reconnecting when dropped, until stdin closes.

    python -m bench.peers middleware [--config FILE] [--bare-relay] [--mailbox DIR [--no-watch]]

serves the middleware (the default plugin chain) on a free loopback port
(and RPEngine's file mailbox in DIR, woken by inotify unless told not to),
or the bare Autobahn relay the hop benchmark measures against, and prints
C{PORT n} once listening.  C{rss} on stdin answers C{RSS n} (kilobytes);
with C{--heartbeat}, C{beat} answers the longest reactor pause and the
garbage collector's passes since the last C{beat} (L{Heartbeat}); stdin
closing ends it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import stdio
from twisted.internet.defer import Deferred, DeferredQueue
from twisted.internet.protocol import ProcessProtocol, Protocol
from twisted.logger import ILogObserver, globalLogBeginner
from zope.interface import implementer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rssKilobytes(pid: int | None = None) -> int:
    """
    Resident set size of a process (this one by default), from /proc.
    """
    with open(f"/proc/{pid or 'self'}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc status")


class _Control(Protocol):
    """
    Commands on stdin: C{rss} answers with this process's resident size;
    end of input stops the reactor.
    """

    def __init__(self, reactor: Any, extra: dict[str, Any] | None = None) -> None:
        self.reactor = reactor
        self.extra = extra or {}
        self.buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            command = line.strip().decode()
            if command == "rss":
                answer = f"RSS {rssKilobytes()}\n"
            elif command in self.extra:
                answer = f"{command.upper()} {self.extra[command]()}\n"
            else:
                answer = f"ERROR unknown command {command!r}\n"
            assert self.transport is not None
            self.transport.write(answer.encode())

    def connectionLost(self, reason: Any = None) -> None:
        if self.reactor.running:
            self.reactor.stop()


@implementer(ILogObserver)
def discard(event: dict[str, Any]) -> None:
    """
    A log observer that keeps nothing but errors, which go to stderr.
    """
    from twisted.logger import LogLevel, formatEventAsClassicLogText

    level = event.get("log_level")
    if event.get("log_failure") is not None or level in (LogLevel.error, LogLevel.critical):
        sys.stderr.write(formatEventAsClassicLogText(event) or "")


def _quietLogs() -> None:
    # Without an observer, Twisted buffers the first 64k events in memory.
    globalLogBeginner.beginLoggingTo([discard], redirectStandardIO=False)
    # As twistd rpmiddleware does (rpmiddleware/tap.py): Autobahn's debug events
    # (one per frame) are not even emitted.
    import txaio

    txaio.use_twisted()
    txaio.set_global_log_level("info")  # type: ignore[attr-defined]


class Heartbeat:
    """
    A 1 ms heartbeat on the reactor and the garbage collector's passes, for
    the load benchmark: the longest gap between beats is the longest time
    the reactor was held, and each collection is counted and timed
    (C{gc.callbacks}).  C{report} answers and starts a new window.
    """

    def __init__(self, reactor: Any, interval: float = 0.001) -> None:
        import gc
        import time

        from twisted.internet.task import LoopingCall

        self.clock = time.perf_counter
        self.last = self.clock()
        self.reset()
        self.gcStarted = 0.0
        gc.callbacks.append(self.collected)
        self.loop = LoopingCall(self.beat)
        self.loop.clock = reactor
        self.loop.start(interval, now=False)

    def reset(self) -> None:
        self.longest = 0.0
        self.passes = [0, 0, 0]
        self.gcTotal = 0.0
        self.gcLongest = 0.0

    def beat(self) -> None:
        now = self.clock()
        self.longest = max(self.longest, now - self.last)
        self.last = now

    def collected(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.gcStarted = self.clock()
            return
        took = self.clock() - self.gcStarted
        self.passes[info["generation"]] += 1
        self.gcTotal += took
        self.gcLongest = max(self.gcLongest, took)

    def report(self) -> str:
        """
        C{longest-gap-ms gen0 gen1 gen2 gc-total-ms gc-longest-ms}, then a
        new window.
        """
        answer = (
            f"{self.longest * 1000:.3f} {self.passes[0]} {self.passes[1]} {self.passes[2]} "
            f"{self.gcTotal * 1000:.3f} {self.gcLongest * 1000:.3f}"
        )
        self.reset()
        return answer


def trimmed() -> int:
    """
    Collect, ask glibc's allocator to give freed heap back to the system
    (C{malloc_trim}; nothing elsewhere), and answer the resident size in
    kilobytes: what a process holds beyond what it uses.
    """
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if name and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):
            pass
    return rssKilobytes()


def serveMiddleware(args: argparse.Namespace) -> None:
    if args.as_daemon:
        # The reactor twistd rpmiddleware chooses (the asyncio reactor when
        # WebRTC's extra is installed), before anything touches the reactor.
        from bench.common import benchSettings
        from rpmiddleware.webrtc.reactor import chooseDaemonReactor

        chooseDaemonReactor(benchSettings())
    from twisted.internet import reactor

    _quietLogs()
    if args.bare_relay:
        # Nothing of the middleware imported: the relay's memory is its own.
        from bench.relay import startRelay

        serve(reactor, startRelay(reactor), args)
        return

    from bench.common import benchSettings
    from rpmiddleware.config.settings import loadSettings
    from rpmiddleware.core.middleware import Middleware
    from rpmiddleware.testing.live import startMiddleware

    settings = loadSettings(args.config) if args.config else benchSettings()
    if args.session_ttl is not None:
        settings.client.session_ttl = args.session_ttl
    if args.max_connections is not None:
        settings.server.max_connections = args.max_connections
    if args.hello_timeout is not None:
        settings.server.hello_timeout = args.hello_timeout
    if args.mailbox:
        settings.engine.mailbox = args.mailbox
        settings.engine.mailbox_watch = not args.no_watch
        settings.engine.mailbox_audio_slots = args.audio_slots
    middleware = Middleware.fromSettings(reactor, settings)
    live = startMiddleware(reactor, settings, middleware=middleware)
    if not args.no_freeze:
        # As twistd rpmiddleware does (rpmiddleware/tap.py).
        from rpmiddleware.runtime.collector import freezeWhenRunning

        freezeWhenRunning(reactor)
    serve(reactor, live.port, args)


def serve(reactor: Any, port: int, args: argparse.Namespace) -> None:
    """
    Answer on stdin, say the port, and run until stdin closes.
    """
    extra: dict[str, Callable[[], object]] = {}
    if args.heartbeat:
        import gc

        extra["beat"] = Heartbeat(reactor).report
        # Objects the collector tracks, and how many are frozen out of its passes.
        extra["objects"] = lambda: f"{len(gc.get_objects())} {gc.get_freeze_count()}"
        extra["trim"] = trimmed

    stdio.StandardIO(_Control(reactor, extra))
    print(f"PORT {port}", flush=True)
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(reactor.run)  # type: ignore[attr-defined]
        profiler.dump_stats(args.profile)
    else:
        reactor.run()  # type: ignore[attr-defined]


def runEngine(args: argparse.Namespace) -> None:
    from twisted.internet import reactor

    from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator

    _quietLogs()
    options = SimulatorOptions(
        tokensPerSecond=args.tokens_per_second,
        audioRealtime=args.realtime,
        concurrency=args.concurrency,
        queueLimit=args.queue_limit,
        welcomeTimeout=None,
    )

    def connect() -> None:
        d: Deferred[Any] = connectSimulator(reactor, args.port, options)

        def connected(engine: Any) -> None:
            print("CONNECTED", flush=True)
            engine.closed.addCallback(lambda _: reactor.callLater(0.05, connect))

        d.addCallbacks(connected, lambda f: reactor.callLater(0.2, connect))

    connect()
    stdio.StandardIO(_Control(reactor))
    reactor.run()  # type: ignore[attr-defined]


class Peer(ProcessProtocol):
    """
    A peer process started by a benchmark, driven from the benchmark's own
    reactor: its stdout lines arrive as Deferreds, commands go to its stdin,
    and it stops when stdin closes (killed if it lingers).
    """

    def __init__(self, reactor: Any, *args: str) -> None:
        self.reactor = reactor
        self._buffer = b""
        self._lines: DeferredQueue[str] = DeferredQueue()
        self.ended: Deferred[None] = Deferred()
        self.transport: Any = reactor.spawnProcess(
            self,
            sys.executable,
            [sys.executable, "-m", "bench.peers", *args],
            env=os.environ.copy(),
            path=ROOT,
            childFDs={0: "w", 1: "r", 2: 2},
        )

    def outReceived(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._lines.put(line.decode().strip())

    def processEnded(self, reason: Any) -> None:
        self._lines.put("")
        if not self.ended.called:
            self.ended.callback(None)

    async def line(self, prefix: str) -> str:
        """
        The rest of the next line that starts with C{prefix}.
        """
        while True:
            line = await self._lines.get()
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
            if not line and self.ended.called:
                raise RuntimeError(f"peer ended before {prefix!r}")

    async def ask(self, command: str) -> str:
        self.transport.write(command.encode() + b"\n")
        return await self.line(command.upper() + " ")

    @property
    def pid(self) -> int:
        return int(self.transport.pid)

    async def stop(self) -> None:
        if not self.ended.called:
            self.transport.closeStdin()
            timer = self.reactor.callLater(5, self._kill)
            await self.ended
            if timer.active():
                timer.cancel()

    def _kill(self) -> None:
        if not self.ended.called:
            self.transport.signalProcess("KILL")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    sub = parser.add_subparsers(dest="what", required=True)
    engine = sub.add_parser("engine")
    engine.add_argument("--port", type=int, required=True)
    engine.add_argument("--realtime", action="store_true")
    engine.add_argument("--tokens-per-second", type=float, default=None)
    engine.add_argument("--concurrency", type=int, default=1)
    engine.add_argument("--queue-limit", type=int, default=4)
    middleware = sub.add_parser("middleware")
    middleware.add_argument("--config", default="")
    middleware.add_argument("--bare-relay", action="store_true")
    middleware.add_argument("--max-connections", type=int, default=None)
    middleware.add_argument("--hello-timeout", type=float, default=None)
    middleware.add_argument("--profile", default="", help="write cProfile stats here at exit")
    middleware.add_argument(
        "--as-daemon",
        action="store_true",
        help="the reactor twistd rpmiddleware would choose (asyncio with the webrtc extra)",
    )
    middleware.add_argument(
        "--session-ttl", type=float, default=None, help="[client] session_ttl (seconds)"
    )
    middleware.add_argument(
        "--no-freeze", action="store_true", help="no gc.freeze() after start-up (to compare)"
    )
    middleware.add_argument(
        "--heartbeat", action="store_true", help="a 1 ms heartbeat and GC timing; 'beat' reports"
    )
    middleware.add_argument("--mailbox", default="", help="also serve RPEngine's file mailbox here")
    middleware.add_argument(
        "--no-watch", action="store_true", help="mailbox: poll only, no inotify"
    )
    middleware.add_argument("--audio-slots", type=int, default=2048, help="mailbox: WAV slots")
    for sub_ in (engine, middleware):
        sub_.add_argument("--pin", type=int, default=None, help="run on this CPU only")
    args = parser.parse_args(argv)
    if args.pin is not None:
        from bench.common import pin

        pin(args.pin)
    if args.what == "engine":
        runEngine(args)
    else:
        serveMiddleware(args)


if __name__ == "__main__":
    main()
