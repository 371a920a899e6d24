"""
Whether RPEngine still reads the file mailbox: over the folder nothing says
that its tab closed, so the middleware watches what it does with our files.

What RPEngine does while it lives (src/filesystem-mailbox-adapter.ts
C{poll}, C{consume}; crates/rp-engine-core/src/app.rs
C{transport_message}): its adapter lists our folder every 50 ms while
messages flow and every 250 ms when idle, hands each file to the core and
removes it; the core acknowledges every message at once, before it looks at
what the message asks (a request it queues behind 19 others is acknowledged
as promptly as one it starts).  Reading runs on the tab's own timer, apart
from the model: a busy RPEngine, its queue full for minutes, still empties
our folder within a poll and acknowledges what it read.  A gone one (tab
closed, browser quit, folder unselected) leaves our files where they are.

So, while a request is open in the mailbox session:

  - a file of ours still unread after L{READ_LIMIT} seconds means RPEngine
    stopped reading;
  - when RPEngine has sent nothing for L{PROBE_AFTER} seconds (a model
    slow to its first token, or a tab gone quiet), a probe is written that
    RPEngine must answer: C{voice.capture.stop} for a requestId no capture
    has, which app.rs C{stop_capture} ignores and C{transport_message}
    acknowledges.  Unacknowledged after L{READ_LIMIT} seconds, it means the
    same.

The worst case, RPEngine gone just after its last message: the probe is
written after PROBE_AFTER (plus one check interval), and judged READ_LIMIT
later: 3 + 0.25 + 5 + 0.25 = 8.5 s, within the 10 s the product promises.

A tab Chrome throttles hard (hidden for more than five minutes, its timers
woken once a minute) reads too late for that rule and is taken for gone;
its turns end, and the session comes back as soon as it reads again (the
endpoint offers it a fresh C{welcome}), or at a new C{hello}.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from twisted.internet.interfaces import IReactorTime

from rpmiddleware.protocol.envelope import Envelope

if TYPE_CHECKING:
    from rpmiddleware.engine.link import EngineLink
    from rpmiddleware.engine.mailbox.session import MailboxSession


class Outbox(Protocol):
    """
    What the watch reads of the folder RPEngine reads
    (L{rpmiddleware.engine.mailbox.endpoint.FileOutbox}).
    """

    def oldestUnread(self) -> tuple[float, str] | None: ...

    def withdraw(self, messageId: str) -> bool: ...


#: Seconds a file of ours (or the probe's answer) may wait before RPEngine
#: counts as gone: twenty of its idle polls, five of a background tab's
#: once-a-second timers.
READ_LIMIT = 5.0
#: Seconds of silence from RPEngine, while a request waits, before a probe.
PROBE_AFTER = 3.0
#: Seconds between checks (the service polls more often than this).
CHECK_EVERY = 0.25
#: requestIds of probes start so; nothing else uses it.
PROBE_PREFIX = "mailbox-probe-"


class ReaderWatch:
    """
    The mailbox's judgement of whether RPEngine reads it.

    @param onGone: called with the session and the seconds RPEngine has not
        read for, once per session judged gone.
    """

    def __init__(
        self,
        clock: IReactorTime,
        outbox: Outbox,
        link: EngineLink,
        onGone: Callable[[MailboxSession, float], None],
    ) -> None:
        self._clock = clock
        self._outbox = outbox
        self._link = link
        self._onGone = onGone
        self.lastHeard = clock.seconds()
        self._lastCheck = -1e9
        self._probe: tuple[str, float] | None = None
        self.probesSent = 0

    def heard(self) -> None:
        """
        A file from RPEngine was read.
        """
        self.lastHeard = self._clock.seconds()

    @property
    def probeId(self) -> str | None:
        return self._probe[0] if self._probe is not None else None

    def check(self, session: MailboxSession | None) -> None:
        now = self._clock.seconds()
        if now - self._lastCheck < CHECK_EVERY:
            return
        self._lastCheck = now
        if (
            session is None
            or session.closed
            or session.pending
            or self._link.session is not session
            or not self._link.openRequests()
        ):
            # Nothing waits on RPEngine: nothing to judge.
            self._probe = None
            return
        oldest = self._outbox.oldestUnread()
        if oldest is not None and now - oldest[0] >= READ_LIMIT:
            self._gone(session, now - oldest[0])
            return
        probe = self._probe
        if probe is not None:
            messageId, sentAt = probe
            if session.isAcknowledged(messageId):
                self._probe = None
            elif now - sentAt >= READ_LIMIT:
                self._gone(session, now - self.lastHeard)
                return
            else:
                return
        quiet = now - max(self.lastHeard, session.startedAt or now)
        if quiet >= PROBE_AFTER:
            self._sendProbe(session, now)

    def _sendProbe(self, session: MailboxSession, now: float) -> None:
        probe = Envelope.build("voice.capture.stop", requestId=f"{PROBE_PREFIX}{uuid.uuid4().hex}")
        session.send(probe)
        self.probesSent += 1
        self._probe = (str(probe.messageId), now)

    def _gone(self, session: MailboxSession, seconds: float) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            self._outbox.withdraw(probe[0])
        self._onGone(session, seconds)
