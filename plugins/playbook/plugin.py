"""
The playbook plugin in the chain: it sees a client's requests, their endings
and the client endpoint's playbook envelopes, and hands each to the part that
owns the rule (L{rpmiddleware.builtin.playbook.sessions}, L{rpmiddleware.builtin.playbook.prompt},
L{rpmiddleware.builtin.playbook.rules}, L{rpmiddleware.builtin.playbook.pacing}, the tool runner).

Its client messages (C{playbook}, C{event}, C{tool-result}) are its own
(L{rpmiddleware.builtin.playbook.clientmessages}): they reach it through the
chain as any plugin's do, become its envelopes (L{wire}), and what it tells a
client leaves as client messages, so that it can be tested with a
L{PluginHarness} and the endpoint knows no playbook rule.  A session
without a playbook that sends no events is not touched: its requests pass
unchanged, which is why the plugin can sit in the default chain, nearest the
game (it must see every request and every ending of a client's turns,
including those other plugins answer themselves).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from twisted.logger import Logger
from zope.interface import implementer

from rpmiddleware.builtin.playbook import wire
from rpmiddleware.builtin.playbook.api import IPlaybooks
from rpmiddleware.builtin.playbook.clientmessages import CLIENT_TYPES, fromClient, invalid
from rpmiddleware.builtin.playbook.model import Playbook
from rpmiddleware.builtin.playbook.outbox import Outbox
from rpmiddleware.builtin.playbook.pacing import Pacer
from rpmiddleware.builtin.playbook.parser import parsePlaybook
from rpmiddleware.builtin.playbook.prompt import AUTO_EVENT, decorate, modeOf
from rpmiddleware.builtin.playbook.rules import IDLE_TEXT, Transitions, dueIdleRule, stageChange
from rpmiddleware.builtin.playbook.sessions import Sessions
from rpmiddleware.builtin.playbook.state import OpenRequest, SessionState, ToolRun
from rpmiddleware.builtin.playbook.tools import ToolRunner
from rpmiddleware.plugin import (
    CANCELLING,
    OPENING,
    TERMINAL,
    TURN_FAILED,
    ChainPlugin,
    Envelope,
    IChainContext,
    IClientExtension,
    IEnvelopePlugin,
    InvalidMessage,
    Timeline,
    clientMessage,
    meta,
    textOfDelta,
    unclaimedResult,
)

NAME = wire.PLUGIN_NAME

#: RPEngine tells the player's spoken words only in voice.capture.transcript,
#: for a capture that asked for them (app.rs stt_completed); a recording sent
#: as event.audio is transcribed without telling.
HEARD = "voice.capture.transcript"
#: The only engine-to-game envelopes this plugin looks at (every audio chunk
#: passes here; the rest go straight on).
WATCHED = frozenset({HEARD, "reply.text.delta", "reply.text.completed"}) | TERMINAL

#: Client id of requests that carry none (the in-process Python API).
DEFAULT_CLIENT = "api"
#: requestIds remembered so that a request entering the chain again (sent
#: again in a new RPEngine session) is not taken for a new turn.
SEEN_REQUESTS = 4096
#: Requests whose tool calls are kept for the timeline.
NOTED_REQUESTS = 256
#: The reason of the stage-change that tells a resumed session its stage.
RESUMED_REASON = "session resumed"


def clientOf(envelope: Envelope) -> str:
    client = envelope.meta.get("client")
    return client if isinstance(client, str) and client else DEFAULT_CLIENT


@implementer(IEnvelopePlugin, IClientExtension, IPlaybooks)
class PlaybookPlugin(ChainPlugin):
    """
    See C{docs/playbooks.md}.

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
    clientMessageTypes = CLIENT_TYPES
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
        self.interruptPriority = interruptPriority
        self.timeline = timeline
        #: Open requestId -> client, to find a session from RPEngine's envelopes.
        self._requests: dict[str, str] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._toolNotes: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.outbox = Outbox(self._chain)
        self.sessions = Sessions(
            self.playbooks,
            self.parse,
            self.outbox,
            self._now,
            clientPlaybooks=clientPlaybooks,
            maxSessions=maxSessions,
        )
        self.pacer = Pacer(
            self.sessions,
            self.outbox,
            self._timers,
            self._idle,
            maxPendingEvents=maxPendingEvents,
            maxContextEvents=maxContextEvents,
            turnStartTimeout=turnStartTimeout,
        )
        self.runner = ToolRunner(
            self.tools, toolTimeout, self._timers, self.outbox.post, self._noteTool, self._toolEnded
        )
        self.transitions = Transitions(self._now, self.outbox, self.runner, self.pacer.pend)

    # What the console shows.

    def state(self, clientId: str) -> dict[str, Any] | None:
        """
        Where the session C{clientId} is: playbook, stage, turns in it, events
        waiting, tools running and recently run, recent stage changes.
        """
        state = self.sessions.get(clientId)
        return state.describe(self._now()) if state is not None else None

    def states(self) -> list[dict[str, Any]]:
        """
        L{state} of every session the plugin remembers, least recently active first.
        """
        now = self._now()
        return [s.describe(now) for s in self.sessions]

    def stop(self) -> None:
        """
        Cancel every timer (idle nudges, tool timeouts, turn asks): the
        middleware is stopping.
        """
        self.sessions.stop()
        self.outbox.clear()

    def close(self) -> None:
        """
        The daemon is stopping: L{stop}.
        """
        self.stop()

    def parse(self, document: Mapping[str, Any], source: str = "client") -> Playbook:
        """
        Check a playbook document against this plugin's tools.

        @raise PlaybookError: naming the stage and field.
        """
        return parsePlaybook(document, self.tools, source=source, defaultName="playbook")

    # Game to engine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        if kind in OPENING:
            self._request(envelope)
            return envelope
        if kind in CANCELLING:
            self._withdrawn(envelope)
            return envelope
        message = clientMessage(envelope, CLIENT_TYPES)
        if message is not None:
            client = clientOf(envelope)
            try:
                own = fromClient(client, message)
            except InvalidMessage as e:
                context.sendToGame(invalid(client, message, str(e)))
                return None
            if own.type == wire.TOOL_RESULT and not self._waitsFor(own):
                # Another plugin's call (the actions plugin's), or nobody's:
                # the client's message goes on, with what to say if nobody
                # takes it.
                envelope.meta.setdefault(meta.UNCLAIMED, unclaimedResult(own.get("callId")))
                return envelope
            envelope, kind = own, own.type
        if kind == TURN_FAILED:
            self._turnFailed(envelope)
            return None
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
        requestId = envelope.requestId
        if requestId is None:
            return envelope
        if kind in TERMINAL:
            client = self._requests.pop(requestId, None)
        else:
            client = self._requests.get(requestId)
        state = self.sessions.get(client) if client is not None else None
        if state is None:
            return envelope
        if kind in TERMINAL:
            self._ended(state, requestId, kind == "reply.completed")
            return envelope
        info = state.open.get(requestId)
        if info is None or state.playbook is None:
            return envelope
        if kind == HEARD:
            heard = envelope.get("text")
            if not info.auto and info.playerText is None and isinstance(heard, str) and heard:
                info.playerText = heard
                self.transitions.fire(state, "player", text=heard, requestId=requestId)
                self.pacer.settle(state)
        elif kind == "reply.text.delta":
            info.pieces.append(textOfDelta(envelope.fields))
        else:
            text = envelope.get("text")
            if not isinstance(text, str):
                text = "".join(info.pieces)
            info.pieces = []
            self.transitions.fire(state, "reply", text=text, requestId=requestId)
            self.pacer.settle(state)
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
        state = self._heardFrom(envelope)
        characterId = envelope.get("characterId")
        self.sessions.choose(state, characterId if isinstance(characterId, str) else None)
        # A turn this plugin asked for (even one given up on since: it waited
        # behind another turn too long) tells the waiting events, nothing else;
        # it is an auto_event turn whatever interactionMode it came with.
        token = envelope.meta.get(wire.TURN_TOKEN)
        ours = token is not None
        auto = ours or envelope.get("interactionMode") == AUTO_EVENT
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
            self.transitions.fire(state, "player", text=playerText, requestId=requestId)
        decorate(envelope, state, auto, ours, event)
        info.stage = state.stage
        # What the plugins after this one (actions offered per stage) read.
        envelope.meta[meta.STAGE] = state.stage
        for run in state.unattached:
            run.requestId = requestId
            self._noteTool(run)
        state.unattached.clear()
        if state.playbook is not None and self.timeline is not None:
            self.timeline.note(
                requestId,
                playbook=state.playbook.name,
                stage=state.stage,
                interactionMode=modeOf(auto),
            )
        self.pacer.settle(state)

    def _withdrawn(self, envelope: Envelope) -> None:
        requestId = envelope.requestId
        client = self._requests.pop(requestId, None) if requestId is not None else None
        state = self.sessions.get(client) if client is not None else None
        if state is None or requestId is None or state.open.pop(requestId, None) is None:
            return
        state.idleSince = self._now()
        self.pacer.settle(state)

    def _ended(self, state: SessionState, requestId: str, completed: bool) -> None:
        info = state.open.pop(requestId, None)
        if info is None:
            return
        state.idleSince = self._now()
        if completed and not info.auto and state.playbook is not None:
            if info.stage == state.stage:
                state.turnsInStage += 1
                self.transitions.fire(state, "turns", requestId=requestId)
        self.pacer.settle(state)

    def _idle(self, clientId: str) -> None:
        state = self.sessions.get(clientId)
        if state is None:
            return
        state.idleTimer = None
        playbook = state.playbook
        if playbook is None or state.stage is None or state.open or state.turnAsked or state.away:
            return
        now = self._now()
        rule = dueIdleRule(state, now)
        if rule is None:
            self.pacer.settle(state)
            return
        assert rule.after is not None
        state.idleSince = now
        say = rule.say if rule.say is not None else IDLE_TEXT.format(after=rule.after)
        self.transitions.take(state, rule, rule.reason or f"idle for {rule.after:g} s", None, say)
        self.pacer.settle(state)

    # The client endpoint's envelopes.

    def _heardFrom(self, envelope: Envelope) -> SessionState:
        """
        The session of a client that just spoke: one left away (a turn asked
        of it never started) may be asked for turns again.
        """
        state = self.sessions.active(clientOf(envelope))
        state.away = False
        return state

    def _load(self, envelope: Envelope) -> None:
        state = self._heardFrom(envelope)
        if self.sessions.load(state, envelope.get("playbook"), envelope.get("toml")):
            self.pacer.settle(state)

    def _event(self, envelope: Envelope) -> None:
        state = self._heardFrom(envelope)
        text = str(envelope.get("text") or "")
        scene = envelope.get("scene")
        if isinstance(scene, str):
            state.scene = scene or None
        priority = envelope.get("priority")
        priority = float(priority) if isinstance(priority, int | float) else 0.0
        self.transitions.fire(state, "event", text=text)
        if envelope.get("replyPolicy") == "none":
            self.pacer.remember(state, text)
        else:
            self.pacer.pend(state, text, priority, "event")
            urgent = self.interruptPriority is not None and priority >= self.interruptPriority
            if urgent and state.open:
                self.pacer.askTurn(state, interrupt=True)
        self.pacer.settle(state)

    def _toolResult(self, envelope: Envelope) -> None:
        client = clientOf(envelope)
        state = self.sessions.get(client)
        answered = self.runner.answer(
            state, client, envelope.get("callId"), envelope.get("result"), envelope.get("error")
        )
        if answered and state is not None:
            state.away = False

    def _waitsFor(self, result: Envelope) -> bool:
        """Whether a call of this plugin's waits for this tool-result."""
        state = self.sessions.get(clientOf(result))
        return state is not None and result.get("callId") in state.clientCalls

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        """
        A client session is over (past its reconnect TTL): its stage, waiting
        events and timers go, instead of staying until 1024 other sessions
        push them out.
        """
        self.sessions.forget(clientId)

    def clientSessionResumed(self, clientId: str, context: IChainContext) -> None:
        self._resumed(wire.toPlugin(wire.RESUMED, clientId))

    def _turnFailed(self, envelope: Envelope) -> None:
        state = self.sessions.get(clientOf(envelope))
        if state is not None:
            reason = str(envelope.get("reason") or "the endpoint could not start it")
            self.pacer.turnFailed(state, envelope.get("token"), reason)

    def _resumed(self, envelope: Envelope) -> None:
        """
        A client took its session back.  Whatever changed the stage while no
        connection had the session (an idle rule, a tool, an event) was told
        to nobody, so the client is told the stage it is in now, as a
        stage-change from and to it: it cannot know which one it saw last.
        """
        state = self.sessions.get(clientOf(envelope))
        if state is None or state.playbook is None or state.stage is None:
            return
        self.outbox.post(
            stageChange(state.clientId, state.stage, state.stage, RESUMED_REASON, None)
        )

    _FROM_GAME: dict[str, Callable[[PlaybookPlugin, Envelope], None]] = {
        wire.LOAD: _load,
        wire.EVENT: _event,
        wire.TOOL_RESULT: _toolResult,
        wire.RESUMED: _resumed,
    }

    # Tools.

    def _toolEnded(self, state: SessionState, run: ToolRun, outcome: str, value: Any) -> None:
        if not self.sessions.isCurrent(state):
            return
        self.transitions.fire(
            state, "tool", tool=run.name, outcome=outcome, result=value, requestId=run.requestId
        )
        self.pacer.settle(state)

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

    # Time.

    def _chain(self) -> IChainContext:
        return self.context

    def _timers(self) -> Any:
        return self.clock if self.clock is not None else self.context.reactor

    def _now(self) -> float:
        if self.clock is None and not hasattr(self, "context"):
            # Not in a chain yet (a playbook checked on its own): no time.
            return 0.0
        return float(self._timers().seconds())
