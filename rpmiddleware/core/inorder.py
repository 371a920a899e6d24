"""
Envelopes into the chain in the order the game gave them, each once ready.

A request waits for its card's canonical hash, which for a large card the
game does not own comes a reactor turn later (or from a thread); a cancel the
game gives right after must not reach RPEngine before the request it
cancels, and two requests must not swap places.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from rpmiddleware.protocol.envelope import Envelope


class _Slot:
    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.done: Deferred[None] = Deferred()
        self.result: Envelope | Failure | None = None


class InOrder:
    """
    Hands envelopes to C{send} in submission order, each when its Deferred
    fires; one that fails is skipped (its own Deferred fails) and holds up
    nothing after it.
    """

    def __init__(self, send: Callable[[Envelope], Deferred[Any]]) -> None:
        self._send = send
        self._queue: deque[_Slot] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, ready: Deferred[Envelope]) -> Deferred[None]:
        """
        Send the envelope C{ready} fires with, after everything submitted
        before it; the result fires when the chain has taken it.
        """
        slot = _Slot()
        self._queue.append(slot)
        ready.addBoth(self._readied, slot)
        return slot.done

    def _readied(self, result: Envelope | Failure, slot: _Slot) -> None:
        slot.result = result
        while self._queue and self._queue[0].result is not None:
            head = self._queue.popleft()
            if isinstance(head.result, Failure):
                head.done.errback(head.result)
            else:
                assert head.result is not None
                self._send(head.result).chainDeferred(head.done)
