"""
Keeping a client that stops reading from costing memory or slowing others.

Twisted never refuses a write: what the peer does not read piles up in the
transport's buffer.  A client whose game froze, or that never reads, would
make that buffer grow by the size of every reply's speech.  So each
connection's queued bytes are watched after every write:

  - over C{soft} bytes the client is I{congested}: the connection stops
    sending it audio, and cancels its current turn upstream so that RPEngine's
    time goes to clients who listen;
  - over C{hard} bytes, or congested for longer than C{grace} seconds, it is
    closed with 1008 and a reason;
  - back under half of C{soft}, it is well again.

While congested the buffer is polled (a few times a second), because the
transport announces nothing when it drains.  We do not register as the
transport's push producer: after the upgrade, twisted.web's HTTP channel is
still registered there, and replacing it changes how the transport closes.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from twisted.internet.abstract import FileDescriptor
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

_log = Logger()

#: What L{transportBacklog} reads of a Twisted TCP transport (a
#: C{FileDescriptor}): its buffer, the offset sent from it, and the length of
#: the list buffer that writes go to first, a private attribute that a
#: Twisted release may rename.
BACKLOG_ATTRIBUTES = ("dataBuffer", "offset", "_tempDataLen")

#: Whether the warning that the backlog cannot be read in full was logged
#: (once a process).
_warned = False


def transportBacklog(transport: Any) -> int:
    """
    Bytes written to a Twisted TCP transport and not yet handed to the
    kernel: the unsent part of C{dataBuffer} plus the list buffer
    (C{_tempDataLen}).  Other transports (TLS wrappers, fakes) report 0.

    A TCP transport that lacks one of L{BACKLOG_ATTRIBUTES} (a Twisted that
    renamed it) counts what it has, and a warning is logged once: slow-client
    protection then sees less of the backlog, or none of it.
    """
    try:
        buffered = len(transport.dataBuffer) - int(transport.offset)
        return max(0, buffered) + int(transport._tempDataLen)
    except (AttributeError, TypeError):
        if not isinstance(transport, FileDescriptor):
            return 0
    missing = missingBacklogAttributes(transport)
    warnBacklogUnreadable(type(transport).__name__, missing)
    buffered = 0
    if "dataBuffer" not in missing and "offset" not in missing:
        buffered = max(0, len(transport.dataBuffer) - int(transport.offset))
    return buffered + int(getattr(transport, "_tempDataLen", 0))


def missingBacklogAttributes(transport: Any) -> list[str]:
    """
    Which of L{BACKLOG_ATTRIBUTES} C{transport} lacks.
    """
    return [name for name in BACKLOG_ATTRIBUTES if not hasattr(transport, name)]


def checkBacklogReadable(reactor: Any) -> bool:
    """
    At start-up: whether this Twisted's TCP transports still have what
    L{transportBacklog} reads (asked of a transport that is never connected);
    if not, the warning is logged now rather than at the first client.
    """
    missing = missingBacklogAttributes(FileDescriptor(reactor))
    if missing:
        warnBacklogUnreadable(FileDescriptor.__name__, missing)
    return not missing


def warnBacklogUnreadable(transportClass: str, missing: list[str]) -> None:
    """
    Say, once a process, that slow-client protection cannot read a
    transport's backlog in full.
    """
    global _warned
    if _warned:
        return
    _warned = True
    _log.warn(
        "slow-client protection reduced: Twisted {twistedVersion}'s {transportClass} "
        "has no {missing}, so a client's unsent bytes are not all counted and a "
        "client that stops reading may not be noticed (rpmiddleware/client/flow.py "
        "reads them; update it for this Twisted)",
        twistedVersion=version("twisted"),
        transportClass=transportClass,
        missing=", ".join(missing),
        missingAttributes=missing,
    )


class SendGuard:
    """
    The congestion state of one connection's outgoing bytes.

    Twisted hands written bytes to the kernel only in a later reactor
    iteration, so right after a write the backlog always includes that
    message.  A message bigger than C{soft} (a non-streaming reply's WAV) is
    therefore given one poll interval to drain before it counts against the
    client; smaller ones count at once, so a client that stops reading is
    caught within a few audio chunks.

    @param pending: bytes queued for the peer now.
    @param onCongested: called once when the peer becomes congested.
    @param onRelieved: called once when it is well again.
    @param onOverflow: called (once) with a reason when it must be closed.
    """

    def __init__(
        self,
        clock: IReactorTime,
        pending: Callable[[], int],
        soft: int,
        hard: int,
        grace: float,
        onCongested: Callable[[], None],
        onRelieved: Callable[[], None],
        onOverflow: Callable[[str], None],
    ) -> None:
        self.clock = clock
        self.pending = pending
        self.soft = soft
        self.hard = hard
        self.grace = grace
        self._onCongested = onCongested
        self._onRelieved = onRelieved
        self._onOverflow = onOverflow
        self.congested = False
        self.overflowed = False
        self.since: float | None = None
        #: The most bytes ever counted against the client, for the log and tests.
        self.peak = 0
        #: Bytes of large messages written since the last poll, not yet counted.
        self._allowance = 0
        self._timer: IDelayedCall | None = None

    @property
    def pollInterval(self) -> float:
        return min(0.25, max(self.grace / 4, 0.01))

    def wrote(self, size: int) -> None:
        """
        Check after writing a message of C{size} bytes.
        """
        if self.overflowed:
            return
        if size > self.soft:
            self._allowance += size
            self._watch()
        self._judge(self.pending() - self._allowance)

    def _judge(self, queued: int) -> None:
        self.peak = max(self.peak, queued)
        if queued > self.hard:
            self._overflow(f"{queued} bytes are waiting for this client (limit {self.hard})")
        elif queued > self.soft and not self.congested:
            self.congested = True
            self.since = self.clock.seconds()
            self._watch()
            self._onCongested()

    def _watch(self) -> None:
        if self._timer is None:
            self._timer = self.clock.callLater(self.pollInterval, self._poll)

    def _poll(self) -> None:
        self._timer = None
        self._allowance = 0
        if self.overflowed:
            return
        queued = self.pending()
        if not self.congested:
            self._judge(queued)
            return
        self.peak = max(self.peak, queued)
        assert self.since is not None
        if queued > self.hard:
            self._overflow(f"{queued} bytes are waiting for this client (limit {self.hard})")
        elif queued <= self.soft // 2:
            self.congested = False
            self.since = None
            self._onRelieved()
        elif self.clock.seconds() - self.since >= self.grace:
            self._overflow(
                f"the client has not read its messages for {self.grace:g} s "
                f"({queued} bytes waiting)"
            )
        else:
            self._watch()

    def _overflow(self, why: str) -> None:
        self.overflowed = True
        self.stop()
        self._onOverflow(why)

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
