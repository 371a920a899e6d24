"""
The actions plugin in the chain: actions a game declares, which its
characters choose to do.

Toward RPEngine, a request whose character may use some of the client's
actions (in the playbook stage it plays in) is taught them in its prompt
context and gets the response-processing rule that captures the calls
(L{model}); a request with none offered is left alone, so it streams
unbuffered as before.  Toward the game, the reply's captured calls are read
and checked: a good one is sent to the client as C{tool-call-start {name,
callId, arguments, speaker, turnId}}; the client's C{tool-result} (or the
timeout) ends it with C{tool-call-end {callId, turnId, ...}}, and the
outcome is remembered in the character's conversation, after the line that
made the call, so its next turn knows the gate is open.  A bad one (unknown,
not offered, arguments not JSON or against the schema) never reaches the
client: it is logged and remembered as not done.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from zope.interface import implementer

from rpmiddleware.builtin.actions.api import IActions
from rpmiddleware.builtin.actions.model import (
    MAX_RESPONSE_RULES,
    RULE,
    RULE_ID,
    Action,
    ActionError,
    BadCall,
    Call,
    actions,
    instructions,
    readCall,
)
from rpmiddleware.builtin.memory.api import HEARD_ROLES, attitudeChange, heard
from rpmiddleware.plugin import (
    OPENING,
    TERMINAL,
    ChainPlugin,
    Envelope,
    IChainContext,
    IClientExtension,
    IEnvelopePlugin,
    addSceneText,
    answerOp,
    clientMessage,
    toClient,
    trimmed,
    unclaimedResult,
)
from rpmiddleware.plugin import meta as metakeys

NAME = "actions"
#: Its own message, and the answers to its calls (which the playbook's
#: calls share: each plugin takes the results of its own calls).
CLIENT_TYPES = ("actions", "tool-result")
#: How this plugin's callIds begin.
CALL_PREFIX = "action-"
EVENT = HEARD_ROLES[2]
#: Tool calls kept for the console, per turn.
NOTED_CALLS = 8


@dataclass
class _Turn:
    """A request whose character was offered actions."""

    #: The game's request it belongs to (a scene's reaction belongs to the
    #: player's turn: C{meta["turn"]}), where the console shows its calls.
    turnId: str
    client: str
    integrationId: str
    characterId: str
    character: str
    offered: dict[str, Action]
    #: The client's own response-processing rules were there too.
    ownRules: bool
    memory: dict[str, Any]
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Running:
    callId: str
    call: Call
    turn: _Turn
    started: float
    timer: IDelayedCall | None = None


@implementer(IEnvelopePlugin, IClientExtension, IActions)
class ActionsPlugin(ChainPlugin):
    name = NAME
    clientMessageTypes = CLIENT_TYPES
    log = Logger()

    def __init__(self, reactor: Any, timeline: Any, timeout: float) -> None:
        self.reactor = reactor
        self.timeline = timeline
        self.timeout = timeout
        #: Client session id to its declared actions.
        self.declared: dict[str, dict[str, Action]] = {}
        self._turns: dict[str, _Turn] = {}
        self._running: dict[str, _Running] = {}

    # The Python API (IActions); the client's message calls it too.

    def declare(self, declarations: Any, client: str = "api") -> list[dict[str, Any]]:
        made = actions(declarations)
        if made:
            self.declared[client] = made
        else:
            self.declared.pop(client, None)
        return [a.describe() for a in made.values()]

    def answer(
        self, callId: str, result: Any = None, error: str | None = None, client: str = "api"
    ) -> bool:
        running = self._running.get(callId)
        if running is None or running.turn.client != client:
            return False
        self._end(running, result, error)
        return True

    def clientSessionEnded(self, client: str, context: IChainContext) -> None:
        self.declared.pop(client, None)

    # Toward RPEngine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        if kind in OPENING:
            self._offer(envelope)
            return envelope
        message = clientMessage(envelope, CLIENT_TYPES)
        if message is None:
            return envelope
        client = str(envelope.meta.get(metakeys.CLIENT) or "api")
        if message["type"] == "actions":
            self._clientMessage(client, message, context)
            return None
        callId = message.get("callId")
        running = self._running.get(callId) if isinstance(callId, str) else None
        if running is None or running.turn.client != client:
            envelope.meta.setdefault(metakeys.UNCLAIMED, unclaimedResult(callId))
            return envelope
        error = message.get("error")
        if error is not None and not (isinstance(error, str) and error.strip()):
            self._tellClient(client, _invalid("tool-result.error must be a non-empty string"))
            return None
        self._end(running, message.get("result"), error)
        return None

    def _offer(self, envelope: Envelope) -> None:
        fields, meta = envelope.fields, envelope.meta
        client = str(meta.get(metakeys.CLIENT) or "api")
        declared = self.declared.get(client)
        if not declared or envelope.requestId in self._turns:
            # None to offer, or a request sent again that was offered them.
            return
        characterId = str(fields.get("characterId"))
        stage = meta.get(metakeys.STAGE)
        offered = {name: a for name, a in declared.items() if a.offeredTo(characterId, stage)}
        if not offered:
            return
        output = fields.get("output")
        if not isinstance(output, Mapping):
            return
        processing = output.get("responseProcessing")
        rules = list(processing.get("rules") or []) if isinstance(processing, Mapping) else []
        if len(rules) >= MAX_RESPONSE_RULES or any(
            isinstance(r, Mapping) and r.get("id") == RULE_ID for r in rules
        ):
            self.log.warn(
                "no actions offered to {characterId}: its request has {count} response rules "
                "(RPEngine takes {limit})",
                characterId=characterId,
                count=len(rules),
                limit=MAX_RESPONSE_RULES,
            )
            return
        card = fields.get("card")
        snapshot = card.get("snapshot") if isinstance(card, Mapping) else None
        data = snapshot.get("data") if isinstance(snapshot, Mapping) else None
        character = trimmed(data.get("name")) if isinstance(data, Mapping) else ""
        if not addSceneText(fields, instructions(list(offered.values()), character or characterId)):
            return
        fields["output"] = {
            **output,
            "responseProcessing": {"mode": "buffered", "rules": [*rules, RULE]},
        }
        memory: dict[str, Any] = {k: meta[k] for k in ("client", "conversation") if k in meta}
        self._turns[envelope.requestId or ""] = _Turn(
            str(meta.get(metakeys.TURN) or envelope.requestId),
            client,
            str(fields.get("integrationId")),
            characterId,
            character or characterId,
            offered,
            bool(rules),
            memory,
        )

    # Toward the game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        requestId = envelope.requestId or ""
        turn = self._turns.get(requestId)
        if turn is None:
            return envelope
        kind = envelope.type
        if kind in TERMINAL:
            del self._turns[requestId]
            return envelope
        if kind != "reply.text.completed":
            return envelope
        extracted = envelope.get("extractedContent")
        extracted = dict(extracted) if isinstance(extracted, Mapping) else {}
        captured = extracted.pop(RULE_ID, [])
        envelope = envelope.replace()
        if turn.ownRules:
            envelope["extractedContent"] = extracted
        else:
            envelope.fields.pop("extractedContent", None)
        for raw in captured if isinstance(captured, list) else []:
            self._called(turn, str(raw), context)
        return envelope

    def _called(self, turn: _Turn, captured: str, context: IChainContext) -> None:
        try:
            call = readCall(captured, turn.offered)
        except BadCall as e:
            self.log.warn(
                "{character} wrote action {name}, not done: {why}",
                character=turn.characterId,
                name=e.name,
                why=e.why,
            )
            self._remember(
                turn, f"{turn.character} tried to {e.name}, but it was not done: {e.why}"
            )
            self._noteCall(turn, {"name": e.name, "outcome": "refused", "error": e.why})
            return
        callId = CALL_PREFIX + uuid.uuid4().hex[:16]
        running = _Running(callId, call, turn, self.reactor.seconds())
        running.timer = self.reactor.callLater(self.timeout, self._timedOut, running)
        self._running[callId] = running
        self._noteCall(turn, {"name": call.name, "outcome": "running", "runBy": "client"})
        context.sendToGame(
            toClient(
                turn.client,
                {
                    "type": "tool-call-start",
                    "name": call.name,
                    "callId": callId,
                    "arguments": call.arguments,
                    "speaker": {"characterId": turn.characterId, "name": turn.character},
                    "turnId": turn.turnId,
                },
            )
        )

    def _timedOut(self, running: _Running) -> None:
        running.timer = None
        self._end(running, None, f"the game did not answer within {self.timeout:g} s")

    def _end(self, running: _Running, result: Any, error: str | None) -> None:
        self._running.pop(running.callId, None)
        if running.timer is not None and running.timer.active():
            running.timer.cancel()
        turn, call = running.turn, running.call
        durationMs = round((self.reactor.seconds() - running.started) * 1000, 1)
        ended: dict[str, Any] = {
            "type": "tool-call-end",
            "callId": running.callId,
            "turnId": turn.turnId,
        }
        if error is not None:
            ended["error"] = str(error)
            outcome = f"{turn.character} tried to {_said(call)}, but it failed: {error}"
        else:
            ended["result"] = result
            told = f": {_brief(result)}" if result is not None else ""
            outcome = f"{turn.character} did {_said(call)}{told}"
        ended["durationMs"] = durationMs
        self._tellClient(turn.client, ended)
        self._remember(turn, outcome)
        effect = turn.offered[call.name].attitude if call.name in turn.offered else None
        if error is None and effect:
            # Done, as the game reports: the character feels it (memory applies it).
            self.context.sendToEngine(
                attitudeChange(
                    turn.integrationId,
                    turn.characterId,
                    dict(effect),
                    f"action {call.name}",
                    dict(turn.memory),
                )
            )
        self._noteCall(
            turn,
            {
                "name": call.name,
                "outcome": "failed" if error is not None else "success",
                "runBy": "client",
                "durationMs": durationMs,
                **({"error": str(error)} if error is not None else {}),
            },
            replace=True,
        )

    def _remember(self, turn: _Turn, text: str) -> None:
        """The outcome joins the character's conversation, as a game event."""
        self.context.sendToEngine(
            heard(turn.integrationId, turn.characterId, EVENT, "", text, dict(turn.memory))
        )

    def _tellClient(self, client: str, message: dict[str, Any]) -> None:
        self.context.sendToGame(toClient(client, message))

    def _noteCall(self, turn: _Turn, entry: dict[str, Any], replace: bool = False) -> None:
        if replace and turn.calls and turn.calls[-1]["name"] == entry["name"]:
            turn.calls[-1] = entry
        else:
            turn.calls.append(entry)
        if self.timeline is not None:
            self.timeline.note(turn.turnId, tools=[dict(c) for c in turn.calls[-NOTED_CALLS:]])

    # The client's actions message.

    def _clientMessage(self, client: str, message: dict[str, Any], context: IChainContext) -> None:
        def run() -> dict[str, Any]:
            op = message.get("op")
            if op == "declare":
                return {"actions": self.declare(message.get("actions"), client)}
            if op == "clear":
                return {"actions": self.declare([], client)}
            if op == "list":
                return {"actions": [a.describe() for a in self.declared.get(client, {}).values()]}
            raise ActionError("actions.op must be one of declare, clear, list")

        context.sendToGame(toClient(client, answerOp(message, "actions-result", run)))


def _invalid(why: str) -> dict[str, Any]:
    return {"type": "error", "code": "INVALID_MESSAGE", "message": why, "retryable": False}


def _said(call: Call) -> str:
    if not call.arguments:
        return call.name
    return f"{call.name} {_brief(call.arguments)}"


def _brief(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["NAME", "ActionsPlugin"]
