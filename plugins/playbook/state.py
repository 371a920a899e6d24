"""
What the playbook plugin remembers about one client session: where it is in
its playbook, what is playing, which game events wait, which tools run.

Keyed by the client session id (C{meta["client"]}), which a C{reconnect}
keeps, so a client that comes back finds its conversation where it left it.
The rules that change this state are in the other modules of
C{rpmiddleware.builtin.playbook}; this module only holds it, with the event queue's bounds, and
describes it for the console.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall

from rpmiddleware.builtin.playbook.model import Playbook

#: Stage changes and tool calls the console can look back on, per session.
RECENT = 20


@dataclass
class PendingEvent:
    """
    Something that wants a turn of its own (an C{event} with replyPolicy
    C{auto}, or a transition's C{say}) and waits for the client to be idle.
    """

    text: str
    priority: float
    seq: int
    source: str = "event"


@dataclass
class OpenRequest:
    """
    A turn of this client that RPEngine has not finished (or the client has
    not withdrawn).
    """

    requestId: str
    auto: bool
    #: The stage the turn was asked in (after any transition the player's
    #: words fired), for counting turns in a stage.
    stage: str | None = None
    #: The player's words, when known: typed text at once, speech when
    #: RPEngine reports its transcript.
    playerText: str | None = None
    pieces: list[str] = field(default_factory=list)


@dataclass
class ToolRun:
    callId: str
    name: str
    runBy: str
    arguments: dict[str, Any]
    started: float
    requestId: str | None
    #: What the timeline and the console show of this call.
    entry: dict[str, Any] = field(default_factory=dict)


class SessionState:
    """
    One client session's conversation state.
    """

    def __init__(self, clientId: str, now: float) -> None:
        self.clientId = clientId
        self.playbook: Playbook | None = None
        #: "config" (chosen by character) or "client" (sent in a playbook message).
        self.source: str | None = None
        self.characterId: str | None = None
        self.stage: str | None = None
        self.turnsInStage = 0
        self.enteredAt = now
        #: Times each rule fired, for C{limit}.
        self.fired: Counter[tuple[str, int]] = Counter()
        self.open: dict[str, OpenRequest] = {}
        self.pending: list[PendingEvent] = []
        self.context: list[str] = []
        self.scene: str | None = None
        self.idleSince = now
        self.idleTimer: IDelayedCall | None = None
        #: The token of an auto_event turn asked of the client endpoint whose
        #: request has not passed yet.
        self.turnAsked: str | None = None
        self.turnTimer: IDelayedCall | None = None
        #: Nobody started the last turn asked: no more auto turns or idle
        #: nudges until the client is heard from again.
        self.away = False
        self.clientCalls: dict[str, Deferred[Any]] = {}
        self.running: dict[str, ToolRun] = {}
        self.unattached: list[ToolRun] = []
        self.recentTools: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.history: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._seq = 0

    def enter(self, stage: str | None, now: float) -> None:
        self.stage = stage
        self.turnsInStage = 0
        self.enteredAt = now
        self.idleSince = now

    # Game events.

    def addPending(self, text: str, priority: float, limit: int, source: str) -> str | None:
        """
        Queue something that wants a turn.

        @return: the text of the event demoted to context to stay within
            C{limit} (the lowest priority, oldest first), if one was.
        """
        self._seq += 1
        self.pending.append(PendingEvent(text, priority, self._seq, source))
        if len(self.pending) <= limit:
            return None
        demoted = min(self.pending, key=lambda e: (e.priority, e.seq))
        self.pending.remove(demoted)
        return demoted.text

    def addContext(self, text: str, limit: int) -> str | None:
        """
        Keep a line of context for the next turn.

        @return: the oldest line, dropped to stay within C{limit}, if one was.
        """
        self.context.append(text)
        if len(self.context) > limit:
            return self.context.pop(0)
        return None

    def ordered(self) -> list[PendingEvent]:
        """
        Pending events in the order a coalesced turn tells them: highest
        priority first, then as they came.
        """
        return sorted(self.pending, key=lambda e: (-e.priority, e.seq))

    def takeLines(self) -> list[str]:
        """
        Everything waiting for the next turn, in the order it is told: the
        context lines as they came, then the pending events (L{ordered}).
        """
        lines = list(self.context) + [e.text for e in self.ordered()]
        self.context.clear()
        self.pending.clear()
        return lines

    # Timers.

    def stopIdle(self) -> None:
        if self.idleTimer is not None and self.idleTimer.active():
            self.idleTimer.cancel()
        self.idleTimer = None

    def clearAsk(self) -> None:
        self.turnAsked = None
        if self.turnTimer is not None and self.turnTimer.active():
            self.turnTimer.cancel()
        self.turnTimer = None

    def stop(self) -> None:
        """
        Cancel every timer (the plugin stops, or forgets this session).
        Client tool calls still waiting end as cancelled.
        """
        self.stopIdle()
        self.clearAsk()
        for d in list(self.clientCalls.values()):
            d.cancel()
        self.clientCalls.clear()

    # The console.

    def describe(self, now: float) -> dict[str, Any]:
        idleIn = None
        if self.idleTimer is not None and self.idleTimer.active():
            idleIn = round(max(0.0, self.idleTimer.getTime() - now), 3)
        return {
            "clientId": self.clientId,
            "characterId": self.characterId,
            "playbook": self.playbook.name if self.playbook is not None else None,
            "source": self.source,
            "stage": self.stage,
            "stages": list(self.playbook.stages) if self.playbook is not None else [],
            "turnsInStage": self.turnsInStage,
            "secondsInStage": round(max(0.0, now - self.enteredAt), 3),
            "openRequests": list(self.open),
            "pendingEvents": [{"text": e.text, "priority": e.priority} for e in self.ordered()],
            "context": list(self.context),
            "scene": self.scene,
            "runningTools": [dict(run.entry) for run in self.running.values()],
            "recentTools": [dict(e) for e in self.recentTools],
            "stageHistory": list(self.history),
            "idleIn": idleIn,
            "turnAsked": self.turnAsked is not None,
            "away": self.away,
        }
