"""
One client's messages, handled one at a time in the order they came.

Whichever way a message comes (the WebSocket, or the WebRTC data channel),
it waits its turn here.  While the handler of one returns a Deferred (audio
being decoded in a thread), reading from the socket pauses and nothing
after it is handled: a client cannot queue unbounded work, and a C{cancel}
never overtakes the turn it cancels.  Once the connection is closing,
nothing more is read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from rpmiddleware.client.surface import Reply

#: Handles one message: a Deferred while the next one must wait for it.
Handle = Callable[[bytes | str, bool], "Deferred[None] | None"]


class Life(Protocol):
    """
    Whether the connection the messages came on is still there.
    """

    @property
    def closed(self) -> bool:
        """The connection is gone."""

    @property
    def closing(self) -> bool:
        """The connection is being closed: nothing more is read."""


class Reading(Protocol):
    """
    The transport, as far as reading from it goes.
    """

    def pauseReading(self) -> None: ...

    def resumeReading(self) -> None: ...


class Inbox:
    """
    @param handle: handles one message (decodes it, calls its handler).
    @param failed: told when a message's Deferred failed.
    @param life: the connection's state, read before every message.
    @param reading: paused while a message is waited for.

    @ivar channel: how to answer the message being handled, if it did not
        come on the WebSocket (see L{received}).
    """

    def __init__(
        self,
        handle: Handle,
        failed: Callable[[Failure], None],
        life: Life,
        reading: Reading,
    ) -> None:
        self._handle = handle
        self._failed = failed
        self._life = life
        self._reading = reading
        self._messages: deque[tuple[bytes | str, bool, Reply | None]] = deque()
        self._busy = False
        self.channel: Reply | None = None

    def received(self, payload: bytes | str, isBinary: bool, reply: Reply | None = None) -> None:
        """
        A client message, in order with the others whichever way it came.

        @param reply: for a message that came on the WebRTC data channel,
            how to send on that channel: a C{ping} there is answered there
            (an LLMRTC client that pings on its data channel waits for the
            C{pong} on it).
        """
        if self._life.closed or self._life.closing:
            return
        self._messages.append((payload, isBinary, reply))
        self._drain()

    def clear(self) -> None:
        """
        Forget the messages not handled yet (the connection is gone).
        """
        self._messages.clear()

    def _drain(self) -> None:
        life = self._life
        while self._messages and not self._busy and not (life.closed or life.closing):
            payload, isBinary, self.channel = self._messages.popleft()
            try:
                pending = self._handle(payload, isBinary)
            finally:
                self.channel = None
            if pending is not None:
                self._busy = True
                self._reading.pauseReading()
                pending.addBoth(self._resume)

    def _resume(self, result: object) -> None:
        self._busy = False
        if isinstance(result, Failure):
            self._failed(result)
        if not self._life.closed:
            self._reading.resumeReading()
            self._drain()
