"""
Work in a later reactor turn, so that the turn which asked for it stays short.

Card work holds the GIL (pure Python or the C JSON encoder), so a thread does
not help the reactor: it waits for the thread to let go, in 5 ms slices.
Splitting the work across turns does help: the reactor serves every other
connection between the pieces.

Any L{IReactorTime} provider is treated alike: a test on a
L{twisted.internet.task.Clock} sees the later turn happen when it advances
the clock (C{clock.advance(0)}).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

T = TypeVar("T")


def hasTurns(reactor: object) -> bool:
    """
    Whether L{inLaterTurn} defers on C{reactor}: whether it has a clock to
    schedule on at all (C{None} has none).
    """
    return IReactorTime.providedBy(reactor)


def inLaterTurn(
    reactor: object, work: Callable[..., T] | Callable[..., Deferred[T]], *args: Any
) -> Deferred[T]:
    """
    C{work(*args)} in a later turn of C{reactor}; at once when there is no
    reactor to schedule on.
    """
    if not hasTurns(reactor):
        return maybeDeferred(work, *args)  # type: ignore[return-value]
    return deferLater(reactor, 0, work, *args)  # type: ignore[arg-type,return-value]
