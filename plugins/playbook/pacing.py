"""
When the character speaks unasked: game events that wait for a turn, the
auto_event turns that tell them, and the idle timer.

Kept together because they are one decision, made again after every change
to a session (L{Pacer.settle}): while a turn of the client plays or is asked
for, nothing else may start (nothing interrupts a reply); once the client is
idle, waiting events are told in one coalesced turn; with nothing waiting,
the silence is timed for the stage's idle rules.  A turn the endpoint could
not start leaves the session I{away}: asking again and again a client that
cannot play would only pile up refusals, so the events wait for the client's
own next turn instead.

Nothing is dropped silently: past C{maxPendingEvents} the least urgent event
becomes context for the next turn, and past C{maxContextEvents} the oldest
context line is dropped and the client is told (C{RATE_LIMITED}).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.builtin.playbook import wire
from rpmiddleware.builtin.playbook.outbox import Outbox
from rpmiddleware.builtin.playbook.rules import idleRules, short
from rpmiddleware.builtin.playbook.sessions import Sessions
from rpmiddleware.builtin.playbook.state import SessionState
from rpmiddleware.plugin import Envelope


class Pacer:
    """
    @param timers: the reactor (or test clock) the timers run on.
    @param idle: called with a client id when its silence may have lasted
        long enough for an idle rule.
    """

    log = Logger()

    def __init__(
        self,
        sessions: Sessions,
        outbox: Outbox,
        timers: Callable[[], Any],
        idle: Callable[[str], None],
        *,
        maxPendingEvents: int,
        maxContextEvents: int,
        turnStartTimeout: float,
    ) -> None:
        self._sessions = sessions
        self._outbox = outbox
        self._timers = timers
        self._idle = idle
        self.maxPendingEvents = maxPendingEvents
        self.maxContextEvents = maxContextEvents
        self.turnStartTimeout = turnStartTimeout

    def settle(self, state: SessionState) -> None:
        """
        After any change: ask for a turn if events wait and the client is
        idle, otherwise keep the idle timer right.
        """
        if state.open or state.turnAsked is not None or state.away:
            state.stopIdle()
            return
        if state.pending:
            state.stopIdle()
            self.askTurn(state)
            return
        rules = idleRules(state)
        if not rules:
            state.stopIdle()
            return
        due = state.idleSince + min(r.after or 0.0 for r in rules)
        timer = state.idleTimer
        if timer is not None and timer.active() and abs(timer.getTime() - due) < 1e-9:
            return
        state.stopIdle()
        reactor = self._timers()
        state.idleTimer = reactor.callLater(
            max(0.0, due - reactor.seconds()), self._idle, state.clientId
        )

    # What waits for a turn.

    def pend(self, state: SessionState, text: str, priority: float, source: str) -> None:
        demoted = state.addPending(text, priority, self.maxPendingEvents, source)
        if demoted is not None:
            self.log.info(
                "session {client}: {limit} events already wait for a turn; {text!r} becomes "
                "context for the next turn",
                client=state.clientId,
                limit=self.maxPendingEvents,
                text=short(demoted),
            )
            self.remember(state, demoted)

    def remember(self, state: SessionState, text: str) -> None:
        dropped = state.addContext(text, self.maxContextEvents)
        if dropped is not None:
            message = (
                f"more than {self.maxContextEvents} game events wait for the next turn; "
                f'the oldest was dropped: "{short(dropped)}"'
            )
            self.log.warn("session {client}: {message}", client=state.clientId, message=message)
            self._outbox.error(state.clientId, "RATE_LIMITED", message)

    # Turns asked of the client endpoint.

    def askTurn(self, state: SessionState, interrupt: bool = False) -> None:
        """
        Ask the client endpoint (one reactor turn later) for an auto_event
        turn that tells the waiting events.

        @param interrupt: ask even while a reply plays (an urgent event).
        """
        if state.turnAsked is not None or state.away:
            return
        token = uuid.uuid4().hex
        state.turnAsked = token
        state.turnTimer = self._timers().callLater(
            self.turnStartTimeout, self._turnNeverCame, state.clientId, token
        )

        def ask() -> Envelope | None:
            if state.turnAsked != token or not self._sessions.isCurrent(state):
                return None
            if not state.pending or (state.open and not interrupt):
                # A turn of the client's own came first and took the events.
                state.clearAsk()
                self.settle(state)
                return None
            text = "\n".join(e.text for e in state.ordered())
            return wire.toGame(wire.TURN, state.clientId, token=token, text=text)

        self._outbox.post(ask)

    def turnFailed(self, state: SessionState, token: Any, why: str) -> None:
        """
        The endpoint could not start the turn asked for with C{token}.
        """
        if state.turnAsked is None or token != state.turnAsked:
            return
        self._away(state, why)

    def _turnNeverCame(self, clientId: str, token: str) -> None:
        state = self._sessions.get(clientId)
        if state is None or state.turnAsked != token:
            return
        state.turnTimer = None
        self._away(state, f"no turn started within {self.turnStartTimeout:g} s")

    def _away(self, state: SessionState, why: str) -> None:
        state.clearAsk()
        state.away = True
        self.log.info(
            "session {client}: the auto_event turn asked for did not start ({why}); "
            "{count} event(s) wait for the client's next turn",
            client=state.clientId,
            why=why,
            count=len(state.pending),
        )
        self.settle(state)
