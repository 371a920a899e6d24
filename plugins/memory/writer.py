"""
The memory store's own thread: SQLite work, in order, away from the reactor.

A L{Lane} is Twisted's L{ThreadPool} with one worker: work submitted to it
runs in submission order, on one thread (so each SQLite connection stays on
the thread that uses it), and its result comes back to the reactor's thread
as a Deferred (L{deferToThreadPool}).  A locked or slow disk then delays only
the lane's own work: while SQLite waits for a lock (its busy handler retries
for the store's C{write_timeout}), the reactor goes on serving pings, frames
and other clients' turns.

We use Twisted's pool rather than a thread and a queue of our own: it is the
reactor's own tool for this (the same one C{deferToThread} uses), it hands
results and failures back on the reactor's thread, and it is stopped with the
reactor.  On a reactor without threads (a L{twisted.internet.task.Clock} in
tests) work runs at once, on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads, IReactorThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

T = TypeVar("T")


class Lane:
    """
    One worker thread of its own, started on first use.

    @param reactor: where results come back; without threads, work runs at
        once.
    @param name: the thread's name (seen in a debugger, C{py-spy}).
    """

    def __init__(self, reactor: Any, name: str) -> None:
        self._reactor = reactor
        self.name = name
        self.threaded = (
            reactor is not None
            and IReactorThreads.providedBy(reactor)
            and IReactorFromThreads.providedBy(reactor)
        )
        self._pool: ThreadPool | None = None
        self._trigger: Any = None
        #: Work submitted and not finished (for /metrics).
        self.waiting = 0

    def run(self, work: Callable[[], T]) -> Deferred[T]:
        """
        Run C{work} after everything submitted before it; its result or
        failure, on the reactor's thread.
        """
        if not self.threaded:
            return maybeDeferred(work)
        if self._pool is None:
            self._pool = ThreadPool(1, 1, name=self.name)
            self._pool.start()
            if IReactorCore.providedBy(self._reactor):
                self._trigger = self._reactor.addSystemEventTrigger("during", "shutdown", self.stop)
        self.waiting += 1

        def done(result: T) -> T:
            self.waiting -= 1
            return result

        d: Deferred[T] = deferToThreadPool(self._reactor, self._pool, work)
        return d.addBoth(done)

    def stop(self) -> None:
        """
        Stop the thread once the work given to it is done (called when that
        work has finished, so the join is immediate).
        """
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if self._trigger is not None:
            try:
                self._reactor.removeSystemEventTrigger(self._trigger)
            except (ValueError, KeyError):
                pass
            self._trigger = None
        pool.stop()
