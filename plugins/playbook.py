"""
playbook: a game's dialogue logic in the middleware.

A playbook (C{docs/playbooks.md}) has stages.  Each stage says what RPEngine
is told (C{promptScene}, C{promptDirective}, the voice) and when to move on:
the player's words, the character's finished reply, a tool's result, a game
event, silence, or a number of turns.  Transitions may run tools (game
actions) on the way.  This plugin keeps, per client session, where the
conversation is, and:

  - sets the prompt fields (and voice) of every request of that client for
    its current stage; typed and spoken turns are C{direct_user} turns with
    the stage's C{directUserGuide}, turns the game's events cause are
    C{auto_event} turns with its C{autoEventGuide};
  - fires transitions and runs their tools, telling the client
    C{stage-change}, C{tool-call-start} and C{tool-call-end};
  - queues the game's live events while a reply plays and asks the client
    endpoint for an C{auto_event} turn when the client is idle.

It talks to the client endpoint only with the envelopes of
L{rpmiddleware.playbookwire}, through the chain: the endpoint translates
them to and from client messages.  Everything it sends toward the game goes
out one reactor turn later, in order, so that a client sees a turn's
transcript before the stage change its words caused, and the endpoint has
finished a turn before it is asked for the next.

A session without a playbook that sends no events is not touched: its
requests pass unchanged.  So the plugin is in the default chain, nearest the
game (it must see every request and every ending of a client's turns,
including those other plugins answer themselves).
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from twisted.logger import Logger
from zope.interface import implementer

from plugins.playbook_model import Playbook, PlaybookError, Rule, loadPlaybookFile, parsePlaybook
from plugins.playbook_model import parseText as parsePlaybookText
from plugins.playbook_state import OpenRequest, SessionState, ToolRun
from plugins.playbook_tools import ToolRunner, discoverTools
from rpmiddleware import playbookwire as wire
from rpmiddleware.envelope import Envelope
from rpmiddleware.interfaces import IChainContext, IEnvelopePlugin, IPluginServices
from rpmiddleware.messages import textOfDelta
from rpmiddleware.plugin import ChainPlugin, PluginFactory, rejectUnknownSettings
from rpmiddleware.timeline import Timeline

NAME = wire.PLUGIN_NAME

#: Requests that open a turn.
REQUESTS = frozenset({"reply.request", "voice.capture.start"})
#: A client withdrawing a turn: from then on nothing of it plays.
WITHDRAWING = frozenset({"request.cancel", "voice.capture.cancel"})
TERMINAL = frozenset({"reply.completed", "reply.cancelled", "request.error"})
#: The only engine-to-game envelopes this plugin looks at (every audio chunk
#: passes here; the rest go straight on).
WATCHED = frozenset({"reply.accepted", "reply.text.delta", "reply.text.completed"}) | TERMINAL

#: Client id of requests that carry none (the in-process Python API).
DEFAULT_CLIENT = "api"
#: requestIds remembered so that a request entering the chain again (sent
#: again in a new RPEngine session) is not taken for a new turn.
SEEN_REQUESTS = 4096
#: Requests whose tool calls are kept for the timeline.
NOTED_REQUESTS = 256
#: What an idle transition without C{say} tells RPEngine happened.
IDLE_TEXT = "The player has said nothing for {after:g} seconds."

SETTINGS = {
    "characters",
    "tool_timeout",
    "client_playbooks",
    "max_pending_events",
    "max_context_events",
    "interrupt_priority",
    "max_sessions",
    "turn_start_timeout",
}


def clientOf(envelope: Envelope) -> str:
    client = envelope.meta.get("client")
    return client if isinstance(client, str) and client else DEFAULT_CLIENT


@implementer(IEnvelopePlugin)
class PlaybookPlugin(ChainPlugin):
    """
    See the module docstring and C{docs/playbooks.md}.

    @param playbooks: the playbook of each characterId (from the configuration).
    @param tools: the middleware's tools (L{ITool}) by name.
    @param interruptPriority: events of at least this priority start their
        turn at once, interrupting a reply that plays (None: never).
    @param turnStartTimeout: seconds the endpoint has to start an
        auto_event turn asked of it before the session counts as away.
    @param clock: runs the timers (idle, tool and turn timeouts) and measures
        tool durations instead of the chain's reactor, so an end-to-end test
        over real sockets can drive them with a L{Clock}.
    """

    name = NAME
    log = Logger()

    def __init__(
        self,
        playbooks: Mapping[str, Playbook] | None = None,
        tools: Mapping[str, Any] | None = None,
        *,
        toolTimeout: float = 10.0,
        clientPlaybooks: bool = True,
        maxPendingEvents: int = 8,
        maxContextEvents: int = 16,
        interruptPriority: float | None = None,
        maxSessions: int = 1024,
        turnStartTimeout: float = 30.0,
        timeline: Timeline | None = None,
        clock: Any = None,
    ) -> None:
        self.clock = clock
        self.playbooks = dict(playbooks or {})
        self.tools = dict(tools or {})
        self.toolTimeout = toolTimeout
        self.clientPlaybooks = clientPlaybooks
        self.maxPendingEvents = maxPendingEvents
        self.maxContextEvents = maxContextEvents
        self.interruptPriority = interruptPriority
        self.maxSessions = maxSessions
        self.turnStartTimeout = turnStartTimeout
        self.timeline = timeline
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        #: Open requestId -> client, to find a session from RPEngine's envelopes.
        self._requests: dict[str, str] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._toolNotes: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._context: IChainContext | None = None
        self._outbox: deque[Envelope | Callable[[], Envelope | None]] = deque()
        self._flushCall: Any = None
        self._flushing = False
        self.runner = ToolRunner(
            self.tools, toolTimeout, self._timers, self._post, self._noteTool, self._toolEnded
        )

    # What the console shows.

    def state(self, clientId: str) -> dict[str, Any] | None:
        """
        Where the session C{clientId} is: playbook, stage, turns in it, events
        waiting, tools running and recently run, recent stage changes.
        """
        state = self._states.get(clientId)
        return state.describe(self._now()) if state is not None else None

    def states(self) -> list[dict[str, Any]]:
        """
        L{state} of every session the plugin remembers, least recently active first.
        """
        now = self._now()
        return [s.describe(now) for s in self._states.values()]

    def stop(self) -> None:
        """
        Cancel every timer (idle nudges, tool timeouts, turn asks): the
        middleware is stopping.
        """
        for state in self._states.values():
            state.stop()
        if self._flushCall is not None and self._flushCall.active():
            self._flushCall.cancel()
        self._flushCall = None
        self._outbox.clear()

    def parse(self, document: Mapping[str, Any], source: str = "client") -> Playbook:
        """
        Check a playbook document against this plugin's tools.

        @raise PlaybookError: naming the stage and field.
        """
        return parsePlaybook(document, self.tools, source=source, defaultName="playbook")

    # Game to engine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        self._context = context
        kind = envelope.type
        if kind in REQUESTS:
            self._request(envelope)
            return envelope
        if kind in WITHDRAWING:
            self._withdrawn(envelope)
            return envelope
        if kind.startswith(wire.PREFIX):
            handler = self._FROM_GAME.get(kind)
            if handler is not None:
                handler(self, envelope)
            else:
                self.log.warn("unknown playbook envelope {type}; dropped", type=kind)
            return None
        return envelope

    # Engine to game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        if kind not in WATCHED:
            return envelope
        self._context = context
        requestId = envelope.requestId
        if requestId is None:
            return envelope
        if kind in TERMINAL:
            client = self._requests.pop(requestId, None)
        else:
            client = self._requests.get(requestId)
        state = self._states.get(client) if client is not None else None
        if state is None:
            return envelope
        if kind in TERMINAL:
            self._ended(state, requestId, kind == "reply.completed")
            return envelope
        info = state.open.get(requestId)
        if info is None or state.playbook is None:
            return envelope
        if kind == "reply.accepted":
            heard = envelope.get("transcript")
            if not info.auto and info.playerText is None and isinstance(heard, str) and heard:
                info.playerText = heard
                self._fire(state, "player", text=heard, requestId=requestId)
                self._settle(state)
        elif kind == "reply.text.delta":
            info.pieces.append(textOfDelta(envelope.fields))
        else:
            text = envelope.get("text")
            if not isinstance(text, str):
                text = "".join(info.pieces)
            info.pieces = []
            self._fire(state, "reply", text=text, requestId=requestId)
            self._settle(state)
        return envelope

    # Turns.

    def _request(self, envelope: Envelope) -> None:
        requestId = envelope.requestId
        if requestId is None or requestId in self._seen:
            # Entering the chain again (a new RPEngine session): it was
            # decorated the first time and its fields still are.
            return
        self._seen[requestId] = None
        while len(self._seen) > SEEN_REQUESTS:
            self._seen.popitem(last=False)
        state = self._state(clientOf(envelope))
        state.away = False
        characterId = envelope.get("characterId")
        self._choose(state, characterId if isinstance(characterId, str) else None)
        auto = envelope.get("interactionMode") == "auto_event"
        # A turn this plugin asked for (even one given up on since: it waited
        # behind another turn too long) tells the waiting events, nothing else.
        token = envelope.meta.get(wire.TURN_TOKEN)
        ours = token is not None
        if ours and token == state.turnAsked:
            state.clearAsk()
        event = envelope.get("event")
        event = event if isinstance(event, dict) else None
        playerText = None
        if not auto and event is not None and "audio" not in event:
            typed = event.get("text")
            playerText = typed if isinstance(typed, str) and typed.strip() else None
        info = state.open.setdefault(requestId, OpenRequest(requestId, auto, None, playerText))
        self._requests[requestId] = state.clientId
        state.stopIdle()
        if playerText is not None:
            self._fire(state, "player", text=playerText, requestId=requestId)
        self._decorate(envelope, state, auto, ours, event)
        info.stage = state.stage
        for run in state.unattached:
            run.requestId = requestId
            self._noteTool(run)
        state.unattached.clear()
        if state.playbook is not None and self.timeline is not None:
            self.timeline.note(
                requestId,
                playbook=state.playbook.name,
                stage=state.stage,
                interactionMode=envelope.get("interactionMode"),
            )
        self._settle(state)

    def _decorate(
        self,
        envelope: Envelope,
        state: SessionState,
        auto: bool,
        ours: bool,
        event: dict[str, Any] | None,
    ) -> None:
        """
        The stage's prompt fields and voice, the game's scene, and the events
        waiting, onto a request.
        """
        playbook = state.playbook
        stage = playbook.stage(state.stage) if playbook is not None and state.stage else None
        if stage is not None:
            envelope["interactionMode"] = "auto_event" if auto else "direct_user"
            directive = _table(envelope.get("promptDirective"))
            directive.update(stage.promptDirective)
            # RPEngine reads only the guide of the turn's mode; the other is noise.
            directive.pop("directUserGuide" if auto else "autoEventGuide", None)
            if directive:
                envelope["promptDirective"] = directive
            else:
                envelope.fields.pop("promptDirective", None)
            output = envelope.get("output")
            if stage.voice and isinstance(output, dict) and isinstance(output.get("audio"), dict):
                envelope["output"] = {**output, "audio": {**output["audio"], "voice": stage.voice}}
        if stage is not None or state.scene:
            scene = _table(envelope.get("promptScene"))
            if stage is not None:
                scene.update(stage.promptScene)
            if state.scene:
                base = scene.get("sceneContext")
                scene["sceneContext"] = f"{base}\n\n{state.scene}" if base else state.scene
            if scene:
                envelope["promptScene"] = scene
        if event is None or not (state.context or state.pending):
            return
        lines = state.takeLines()
        said = event.get("text") if isinstance(event.get("text"), str) else None
        if auto and (ours or not said):
            text = "\n".join(lines)
        elif auto:
            text = "\n".join([*lines, said or ""])
        else:
            told = "\n".join(f"[Event: {line}]" for line in lines)
            text = f"{told}\n{said}" if said else told
        envelope["event"] = {**event, "text": text}

    def _withdrawn(self, envelope: Envelope) -> None:
        requestId = envelope.requestId
        client = self._requests.pop(requestId, None) if requestId is not None else None
        state = self._states.get(client) if client is not None else None
        if state is None or requestId is None or state.open.pop(requestId, None) is None:
            return
        state.idleSince = self._now()
        self._settle(state)

    def _ended(self, state: SessionState, requestId: str, completed: bool) -> None:
        info = state.open.pop(requestId, None)
        if info is None:
            return
        state.idleSince = self._now()
        if completed and not info.auto and state.playbook is not None:
            if info.stage == state.stage:
                state.turnsInStage += 1
                self._fire(state, "turns", requestId=requestId)
        self._settle(state)

    # Sessions and playbooks.

    def _state(self, clientId: str) -> SessionState:
        state = self._states.get(clientId)
        if state is None:
            state = self._states[clientId] = SessionState(clientId, self._now())
            while len(self._states) > self.maxSessions:
                _, old = self._states.popitem(last=False)
                old.stop()
                self.log.info("forgot the playbook state of session {client}", client=old.clientId)
        else:
            self._states.move_to_end(clientId)
        return state

    def _choose(self, state: SessionState, characterId: str | None) -> None:
        """
        The configured playbook of the character a request is for, unless the
        client sent its own.
        """
        if state.source == "client":
            state.characterId = characterId
            return
        playbook = self.playbooks.get(characterId) if characterId is not None else None
        changed = characterId != state.characterId or playbook is not state.playbook
        state.characterId = characterId
        if changed:
            self._install(state, playbook, "config" if playbook is not None else None)

    def _install(self, state: SessionState, playbook: Playbook | None, source: str | None) -> None:
        had = state.playbook is not None
        state.playbook = playbook
        state.source = source
        state.fired.clear()
        state.enter(playbook.initial if playbook is not None else None, self._now())
        if playbook is not None or had:
            self.log.info(
                "session {client} plays {playbook} ({source}), stage {stage}",
                client=state.clientId,
                playbook=playbook.name if playbook is not None else None,
                source=source,
                stage=state.stage,
            )
            self._post(
                wire.toGame(
                    wire.STATE,
                    state.clientId,
                    playbook=playbook.name if playbook is not None else None,
                    stage=state.stage,
                    source=source,
                )
            )

    def _load(self, envelope: Envelope) -> None:
        state = self._state(clientOf(envelope))
        state.away = False
        if not self.clientPlaybooks:
            self._error(
                state.clientId,
                "PLAYBOOK_ERROR",
                "this middleware does not take playbooks from clients "
                "(plugins.playbook.client_playbooks is false)",
            )
            return
        document = envelope.get("playbook")
        toml = envelope.get("toml")
        if document is None and toml is None:
            configured = self.playbooks.get(state.characterId or "")
            self._install(state, configured, "config" if configured is not None else None)
            self._settle(state)
            return
        try:
            if isinstance(toml, str):
                document = parsePlaybookText(toml, "toml", "the playbook message")
            if not isinstance(document, dict):
                raise PlaybookError("playbook must be an object")
            playbook = self.parse(document)
        except PlaybookError as e:
            self.log.info(
                "refused a playbook from session {client}: {why}", client=state.clientId, why=str(e)
            )
            self._error(state.clientId, "PLAYBOOK_ERROR", str(e))
            return
        self._install(state, playbook, "client")
        self._settle(state)

    # Transitions.

    def _fire(
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
            if rule.on != trigger or _exhausted(state, rule):
                continue
            why = self._why(state, rule, text, tool, outcome, result)
            if why is not None:
                self._take(state, rule, rule.reason or why, requestId)
                return True
        return False

    def _why(
        self,
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
                return f'game event "{_short(text)}"'
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

    def _take(
        self,
        state: SessionState,
        rule: Rule,
        reason: str,
        requestId: str | None,
        say: str | None = None,
    ) -> None:
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
                reason=reason,
            )
            state.history.append(
                {"from": previous, "to": rule.to, "reason": reason, "requestId": requestId}
            )
            self._post(
                wire.toGame(
                    wire.STAGE_CHANGE,
                    state.clientId,
                    turnId=requestId,
                    reason=reason,
                    **{"from": previous, "to": rule.to},
                )
            )
        if rule.tools:
            self.runner.runAll(state, state.playbook, rule.tools, requestId)
        say = rule.say if say is None else say
        if say:
            self._pend(state, say, 0.0, "playbook")

    def _idle(self, clientId: str) -> None:
        state = self._states.get(clientId)
        if state is None:
            return
        state.idleTimer = None
        playbook = state.playbook
        if playbook is None or state.stage is None or state.open or state.turnAsked or state.away:
            return
        now = self._now()
        due = [
            r
            for r in _idleRules(state)
            if r.after is not None and state.idleSince + r.after <= now + 1e-9
        ]
        if not due:
            self._settle(state)
            return
        rule = min(due, key=lambda r: r.after or 0.0)
        assert rule.after is not None
        state.idleSince = now
        say = rule.say if rule.say is not None else IDLE_TEXT.format(after=rule.after)
        self._take(state, rule, rule.reason or f"idle for {rule.after:g} s", None, say=say)
        self._settle(state)

    def _settle(self, state: SessionState) -> None:
        """
        After any change: ask for a turn if events wait and the client is
        idle, otherwise keep the idle timer right.
        """
        if state.open or state.turnAsked is not None or state.away:
            state.stopIdle()
            return
        if state.pending:
            state.stopIdle()
            self._askTurn(state)
            return
        rules = _idleRules(state)
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

    # Game events and auto_event turns.

    def _event(self, envelope: Envelope) -> None:
        state = self._state(clientOf(envelope))
        state.away = False
        text = str(envelope.get("text") or "")
        scene = envelope.get("scene")
        if isinstance(scene, str):
            state.scene = scene or None
        priority = envelope.get("priority")
        priority = float(priority) if isinstance(priority, int | float) else 0.0
        self._fire(state, "event", text=text)
        if envelope.get("replyPolicy") == "none":
            self._remember(state, text)
        else:
            self._pend(state, text, priority, "event")
            urgent = self.interruptPriority is not None and priority >= self.interruptPriority
            if urgent and state.open:
                self._askTurn(state, interrupt=True)
        self._settle(state)

    def _pend(self, state: SessionState, text: str, priority: float, source: str) -> None:
        demoted = state.addPending(text, priority, self.maxPendingEvents, source)
        if demoted is not None:
            self.log.info(
                "session {client}: {limit} events already wait for a turn; {text!r} becomes "
                "context for the next turn",
                client=state.clientId,
                limit=self.maxPendingEvents,
                text=_short(demoted),
            )
            self._remember(state, demoted)

    def _remember(self, state: SessionState, text: str) -> None:
        dropped = state.addContext(text, self.maxContextEvents)
        if dropped is not None:
            message = (
                f"more than {self.maxContextEvents} game events wait for the next turn; "
                f'the oldest was dropped: "{_short(dropped)}"'
            )
            self.log.warn("session {client}: {message}", client=state.clientId, message=message)
            self._error(state.clientId, "RATE_LIMITED", message)

    def _askTurn(self, state: SessionState, interrupt: bool = False) -> None:
        """
        Ask the client endpoint (one reactor turn later) for an auto_event
        turn that tells the waiting events.
        """
        if state.turnAsked is not None or state.away:
            return
        token = uuid.uuid4().hex
        state.turnAsked = token
        state.turnTimer = self._timers().callLater(
            self.turnStartTimeout, self._turnNeverCame, state.clientId, token
        )

        def ask() -> Envelope | None:
            if state.turnAsked != token or self._states.get(state.clientId) is not state:
                return None
            if not state.pending or (state.open and not interrupt):
                # A turn of the client's own came first and took the events.
                state.clearAsk()
                self._settle(state)
                return None
            text = "\n".join(e.text for e in state.ordered())
            return wire.toGame(wire.TURN, state.clientId, token=token, text=text)

        self._post(ask)

    def _turnNeverCame(self, clientId: str, token: str) -> None:
        state = self._states.get(clientId)
        if state is None or state.turnAsked != token:
            return
        state.turnTimer = None
        self._away(state, f"no turn started within {self.turnStartTimeout:g} s")

    def _turnFailed(self, envelope: Envelope) -> None:
        state = self._states.get(clientOf(envelope))
        if state is None or state.turnAsked is None or envelope.get("token") != state.turnAsked:
            return
        self._away(state, str(envelope.get("reason") or "the endpoint could not start it"))

    def _away(self, state: SessionState, why: str) -> None:
        """
        Nobody started the turn asked for: stop asking (and nudging) until
        the client is heard from; the events keep waiting for its next turn.
        """
        state.clearAsk()
        state.away = True
        self.log.info(
            "session {client}: the auto_event turn asked for did not start ({why}); "
            "{count} event(s) wait for the client's next turn",
            client=state.clientId,
            why=why,
            count=len(state.pending),
        )
        self._settle(state)

    # Tools.

    def _toolEnded(self, state: SessionState, run: ToolRun, outcome: str, value: Any) -> None:
        if self._states.get(state.clientId) is not state:
            return
        self._fire(
            state, "tool", tool=run.name, outcome=outcome, result=value, requestId=run.requestId
        )
        self._settle(state)

    def _toolResult(self, envelope: Envelope) -> None:
        client = clientOf(envelope)
        state = self._states.get(client)
        answered = self.runner.answer(
            state, client, envelope.get("callId"), envelope.get("result"), envelope.get("error")
        )
        if answered and state is not None:
            state.away = False

    def _noteTool(self, run: ToolRun) -> None:
        if self.timeline is None or run.requestId is None:
            return
        entries = self._toolNotes.get(run.requestId)
        if entries is None:
            entries = self._toolNotes[run.requestId] = []
            while len(self._toolNotes) > NOTED_REQUESTS:
                self._toolNotes.popitem(last=False)
        if run.entry not in entries:
            entries.append(run.entry)
        self.timeline.note(run.requestId, tools=[dict(e) for e in entries])

    # Sending.

    def _error(self, clientId: str, code: str, message: str, **extra: Any) -> None:
        self._post(wire.toGame(wire.ERROR, clientId, code=code, message=message, **extra))

    def _post(self, item: Envelope | Callable[[], Envelope | None]) -> None:
        """
        Send toward the game one reactor turn from now, in order.
        """
        self._outbox.append(item)
        if not self._flushing and self._flushCall is None:
            self._flushCall = self._reactor().callLater(0, self._flush)

    def _flush(self) -> None:
        self._flushCall = None
        context = self._context
        assert context is not None
        self._flushing = True
        try:
            while self._outbox:
                item = self._outbox.popleft()
                try:
                    envelope = item if isinstance(item, Envelope) else item()
                    if envelope is not None:
                        context.sendToGame(envelope)
                except Exception:
                    self.log.failure("sending a playbook envelope failed")
        finally:
            self._flushing = False

    def _reactor(self) -> Any:
        assert self._context is not None, "the playbook plugin has seen no envelope yet"
        return self._context.reactor

    def _timers(self) -> Any:
        return self.clock if self.clock is not None else self._reactor()

    def _now(self) -> float:
        if self.clock is None and self._context is None:
            return 0.0
        return float(self._timers().seconds())

    _FROM_GAME: dict[str, Callable[[PlaybookPlugin, Envelope], None]] = {
        wire.LOAD: _load,
        wire.EVENT: _event,
        wire.TOOL_RESULT: _toolResult,
        wire.TURN_FAILED: _turnFailed,
    }


def _table(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exhausted(state: SessionState, rule: Rule) -> bool:
    return rule.limit is not None and state.fired[rule.key] >= rule.limit


def _idleRules(state: SessionState) -> list[Rule]:
    if state.playbook is None or state.stage is None:
        return []
    return [
        r for r in state.playbook.stage(state.stage).rulesOn("idle") if not _exhausted(state, r)
    ]


# The factory.


def _number(settings: Mapping[str, Any], key: str, default: float, low: float) -> float:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise ValueError(
            f"plugins.{NAME}.{key} must be a number of at least {low:g}, got {value!r}"
        )
    return float(value)


def _whole(settings: Mapping[str, Any], key: str, default: int, low: int) -> int:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            f"plugins.{NAME}.{key} must be a whole number of at least {low}, got {value!r}"
        )
    return value


def build(
    settings: Mapping[str, Any], services: IPluginServices, providers: tuple[Any, ...] = ()
) -> PlaybookPlugin:
    """
    The plugin from C{[plugins.playbook]}: every configured playbook file is
    read and checked now, so a mistake stops start-up naming the file, the
    stage and the field.
    """
    rejectUnknownSettings(NAME, settings, SETTINGS)
    tools = discoverTools(providers)
    characters = settings.get("characters", {})
    if not isinstance(characters, dict) or not all(
        isinstance(v, str) and v for v in characters.values()
    ):
        raise ValueError(
            f'plugins.{NAME}.characters must be a table of characterId = "playbook file"'
        )
    loaded: dict[str, Playbook] = {}
    playbooks: dict[str, Playbook] = {}
    for characterId, name in characters.items():
        path = services.config.relativePath(name)
        key = str(path.resolve())
        if key not in loaded:
            try:
                loaded[key] = loadPlaybookFile(path, tools)
            except PlaybookError as e:
                raise ValueError(f"plugins.{NAME}.characters.{characterId}: {e}")
        playbooks[characterId] = loaded[key]
    clientPlaybooks = settings.get("client_playbooks", True)
    if not isinstance(clientPlaybooks, bool):
        raise ValueError(f"plugins.{NAME}.client_playbooks must be true or false")
    interrupt = settings.get("interrupt_priority")
    if interrupt is not None:
        interrupt = _number(settings, "interrupt_priority", 0.0, float("-inf"))
    return PlaybookPlugin(
        playbooks,
        tools,
        toolTimeout=_number(settings, "tool_timeout", 10.0, 0.001),
        clientPlaybooks=clientPlaybooks,
        maxPendingEvents=_whole(settings, "max_pending_events", 8, 1),
        maxContextEvents=_whole(settings, "max_context_events", 16, 1),
        interruptPriority=interrupt,
        maxSessions=_whole(settings, "max_sessions", 1024, 1),
        turnStartTimeout=_number(settings, "turn_start_timeout", 30.0, 0.001),
        timeline=services.timeline,
    )


playbook = PluginFactory(
    NAME,
    "Playbooks: stages, transitions and tools that drive what RPEngine is told; live game events.",
    build,
)
