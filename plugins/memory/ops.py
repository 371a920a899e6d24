"""
What a game may ask of memory over the client protocol: the C{memory}
message, C{{op, id?, ...}}, answered with C{memory-result {op, id, ...}} or
C{error} (C{INVALID_MESSAGE}, with C{op} and C{id}) naming what was wrong.

A client's conversation is its game's C{conversationId} (chosen with C{use},
for every character it plays) or, until it chooses one, its session's own.
Ops that touch one conversation name its C{characterId} and may name a
C{conversationId} other than the client's; C{integrationId} defaults to the
configured one.  The ops, and what they take:

  - C{use} C{{conversationId: str | null}}: this client's conversations;
  - C{where} C{{location?, scene?}}: where the player is, for scoped knowledge;
  - C{greeted} C{{characterId}}: the player saw the card's C{first_mes};
  - C{list} C{{characterId?}}; C{read}, C{export}, C{forget} C{{characterId}};
  - C{edit} C{{characterId, seq, text | remove: true}}; C{summary} C{{characterId, summary}};
  - C{pin} C{{characterId, fact}}; C{unpin} C{{characterId, factId}};
  - C{import} C{{characterId, document}} (what C{export} gave);
  - C{know} C{{text, keys?, constant?, scope?}}; C{unknow} C{{knowledgeId}}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rpmiddleware.builtin.memory.api import IConversationMemory as Memory
from rpmiddleware.builtin.memory.conversation import SESSION_PREFIX, Where
from rpmiddleware.builtin.memory.store import InvalidDocument, StoreError
from rpmiddleware.plugin import IChainContext, toClient

MAX_TEXT = 8000
MAX_ID = 256
SCOPES = ("world", "character:", "location:", "scene:")


class OpError(Exception):
    """What is wrong with a C{memory} message."""


def _string(message: dict[str, Any], name: str, limit: int = MAX_TEXT) -> str:
    value = message.get(name)
    if not isinstance(value, str) or not value.strip():
        raise OpError(f"{name} must be a non-empty string")
    if len(value) > limit:
        raise OpError(f"{name} is longer than {limit} characters")
    return value


def _optional(message: dict[str, Any], name: str) -> str | None:
    return None if message.get(name) is None else _string(message, name, MAX_ID)


def _whole(message: dict[str, Any], name: str) -> int:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpError(f"{name} must be a whole number")
    return value


class _Target:
    """The conversation an op names."""

    def __init__(self, memory: Memory, client: str, message: dict[str, Any]) -> None:
        self.characterId = _string(message, "characterId", MAX_ID)
        self.integrationId = _optional(message, "integrationId")
        named = _optional(message, "conversationId")
        self.conversationId = named or memory.chosen.get(client) or SESSION_PREFIX + client


def _use(memory: Memory, client: str, message: dict[str, Any]) -> dict[str, Any]:
    conversationId = _optional(message, "conversationId")
    if conversationId is not None and conversationId.startswith(SESSION_PREFIX):
        raise OpError(f"conversationId may not start with {SESSION_PREFIX!r}")
    if conversationId is None:
        memory.chosen.pop(client, None)
    else:
        memory.chosen[client] = conversationId
    return {"conversationId": conversationId}


def _where(memory: Memory, client: str, message: dict[str, Any]) -> dict[str, Any]:
    where = Where(_optional(message, "location"), _optional(message, "scene"))
    memory.where[client] = where
    return {"location": where.location, "scene": where.scene}


Op = Callable[[Memory, str, dict[str, Any]], dict[str, Any]]
TargetOp = Callable[[Memory, _Target, dict[str, Any]], dict[str, Any]]


def _target(call: TargetOp) -> Op:
    """An op on one conversation; its answer names the conversation."""

    def op(memory: Memory, client: str, message: dict[str, Any]) -> dict[str, Any]:
        target = _Target(memory, client, message)
        named = {"characterId": target.characterId, "conversationId": target.conversationId}
        return {**named, **call(memory, target, message)}

    return op


def _list(m: Memory, client: str, msg: dict[str, Any]) -> dict[str, Any]:
    found = m.conversations(_optional(msg, "integrationId"), _optional(msg, "characterId"))
    return {"conversations": found}


def _read(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    return {"conversation": m.read(t.characterId, t.conversationId, t.integrationId)}


def _export(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    return {"document": m.export(t.characterId, t.conversationId, t.integrationId)}


def _import(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    count = m.restore(t.characterId, t.conversationId, msg.get("document"), t.integrationId)
    return {"entries": count}


def _forget(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    return {"forgotten": m.forget(t.characterId, t.conversationId, t.integrationId)}


def _greeted(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    m.greeted(t.characterId, t.conversationId, t.integrationId)
    return {}


def _edit(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    seq = _whole(msg, "seq")
    text = None if msg.get("remove") is True else _string(msg, "text")
    m.edit(t.characterId, t.conversationId, seq, text, t.integrationId)
    return {"seq": seq}


def _summary(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    summary = msg.get("summary")
    if not isinstance(summary, str) or len(summary) > MAX_TEXT:
        raise OpError(f"summary must be a string of at most {MAX_TEXT} characters")
    m.setSummary(t.characterId, t.conversationId, summary, t.integrationId)
    return {}


def _pin(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    fact = _string(msg, "fact", 500)
    return {"fact": m.pin(t.characterId, t.conversationId, fact, t.integrationId)}


def _unpin(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    m.unpin(t.characterId, t.conversationId, _whole(msg, "factId"), t.integrationId)
    return {}


def _know(m: Memory, client: str, msg: dict[str, Any]) -> dict[str, Any]:
    constant = msg.get("constant") is True
    integrationId = _optional(msg, "integrationId")
    text = _string(msg, "text")
    return {"knowledgeId": m.know(text, _keys(msg), _scope(msg), constant, integrationId)}


def _unknow(m: Memory, client: str, msg: dict[str, Any]) -> dict[str, Any]:
    removed = m.unknow(_whole(msg, "knowledgeId"), _optional(msg, "integrationId"))
    return {"removed": removed}


OPS: dict[str, Op] = {
    "use": _use,
    "where": _where,
    "list": _list,
    "read": _target(_read),
    "export": _target(_export),
    "import": _target(_import),
    "forget": _target(_forget),
    "greeted": _target(_greeted),
    "edit": _target(_edit),
    "summary": _target(_summary),
    "pin": _target(_pin),
    "unpin": _target(_unpin),
    "know": _know,
    "unknow": _unknow,
}


def _keys(message: dict[str, Any]) -> tuple[str, ...]:
    keys = message.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k.strip() for k in keys):
        raise OpError("keys must be a list of non-empty strings")
    if not keys and message.get("constant") is not True:
        raise OpError("knowledge needs keys, or constant: true")
    return tuple(keys)


def _scope(message: dict[str, Any]) -> str:
    scope = message.get("scope", "world")
    if not isinstance(scope, str) or not (
        scope == "world" or any(scope.startswith(p) and len(scope) > len(p) for p in SCOPES[1:])
    ):
        raise OpError('scope must be "world", "character:ID", "location:NAME" or "scene:NAME"')
    return scope


def handle(memory: Memory, client: str, message: dict[str, Any], context: IChainContext) -> None:
    """
    Do what a client's C{memory} message asks and answer it.
    """
    op = message.get("op")
    answer: dict[str, Any] = {"op": op}
    if "id" in message:
        answer["id"] = message["id"]
    try:
        if not isinstance(op, str) or op not in OPS:
            raise OpError(f"memory.op must be one of {', '.join(OPS)}")
        result = OPS[op](memory, client, message)
    except (OpError, KeyError, InvalidDocument, StoreError) as e:
        wrong = isinstance(e, OpError | KeyError | InvalidDocument)
        why = f"no such {e.args[0]}" if isinstance(e, KeyError) else str(e)
        reply = {
            "type": "error",
            "code": "INVALID_MESSAGE" if wrong else "INTERNAL_ERROR",
            "message": f"memory {op}: {why}",
        }
        context.sendToGame(toClient(client, {**reply, **answer}))
        return
    context.sendToGame(toClient(client, {"type": "memory-result", **answer, **result}))
