"""
What a game's save costs the reactor (issue 33, part 4): the memory plugin
on the real reactor, its store on a file, a conversation of N exchanges of
long lines; a save, a load of it, a prune to C{keepEntries} and one to
C{maxBytes}, each while a 5 ms timer ticks.  Printed: each op's whole time,
the time its call took on the reactor, and the timer's worst lateness while
the op ran (how long the reactor could not answer a ping).

    python -m bench.saves [--exchanges 5000]

Not a section of docs/benchmarks.md: its figures are quoted in docs/memory.md
(Saves), with the load the machine had.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor, task
from twisted.internet.defer import Deferred, inlineCallbacks

from rpmiddleware.builtin.memory import Memory, memory
from rpmiddleware.builtin.memory.conversation import CHARACTER, COMPLETE, PLAYER, Key
from rpmiddleware.cards.hasher import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.timeline import Timeline

LINE = "The player told me about the old mill and the bees that hum there in summer, " * 4
TICK = 0.005


class Ticker:
    """A timer every L{TICK}: its worst lateness is the reactor's longest stall."""

    def __init__(self) -> None:
        self.loop = task.LoopingCall(self.tick)
        self.last: float | None = None
        self.worst = 0.0
        self.ticks = 0

    def tick(self) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.worst = max(self.worst, now - self.last - TICK)
            self.ticks += 1
        self.last = now

    def start(self) -> None:
        self.last, self.worst, self.ticks = None, 0.0, 0
        self.loop.start(TICK)

    def stop(self) -> tuple[float, int]:
        self.loop.stop()
        return self.worst * 1000, self.ticks


@inlineCallbacks
def run(plugin: Memory, exchanges: int) -> Any:
    key = Key("game", "mira", "world-1")
    conversation = plugin.store.conversation(key)
    for i in range(exchanges):
        plugin.store.append(
            conversation,
            (PLAYER, "Ada", f"{i} {LINE}", COMPLETE),
            (CHARACTER, "Mira", f"{i} {LINE}", COMPLETE),
        )
    yield plugin.store.transaction("wait", lambda db: None, write=False)
    size = yield plugin.storeSize()
    print(f"{2 * exchanges} entries of {len(LINE) + 5} characters; the file {size['bytes']} bytes")
    ticker = Ticker()
    ops: list[tuple[str, Callable[[], Deferred[Any]]]] = [
        ("save", lambda: plugin.save("s", "world-1", "game")),
        ("load-save", lambda: plugin.loadSave("s", "world-1", "game")),
        ("prune keepEntries=100", lambda: plugin.prune(keepEntries=100, integrationId="game")),
        ("prune maxBytes=1000000", lambda: plugin.prune(maxBytes=1_000_000, integrationId="game")),
    ]
    for name, call in ops:
        ticker.start()
        start = time.perf_counter()
        d = call()
        called = (time.perf_counter() - start) * 1000
        yield d
        yield plugin.store.transaction("wait", lambda db: None, write=False)
        whole = (time.perf_counter() - start) * 1000
        worst, ticks = ticker.stop()
        print(
            f"{name}: {whole:.0f} ms in all, its call {called:.1f} ms on the reactor, "
            f"the reactor's worst stall meanwhile {worst:.1f} ms ({ticks} ticks)"
        )
    with open("/proc/loadavg", encoding="ascii") as f:
        print("load average:", " ".join(f.read().split()[:3]))
    yield plugin.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=5000)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-saves-")
    path = os.path.join(folder, "memory.sqlite3")
    services = PluginServices(reactor, Settings(), CardHasher(None), Timeline())
    plugin = memory.buildPlugin({"path": path}, services)
    assert isinstance(plugin, Memory)

    def done(result: object) -> object:
        reactor.stop()  # type: ignore[attr-defined]
        return result

    reactor.callWhenRunning(  # type: ignore[attr-defined]
        lambda: run(plugin, args.exchanges).addBoth(done)
    )
    reactor.run()  # type: ignore[attr-defined]
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    os.rmdir(folder)


if __name__ == "__main__":
    main()
