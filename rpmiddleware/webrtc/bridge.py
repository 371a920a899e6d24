"""
Crossing between asyncio (aiortc) and Twisted (everything else).

On the asyncio reactor both run in one loop on one thread, so crossing is
only a change of vocabulary, never of thread:

  - a coroutine becomes a Deferred with L{deferredFromCoroutine}
    (C{Deferred.fromFuture(asyncio.ensure_future(coro))});
  - a Deferred becomes something a coroutine can await with L{awaitable}
    (C{d.asFuture(loop)}).

Nothing awaits the result of an Autobahn C{onMessage} or an aiortc event
handler, so an exception there would vanish (or surface as "Task exception
was never retrieved" long after).  L{background} and L{spawn} therefore
always end in an errback that logs the failure with what was being done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

T = TypeVar("T")

log = Logger()


def deferredFromCoroutine(
    coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop
) -> Deferred[T]:
    """
    Run an asyncio coroutine as a task of C{loop}; its result as a Deferred.
    Cancelling the Deferred cancels the task.
    """
    return Deferred.fromFuture(asyncio.ensure_future(coro, loop=loop))


def awaitable(d: Deferred[T], loop: asyncio.AbstractEventLoop) -> asyncio.Future[T]:
    """
    A Deferred as an asyncio future of C{loop}, for C{await} in aiortc code.
    """
    return d.asFuture(loop)


def logFailure(failure: Failure, what: str) -> None:
    """
    The errback at the end of every chain nobody else waits for.
    """
    if failure.check(asyncio.CancelledError):
        return None
    log.failure("WebRTC: {what} failed", failure, what=what)
    return None


def background(d: Deferred[Any], what: str) -> Deferred[None]:
    """
    End C{d} with an errback that logs a failure instead of losing it.
    """
    return d.addErrback(logFailure, what)


def spawn(
    coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop, what: str
) -> Deferred[None]:
    """
    Start a coroutine nobody awaits; its failure is logged, never lost.
    """
    return background(deferredFromCoroutine(coro, loop), what)


def guarded(f: Callable[..., Any], what: str) -> Callable[..., None]:
    """
    Wrap a synchronous callback (an aiortc event handler calling into
    Twisted code) so an exception is logged with C{what} and not raised into
    the emitter, which would otherwise drop it.  A Deferred returned by
    C{f} gets the same logging errback.
    """

    def call(*args: Any, **kwargs: Any) -> None:
        try:
            result = f(*args, **kwargs)
        except Exception:
            logFailure(Failure(), what)
            return
        if isinstance(result, Deferred):
            background(result, what)
        elif asyncio.iscoroutine(result):
            # Called from the running loop (an aiortc event), so the task
            # goes to that loop.
            background(Deferred.fromFuture(asyncio.ensure_future(result)), what)

    return call
