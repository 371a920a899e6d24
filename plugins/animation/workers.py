"""
speech-marks' worker threads: where the alignment's CPU work runs, off the
reactor.

Two pools: aligning a segment whose audio is held (urgent: the client waits
for it) has threads of its own, so that it never waits behind preparing the
sentences of other lines, which one thread does soonest-needed first
(L{SoonestFirst}).  No thread starts until the first work comes.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads, IReactorThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")


@dataclass(eq=False)
class Prepare:
    """Preparing one sentence on the prepare thread."""

    text: str
    prepare: Callable[[str, str], Any]
    language: str
    #: Fires with the prepared sentence (on the reactor's thread).
    result: Deferred[Any] = field(default_factory=Deferred)
    #: The thread has begun it (reads and writes of a bool are atomic).
    started: bool = False
    #: Still needed (else the thread skips it).
    wanted: bool = True

    def run(self) -> tuple[Prepare, Any]:
        self.started = True
        if not self.wanted:
            return self, None
        try:
            return self, self.prepare(self.text, self.language)
        except Exception:
            return self, Failure()

    @staticmethod
    def finished(outcome: tuple[Prepare, Any]) -> None:
        job, value = outcome
        if isinstance(value, Failure):
            job.result.errback(value)
        else:
            job.result.callback(value)


class SoonestFirst:
    """
    Sentences waiting to be prepared, soonest needed first: the prepare
    thread is given one task per sentence, and each task takes whichever
    sentence is due first when it runs (so a new line's first sentence goes
    before another line's fifth).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Prepare]] = []
        self._lock = threading.Lock()
        self._count = itertools.count()

    def push(self, due: float, job: Prepare) -> None:
        with self._lock:
            heapq.heappush(self._heap, (due, next(self._count), job))

    def runNext(self) -> tuple[Prepare, Any]:
        with self._lock:
            _, _, job = heapq.heappop(self._heap)
        return job.run()


class Workers:
    """
    The align pool (C{threads} threads) and the prepare pool (one thread),
    started by the first work and stopped at the reactor's shutdown.
    """

    def __init__(self, reactor: Any, threads: int) -> None:
        self._reactor = reactor
        self._threads = threads
        self._pools: dict[bool, ThreadPool] = {}

    def submit(self, work: Callable[..., T], *args: Any, urgent: bool = False) -> Deferred[T]:
        """
        Run C{work} on a worker thread, C{urgent} work on the align pool; on
        the caller's thread with a reactor that has no threads.
        """
        if not (
            IReactorThreads.providedBy(self._reactor)
            and IReactorFromThreads.providedBy(self._reactor)
        ):
            return maybeDeferred(work, *args)
        if not self._pools:
            self._pools = {
                True: ThreadPool(0, self._threads, name="speech-marks-align"),
                False: ThreadPool(0, 1, name="speech-marks-prepare"),
            }
            for pool in self._pools.values():
                pool.start()
            if IReactorCore.providedBy(self._reactor):
                self._reactor.addSystemEventTrigger("during", "shutdown", self.close)
        return deferToThreadPool(self._reactor, self._pools[urgent], work, *args)

    @property
    def started(self) -> bool:
        """Whether the threads were started."""
        return bool(self._pools)

    def close(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.stop()
