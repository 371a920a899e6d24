"""
The game end of the chain: hands each envelope from RPEngine to whoever asked.

Requests are multiplexed by requestId: the client or API call that opened a
request gets its stream and nobody else's.  Observers (the console, metrics,
a client that wants capacity updates) see every envelope.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger

from rpmiddleware.envelope import Envelope, summarize
from rpmiddleware.messages import MESSAGES
from rpmiddleware.timeline import Timeline

Observer = Callable[[Envelope], None]


class GameRouter:
    log = Logger()

    def __init__(self, timeline: Timeline | None = None) -> None:
        self.timeline = timeline if timeline is not None else Timeline()
        self._routes: dict[str, Observer] = {}
        self._observers: list[Observer] = []

    def route(self, requestId: str, observer: Observer) -> None:
        """
        Send every envelope for C{requestId} to C{observer} until its terminal one.
        """
        self._routes[requestId] = observer

    def observe(self, observer: Observer) -> Callable[[], None]:
        """
        Show C{observer} every envelope that reaches the game end.

        @return: a callable that stops it.
        """
        self._observers.append(observer)
        return lambda: self._observers.remove(observer) if observer in self._observers else None

    def deliver(self, envelope: Envelope) -> None:
        requestId = envelope.requestId
        if requestId is not None:
            self.timeline.saw(requestId, envelope.type)
        for observer in list(self._observers):
            self._call(observer, envelope)
        if requestId is None:
            return
        target = self._routes.get(requestId)
        spec = MESSAGES.get(envelope.type)
        if spec is not None and spec.terminal:
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
