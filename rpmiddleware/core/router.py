"""
The game end of the chain: hands each envelope from RPEngine to whoever asked.

Requests are multiplexed by requestId: the client or API call that opened a
request gets its stream and nobody else's.  Observers (the console, metrics,
a client that wants capacity updates) see every envelope.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from twisted.logger import Logger

from rpmiddleware.protocol.envelope import Envelope, summarize
from rpmiddleware.protocol.messages import TERMINAL
from rpmiddleware.protocol.timeline import Timeline

Observer = Callable[[Envelope], None]

#: Envelope types whose observers are kept worked out (RPEngine has a few
#: dozen; plugins add their own).
_TYPES_KEPT = 256


class GameRouter:
    log = Logger()

    def __init__(self, timeline: Timeline | None = None) -> None:
        self.timeline = timeline if timeline is not None else Timeline()
        self._routes: dict[str, Observer] = {}
        #: Every observer with the types it wants (C{None}: all), in the
        #: order they came: the first hears of an envelope first.
        self._observers: list[tuple[Observer, frozenset[str] | None]] = []
        #: The observers of each type seen, worked out once per change of
        #: observers: a speech chunk calls only those that want it.
        self._byType: dict[str, list[Observer]] = {}

    def route(self, requestId: str, observer: Observer) -> None:
        """
        Send every envelope for C{requestId} to C{observer} until its terminal one.
        """
        self._routes[requestId] = observer

    def observe(
        self, observer: Observer, types: Collection[str] | None = None
    ) -> Callable[[], None]:
        """
        Show C{observer} every envelope that reaches the game end, or only
        those of C{types}.

        @return: a callable that stops it.
        """
        entry = (observer, None if types is None else frozenset(types))
        self._observers.append(entry)
        self._byType.clear()

        def stop() -> None:
            if entry in self._observers:
                self._observers.remove(entry)
                self._byType.clear()

        return stop

    def _observersOf(self, kind: str) -> list[Observer]:
        if len(self._byType) >= _TYPES_KEPT:
            self._byType.clear()
        observers = self._byType[kind] = [
            observer for observer, types in self._observers if types is None or kind in types
        ]
        return observers

    def deliver(self, envelope: Envelope) -> None:
        requestId = envelope.requestId
        kind = envelope.type
        if requestId is not None:
            self.timeline.saw(requestId, kind)
        observers = self._byType.get(kind)
        if observers is None:
            observers = self._observersOf(kind)
        # Never changed in place (a change of observers makes new lists), so
        # one that stops observing while called does not disturb the loop.
        for observer in observers:
            self._call(observer, envelope)
        if requestId is None:
            return
        target = self._routes.get(requestId)
        if kind in TERMINAL:
            self._routes.pop(requestId, None)
        if target is not None:
            self._call(target, envelope)
        elif not self._observers:
            self.log.debug(
                "nobody is waiting for {envelope}; dropped", envelope=summarize(envelope.fields)
            )

    def _call(self, observer: Observer, envelope: Envelope) -> None:
        try:
            observer(envelope)
        except Exception:
            self.log.failure("a receiver of {envelope} failed", envelope=summarize(envelope.fields))
