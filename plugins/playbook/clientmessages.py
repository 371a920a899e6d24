"""
The playbook plugin's client messages: what a client sends it, checked, and
what it tells a client.

Clients send three messages, which reach the plugin through the chain as any
plugin's do (L{rpmiddleware.plugin.clientext}):

  - C{playbook} C{{playbook: object | null}} or C{{toml: string}}: play this
    playbook (null: back to the configured one);
  - C{event} C{{text, scene?, replyPolicy: "auto" | "none", priority?}}: what
    just happened in the game;
  - C{tool-result} C{{callId, result | error}}: the answer to a
    C{tool-call-start} of a tool the client runs.

Each becomes one of the plugin's own envelopes (L{wire}), which the plugin
also takes from an in-process game.  The plugin's envelopes toward the game
become the client's C{stage-change}, C{tool-call-start}, C{tool-call-end}
(exactly the seed's fields), C{playbook-state} and C{error}, and its ask for
an C{auto_event} turn becomes the endpoint's L{startTurn
<rpmiddleware.plugin.clientext.startTurn>}.  Nothing in the core knows a playbook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpmiddleware.builtin.playbook import wire
from rpmiddleware.plugin import (
    CLIENT_CODES,
    INTERNAL_ERROR,
    Envelope,
    InvalidMessage,
    errorMessage,
    startTurn,
    toClient,
)
from rpmiddleware.plugin import clientfields as fields

#: The client message types the plugin takes.
CLIENT_TYPES = ("playbook", "event", "tool-result")
REPLY_POLICIES = ("auto", "none")
#: Longest event text and scene (both become prompt text).
MAX_EVENT_CHARS = 2000
MAX_SCENE_CHARS = 8000
#: The meta key of what leaves the plugin toward the game: the plugin's own envelope.
OWN = "playbook"
#: What a turn started for game events is, in the session's history (C{source}).
EVENT_SOURCE = "event"


def _playbook(client: str, message: dict[str, Any]) -> Envelope:
    has = [name for name in ("playbook", "toml") if name in message]
    if len(has) != 1:
        raise InvalidMessage(
            "playbook needs one of playbook (an object, or null to go back to the configured "
            "one) or toml (the playbook as TOML text)"
        )
    if has == ["toml"]:
        return wire.toPlugin(wire.LOAD, client, toml=fields.string(message, "toml"))
    document = message["playbook"]
    if document is not None and not isinstance(document, dict):
        raise InvalidMessage("playbook.playbook must be an object or null")
    return wire.toPlugin(wire.LOAD, client, playbook=document)


def _event(client: str, message: dict[str, Any]) -> Envelope:
    text = fields.string(message, "text")
    if len(text) > MAX_EVENT_CHARS:
        raise InvalidMessage(f"event.text is longer than {MAX_EVENT_CHARS} characters")
    scene = message.get("scene")
    if scene is not None:
        if not isinstance(scene, str):
            raise InvalidMessage("event.scene must be a string or null")
        if len(scene) > MAX_SCENE_CHARS:
            raise InvalidMessage(f"event.scene is longer than {MAX_SCENE_CHARS} characters")
    policy = fields.string(message, "replyPolicy")
    if policy not in REPLY_POLICIES:
        raise InvalidMessage(f'event.replyPolicy must be "auto" or "none", got {policy[:32]!r}')
    priority = message.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise InvalidMessage("event.priority must be a number")
    return wire.toPlugin(
        wire.EVENT, client, text=text, scene=scene, replyPolicy=policy, priority=priority
    )


def _toolResult(client: str, message: dict[str, Any]) -> Envelope:
    callId = fields.identifier(message, "callId")
    error = message.get("error")
    if error is not None:
        if "result" in message and message["result"] is not None:
            raise InvalidMessage("tool-result has both result and error; send one")
        if not isinstance(error, str) or not error.strip():
            raise InvalidMessage("tool-result.error must be a non-empty string")
        return wire.toPlugin(wire.TOOL_RESULT, client, callId=callId, error=error)
    return wire.toPlugin(wire.TOOL_RESULT, client, callId=callId, result=message.get("result"))


_FROM_CLIENT: dict[str, Callable[[str, dict[str, Any]], Envelope]] = {
    "playbook": _playbook,
    "event": _event,
    "tool-result": _toolResult,
}


def fromClient(client: str, message: dict[str, Any]) -> Envelope:
    """
    The plugin's envelope for a client's message.

    @raise InvalidMessage: naming what is wrong with it.
    """
    return _FROM_CLIENT[message["type"]](client, message)


def invalid(client: str, message: dict[str, Any], why: str) -> Envelope:
    """The client's C{error} for a message it got wrong (INVALID_MESSAGE)."""
    return toClient(client, errorMessage("INVALID_MESSAGE", f"{message['type']}: {why}"))


# Toward the client.


def _stageChange(f: dict[str, Any]) -> dict[str, Any]:
    return {"type": "stage-change", "from": f["from"], "to": f["to"], "reason": f["reason"]}


def _toolCallStart(f: dict[str, Any]) -> dict[str, Any]:
    message = {
        "type": "tool-call-start",
        "name": f["name"],
        "callId": f["callId"],
        "arguments": f.get("arguments") or {},
    }
    return _withTurn(message, f)


def _toolCallEnd(f: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "tool-call-end", "callId": f["callId"]}
    if "error" in f:
        message["error"] = f["error"]
    else:
        message["result"] = f.get("result")
    message["durationMs"] = f["durationMs"]
    return _withTurn(message, f)


def _withTurn(message: dict[str, Any], f: dict[str, Any]) -> dict[str, Any]:
    """The turn a call belongs to, when a turn's transition made it."""
    if isinstance(f.get("turnId"), str):
        message["turnId"] = f["turnId"]
    return message


def _state(f: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "playbook-state",
        "playbook": f.get("playbook"),
        "stage": f.get("stage"),
        "source": f.get("source"),
    }


def _error(f: dict[str, Any]) -> dict[str, Any]:
    code = f.get("code")
    code = code if code in CLIENT_CODES else INTERNAL_ERROR
    extra = {"callId": f["callId"]} if isinstance(f.get("callId"), str) else {}
    return errorMessage(code, str(f.get("message") or code), False, **extra)


_TO_CLIENT: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    wire.STAGE_CHANGE: _stageChange,
    wire.TOOL_CALL_START: _toolCallStart,
    wire.TOOL_CALL_END: _toolCallEnd,
    wire.STATE: _state,
    wire.ERROR: _error,
}


def toGame(envelope: Envelope) -> Envelope:
    """
    What leaves the plugin toward the game for one of its envelopes: the
    client's message, or the endpoint's ask for a turn.
    """
    client = str(envelope.get("clientId"))
    if envelope.type == wire.TURN:
        token = str(envelope.get("token") or "")
        text = str(envelope.get("text") or "")
        made = startTurn(client, text, token, EVENT_SOURCE, {wire.TURN_TOKEN: token})
    else:
        made = toClient(client, _TO_CLIENT[envelope.type](envelope.fields))
    # An in-process game (and the plugin's tests) read the plugin's own
    # envelope, with every field.
    made.meta[OWN] = envelope
    return made


__all__ = ["CLIENT_TYPES", "EVENT_SOURCE", "OWN", "fromClient", "invalid", "toGame"]
