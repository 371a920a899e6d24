"""
The stress run: the reliability checks too long for the trial suite, at
full size.  C{python -m bench stress} (CI runs it); it prints what it did
and exits 1 if anything failed.

  - the engine-endpoint fuzzer: 40,000 frames over 10 RPEngine sessions,
    strings up to 1 MiB, each session ended by a frame one byte over the
    limit (1009);
  - the client-endpoint fuzzer: 20,000 frames on one connection;
  - RPEngine dropped mid-turn 300 times in a row, reconnecting each time;
  - load: 200 clients x 5 spoken turns against the simulated RPEngine.
"""

from __future__ import annotations

import time
from typing import Any

from bench.clientfuzzing import KNOWN_CLIENT_FAULTS, fuzzClient
from bench.common import benchSettings
from bench.fuzzing import fuzzEngine
from bench.scenarios import clientLoad, engineDrops
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import startMiddleware
from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator


def _fresh(reactor: Any, **server: Any) -> Any:
    settings = benchSettings()
    for key, value in server.items():
        setattr(settings.server, key, value)
    settings.engine.dedup_window = 1024
    middleware = Middleware.fromSettings(reactor, settings)
    middleware.registerCharacter("mira", exampleCard())
    return startMiddleware(reactor, settings, middleware=middleware)


async def run(reactor: Any, scale: float = 1.0) -> list[str]:
    failed: list[str] = []

    def report(name: str, problems: list[str], summary: str, started: float) -> None:
        took = time.perf_counter() - started
        print(f"{name}: {summary} [{took:.0f} s]", flush=True)
        for problem in problems:
            print(f"  PROBLEM: {problem}", flush=True)
            failed.append(f"{name}: {problem}")

    started = time.perf_counter()
    live = _fresh(reactor)
    try:
        fuzz = await fuzzEngine(
            reactor, live, frames=int(40_000 * scale), seed=2026, sessions=10, maxString=1 << 20
        )
        problems = fuzz.problems()
        if fuzz.seenWindow > 1024 or fuzz.unacked > 1:
            problems.append(f"state grew: dedup {fuzz.seenWindow}, unacked {fuzz.unacked}")
        if fuzz.memoryGrowth > 4 * 1024 * 1024:
            problems.append(f"memory grew {fuzz.memoryGrowth / 1e6:.1f} MB over the second half")
        report("engine fuzzer", problems, fuzz.summary(), started)
    finally:
        await live.stop()

    started = time.perf_counter()
    live = _fresh(reactor)
    try:
        client = await fuzzClient(
            reactor, live, frames=int(20_000 * scale), seed=2026, skip=KNOWN_CLIENT_FAULTS
        )
        report("client fuzzer", client.problems(), client.summary(), started)
    finally:
        await live.stop()

    started = time.perf_counter()
    live = _fresh(reactor)
    try:
        drops = await engineDrops(reactor, live.middleware, live, rounds=int(300 * scale))
        report("engine drops", drops.problems(), drops.summary(), started)
    finally:
        await live.stop()

    started = time.perf_counter()
    live = _fresh(reactor, max_connections=256)
    engine = None
    try:
        engine = await connectSimulator(
            reactor,
            live.port,
            SimulatorOptions(
                tokensPerSecond=None, audioRealtime=False, concurrency=16, queueLimit=256
            ),
        )
        load = await clientLoad(reactor, live, engine, int(200 * scale), 5, ["text", "audio"])
        report("load", load.problems(), load.summary(), started)
    finally:
        if engine is not None:
            engine.disconnect()
        await live.stop()
    return failed
