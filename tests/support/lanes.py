"""
A stand-in for the memory store's thread (L{rpmiddleware.builtin.memory.writer.Lane})
that runs nothing until the test says so: what a slow disk looks like to
the reactor, without threads or time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred


class HeldLane:
    """
    Work given to it waits, in order, until L{release}; its results come
    back then, as a threaded lane's do on the reactor.
    """

    threaded = True

    def __init__(self) -> None:
        self.held: list[tuple[Callable[[], Any], Deferred[Any]]] = []
        #: True while a piece of work given to it runs (what a thread of its
        #: own would run), not while the results' callbacks do.
        self.running = False

    @property
    def waiting(self) -> int:
        return len(self.held)

    def run(self, work: Callable[[], Any]) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.held.append((work, d))
        return d

    def release(self) -> None:
        """Run everything given so far, and what that gives in turn."""
        while self.held:
            work, d = self.held.pop(0)
            self.running = True
            try:
                done = maybeDeferred(work)
            finally:
                self.running = False
            done.chainDeferred(d)

    def stop(self) -> None:
        self.release()
