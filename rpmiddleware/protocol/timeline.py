"""
Per-request timelines: when a turn was submitted, accepted, first spoke and ended.

Kept in memory for the most recent requests so that the logging plugin, the
console and the benchmarks read the same numbers.  Times are seconds of the
clock a L{Timeline} is given: the middleware gives its reactor's C{seconds},
so that every timing it reports is on the reactor's clock (a test's
L{twisted.internet.task.Clock} included).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_MARKS = {
    "reply.accepted": "accepted",
    "reply.text.delta": "firstText",
    "reply.audio.chunk": "firstAudio",
    "reply.completed": "completed",
    "reply.cancelled": "cancelled",
    "request.error": "failed",
}


@dataclass
class RequestTimeline:
    requestId: str
    submitted: float | None = None
    accepted: float | None = None
    firstText: float | None = None
    firstAudio: float | None = None
    completed: float | None = None
    cancelled: float | None = None
    failed: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: Who asked (the request's C{meta["client"]}: a client session id, or
    #: C{"api"}); kept out of L{asDict}, since a session id is a secret.
    client: str | None = None

    @property
    def finished(self) -> bool:
        return any(t is not None for t in (self.completed, self.cancelled, self.failed))

    def asDict(self) -> dict[str, Any]:
        """
        Milliseconds since submission for each mark that happened.
        """
        start = self.submitted
        marks = {}
        for name in ("accepted", "firstText", "firstAudio", "completed", "cancelled", "failed"):
            value = getattr(self, name)
            if value is not None and start is not None:
                marks[name] = round((value - start) * 1000, 3)
        return {"requestId": self.requestId, "marks": marks, **self.details}


class Timeline:
    """
    The timelines of the last C{size} requests.

    @param now: the clock to read: the middleware passes its reactor's
        C{seconds}; a timeline made on its own (a plugin's test) reads
        C{time.perf_counter}.
    """

    def __init__(self, size: int = 256, now: Callable[[], float] = time.perf_counter) -> None:
        self._size = size
        self._now = now
        self._requests: OrderedDict[str, RequestTimeline] = OrderedDict()

    def now(self) -> float:
        """
        The time on this timeline's clock.
        """
        return self._now()

    def get(self, requestId: str) -> RequestTimeline | None:
        return self._requests.get(requestId)

    def recent(self) -> list[RequestTimeline]:
        """
        The game's recent requests, oldest first: those submitted through
        the Python API (a plugin's own requests, such as the memory plugin's
        summaries, are noted but are nobody's turn).
        """
        return [entry for entry in self._requests.values() if entry.submitted is not None]

    def _entry(self, requestId: str) -> RequestTimeline:
        entry = self._requests.get(requestId)
        if entry is None:
            entry = self._requests[requestId] = RequestTimeline(requestId)
            while len(self._requests) > self._size:
                self._requests.popitem(last=False)
        return entry

    def submitted(self, requestId: str, client: str | None = None, **details: Any) -> None:
        """
        C{requestId} was asked now, by C{client} (its C{meta["client"]}).
        """
        entry = self._entry(requestId)
        entry.submitted = self._now()
        entry.client = client
        entry.details.update(details)

    def note(self, requestId: str, **details: Any) -> None:
        self._entry(requestId).details.update(details)

    def saw(self, requestId: str, messageType: str) -> None:
        mark = _MARKS.get(messageType)
        if mark is None:
            return
        entry = self._requests.get(requestId)
        if entry is None or getattr(entry, mark) is not None:
            return
        setattr(entry, mark, self._now())
