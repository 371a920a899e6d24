"""
Transitions: which rule of a session's stage a happening fires, the reason a
client reads for it, and what taking it does.

Deciding is kept apart from taking: L{whyFires} and L{dueIdleRule} only read
a session's state, so the whole trigger table of C{docs/playbooks.md} can be
read (and tested) in one place, while L{Transitions.take} is the one place a
stage changes, so every change is logged, remembered for the console and
told to the client the same way, whatever fired it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from rpmiddleware.builtin.playbook import wire
from rpmiddleware.builtin.playbook.model import Rule
from rpmiddleware.builtin.playbook.outbox import Outbox
from rpmiddleware.builtin.playbook.state import SessionState
from rpmiddleware.builtin.playbook.tools import ToolRunner
from rpmiddleware.plugin import Envelope

#: What an idle transition without C{say} tells RPEngine happened.
IDLE_TEXT = "The player has said nothing for {after:g} seconds."

#: Puts a transition's C{say} in the queue of what waits for a turn:
#: C{(state, text, priority, source)}.
Pend = Callable[[SessionState, str, float, str], None]


def short(text: str, limit: int = 60) -> str:
    """
    A text quoted in a reason or a log line: one line, bounded.
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def stageChange(
    clientId: str, previous: str | None, stage: str, why: str, requestId: str | None
) -> Envelope:
    """
    Built in one place so that what a resumed client is told of its stage
    has exactly the shape of a change it sees live.
    """
    return wire.toGame(
        wire.STAGE_CHANGE, clientId, turnId=requestId, reason=why, **{"from": previous, "to": stage}
    )


def exhausted(state: SessionState, rule: Rule) -> bool:
    return rule.limit is not None and state.fired[rule.key] >= rule.limit


def idleRules(state: SessionState) -> list[Rule]:
    """
    The idle rules of the current stage that may still fire: what the idle
    timer waits for.
    """
    if state.playbook is None or state.stage is None:
        return []
    return [r for r in state.playbook.stage(state.stage).rulesOn("idle") if not exhausted(state, r)]


def dueIdleRule(state: SessionState, now: float) -> Rule | None:
    """
    The idle rule whose silence has lasted long enough (the shortest, when
    several have).
    """
    due = [
        r
        for r in idleRules(state)
        if r.after is not None and state.idleSince + r.after <= now + 1e-9
    ]
    return min(due, key=lambda r: r.after or 0.0) if due else None


def whyFires(
    state: SessionState,
    rule: Rule,
    text: str | None,
    tool: str | None,
    outcome: str | None,
    result: Any,
) -> str | None:
    """
    Why C{rule} fires on these facts (the stage-change reason), or None.
    """
    if rule.on in ("player", "reply", "event"):
        if text is None:
            return None
        if rule.matcher.empty:
            return f'game event "{short(text)}"'
        found = rule.matcher.find(text)
        who = {"player": "player", "reply": "reply", "event": "game event"}[rule.on]
        return f"{who} {found}" if found is not None else None
    if rule.on == "tool":
        if tool != rule.tool or rule.outcome not in ("any", outcome):
            return None
        if outcome == "error" and rule.hasResult:
            return None
        if outcome == "success" and not rule.resultMatches(result):
            return None
        why = f"tool {tool} {'succeeded' if outcome == 'success' else 'failed'}"
        if not rule.matcher.empty:
            shown = result if isinstance(result, str) else json.dumps(result)
            found = rule.matcher.find(shown)
            if found is None:
                return None
            why += f" and its result {found}"
        return why
    if rule.on == "turns":
        if state.turnsInStage != rule.count:
            return None
        return f"{rule.count} turn{'s' if rule.count != 1 else ''} in stage {state.stage}"
    return None


class Transitions:
    """
    @param now: the plugin's clock, for when a stage was entered.
    @param outbox: where C{stage-change} goes.
    @param runner: runs a transition's tools.
    @param pend: queues a transition's C{say} for a turn of its own.
    """

    log = Logger()

    def __init__(
        self, now: Callable[[], float], outbox: Outbox, runner: ToolRunner, pend: Pend
    ) -> None:
        self._now = now
        self._outbox = outbox
        self._runner = runner
        self._pend = pend

    def fire(
        self,
        state: SessionState,
        trigger: str,
        *,
        text: str | None = None,
        tool: str | None = None,
        outcome: str | None = None,
        result: Any = None,
        requestId: str | None = None,
    ) -> bool:
        """
        Take the first rule of the current stage that C{trigger} fires.
        """
        playbook = state.playbook
        if playbook is None or state.stage is None:
            return False
        for rule in playbook.stage(state.stage).rules:
            if rule.on != trigger or exhausted(state, rule):
                continue
            why = whyFires(state, rule, text, tool, outcome, result)
            if why is not None:
                self.take(state, rule, rule.reason or why, requestId)
                return True
        return False

    def take(
        self,
        state: SessionState,
        rule: Rule,
        why: str,
        requestId: str | None,
        say: str | None = None,
    ) -> None:
        """
        @param say: what the character is told happened, instead of the
            rule's own C{say} (an idle rule's made-up silence).
        """
        assert state.playbook is not None
        state.fired[rule.key] += 1
        if rule.to is not None:
            previous = state.stage
            state.enter(rule.to, self._now())
            self.log.info(
                "session {client}: stage {old} -> {new} ({reason})",
                client=state.clientId,
                old=previous,
                new=rule.to,
                reason=why,
            )
            state.history.append(
                {"from": previous, "to": rule.to, "reason": why, "requestId": requestId}
            )
            self._outbox.post(stageChange(state.clientId, previous, rule.to, why, requestId))
        if rule.tools:
            self._runner.runAll(state, state.playbook, rule.tools, requestId)
        say = rule.say if say is None else say
        if say:
            self._pend(state, say, 0.0, "playbook")
