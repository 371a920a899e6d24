"""
The playbook plugin's way toward the game: everything it sends goes out one
reactor turn later, in the order it was posted, as the client's message
(L{rpmiddleware.builtin.playbook.clientmessages.toGame}).

Later, because the client endpoint echoes a typed turn's C{transcript} when
the turn starts, after its request has passed the plugin: the C{stage-change}
its words caused must follow that echo.  And a turn asked for when a reply
ends must reach the endpoint after the reply's end has, or the endpoint would
take it for a barge-in.  In order, because a client reads C{stage-change},
C{tool-call-start} and C{tool-call-end} as one story.

An item may be a function, called when its turn comes, for what can only be
decided then: an auto_event turn asked for is not sent if a turn of the
client's own took its events meanwhile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.builtin.playbook import wire
from rpmiddleware.builtin.playbook.clientmessages import toGame
from rpmiddleware.plugin import Envelope, IChainContext

Item = Envelope | Callable[[], Envelope | None]


class Outbox:
    """
    @param chain: the chain context the plugin last saw; its reactor runs
        the flush and it takes the envelopes toward the game.
    """

    log = Logger()

    def __init__(self, chain: Callable[[], IChainContext]) -> None:
        self._chain = chain
        self._items: deque[Item] = deque()
        self._call: Any = None
        self._flushing = False

    def post(self, item: Item) -> None:
        self._items.append(item)
        if not self._flushing and self._call is None:
            self._call = self._chain().reactor.callLater(0, self._flush)

    def error(self, clientId: str, code: str, message: str, **extra: Any) -> None:
        self.post(wire.toGame(wire.ERROR, clientId, code=code, message=message, **extra))

    def clear(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._items.clear()

    def _flush(self) -> None:
        self._call = None
        chain = self._chain()
        self._flushing = True
        try:
            while self._items:
                item = self._items.popleft()
                try:
                    envelope = item if isinstance(item, Envelope) else item()
                    if envelope is not None:
                        chain.sendToGame(toGame(envelope))
                except Exception:
                    self.log.failure("sending a playbook envelope failed")
        finally:
            self._flushing = False
