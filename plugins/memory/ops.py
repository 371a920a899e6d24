"""
What a game may ask of memory over the client protocol: the C{memory}
message, C{{op, id?, ...}}, answered with C{memory-result {op, id, ...}} or
C{error} with C{op} and C{id}: C{INVALID_MESSAGE} naming what was wrong
with the message, C{INTERNAL_ERROR} naming the cause when the store failed
(a locked or failing disk past C{write_timeout}, a bug of ours).  Every op
is answered, whatever happens.  An op answers once what it changed is
written (or not: then C{INTERNAL_ERROR}); what it reads is read on the
store's own thread, never the reactor's.

A client's conversation is its game's C{conversationId} (chosen with C{use},
for every character it plays) or, until it chooses one, its session's own.
Ops that touch one conversation name its C{characterId} and may name a
C{conversationId} other than the client's; C{integrationId} defaults to the
one the client's C{character} named, else the configured one.  The ops, and what they take:

  - C{use} C{{conversationId: str | null}}: this client's conversations;
  - C{where} C{{location?, scene?}}: where the player is, for scoped knowledge;
  - C{greeted} C{{characterId}}: the player saw the card's C{first_mes};
  - C{list} C{{characterId?}}; C{read}, C{export}, C{forget} C{{characterId}};
  - C{edit} C{{characterId, seq, text | remove: true}}; C{summary} C{{characterId, summary}};
  - C{pin} C{{characterId, fact}}; C{unpin} C{{characterId, factId}};
  - C{remember} C{{characterId, text, importance?, source?}}: a moment kept
    in a line of its own (importance 0 to 1, 0.5 if not said; source a
    short word, "game" if not said), recalled when a later line is about it;
  - C{import} C{{characterId, document, empty?, unverified?}} (what C{export} gave;
    C{empty: true} to import one with no entries, C{unverified: true} to
    import an export of the older, unsealed format as it is);
  - C{save} C{{saveId, characterId?}}: every character's conversation under
    the client's C{conversationId} (or one named) snapshotted as a save;
    C{load-save} C{{saveId}} restores them (refused while a turn of theirs
    is in flight); C{saves} C{{all?}} lists them; C{drop-save} C{{saveId}};
  - C{prune} C{{olderThanDays?, keepEntries?, keepSaves?, maxBytes?,
    conversationId?, characterId?}}: forget old entries and saves;
  - C{know} C{{text, keys?, constant?, scope?}}; C{unknow} C{{knowledgeId}};
  - C{attitude} C{{characterId, set?, adjust?, stance?}}: the character's
    attitude to the player, read, or changed (C{set} axes to values,
    C{adjust} them by amounts, C{stance} one line); answered with it and
    the levels that changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.builtin.memory.api import IConversationMemory as Memory
from rpmiddleware.builtin.memory.attitude import AttitudeError
from rpmiddleware.builtin.memory.conversation import SESSION_PREFIX, Where
from rpmiddleware.builtin.memory.planner import MAX_FACT
from rpmiddleware.builtin.memory.saves import SaveRefused
from rpmiddleware.builtin.memory.storeerrors import InvalidDocument, StoreError, allKept, describe
from rpmiddleware.plugin import IChainContext, toClient

MAX_TEXT = 8000
MAX_ID = 256
SCOPES = ("world", "character:", "location:", "scene:")

log = Logger()


class OpError(Exception):
    """What is wrong with a C{memory} message."""


def _string(message: dict[str, Any], name: str, limit: int = MAX_TEXT) -> str:
    value = message.get(name)
    if not isinstance(value, str) or not value.strip():
        raise OpError(f"{name} must be a non-empty string")
    if len(value) > limit:
        raise OpError(f"{name} is longer than {limit} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise OpError(f"{name} is not valid Unicode (it holds a lone surrogate)")
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

    def __init__(
        self, memory: Memory, client: str, message: dict[str, Any], integrationId: str | None
    ) -> None:
        self.characterId = _string(message, "characterId", MAX_ID)
        self.integrationId = _optional(message, "integrationId") or integrationId
        named = _optional(message, "conversationId")
        self.conversationId = named or memory.chosen.get(client) or SESSION_PREFIX + client


#: An op: the plugin, the client, the message and the integration the
#: client's character named; its answer's fields, or a Deferred of them.
Op = Callable[[Memory, str, dict[str, Any], str | None], Any]
TargetOp = Callable[[Memory, _Target, dict[str, Any]], dict[str, Any]]


def _use(memory: Memory, client: str, message: dict[str, Any], _: str | None) -> dict[str, Any]:
    conversationId = _optional(message, "conversationId")
    if conversationId is not None and conversationId.startswith(SESSION_PREFIX):
        raise OpError(f"conversationId may not start with {SESSION_PREFIX!r}")
    if conversationId is None:
        memory.chosen.pop(client, None)
    else:
        memory.chosen[client] = conversationId
    return {"conversationId": conversationId}


def _where(memory: Memory, client: str, message: dict[str, Any], _: str | None) -> dict[str, Any]:
    where = Where(_optional(message, "location"), _optional(message, "scene"))
    memory.where[client] = where
    return {"location": where.location, "scene": where.scene}


def _written(memory: Memory, call: Callable[[], dict[str, Any]]) -> Deferred[dict[str, Any]]:
    """
    C{call}'s answer once every write it gave the store is committed; a
    L{StoreError} naming the cause when one was not.
    """
    memory.store.collect()
    try:
        answer = call()
    finally:
        writes = memory.store.collected()
    return allKept(writes, answer)


def _target(call: TargetOp) -> Op:
    """
    An op on one conversation: read first (on the store's own thread) if it
    is not loaded; its answer names the conversation.
    """

    def op(
        memory: Memory, client: str, message: dict[str, Any], integrationId: str | None
    ) -> Deferred[dict[str, Any]]:
        target = _Target(memory, client, message, integrationId)
        named = {"characterId": target.characterId, "conversationId": target.conversationId}

        def run(_: object) -> Deferred[dict[str, Any]]:
            return _written(memory, lambda: {**named, **call(memory, target, message)})

        return memory.loaded(
            target.characterId, target.conversationId, target.integrationId
        ).addCallback(run)

    return op


def _list(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    later = m.conversationsLater(_optional(msg, "integrationId"), _optional(msg, "characterId"))
    return later.addCallback(lambda found: {"conversations": found})


def _read(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    return {"conversation": m.read(t.characterId, t.conversationId, t.integrationId)}


def _export(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    return {"document": m.export(t.characterId, t.conversationId, t.integrationId)}


def _import(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    empty = msg.get("empty", False)
    if not isinstance(empty, bool):
        raise OpError("empty must be true or false")
    document = msg.get("document")
    unverified = msg.get("unverified", False)
    if not isinstance(unverified, bool):
        raise OpError("unverified must be true or false")
    count = m.restore(t.characterId, t.conversationId, document, t.integrationId, empty, unverified)
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
    if summary.strip():
        _string(msg, "summary")
    m.setSummary(t.characterId, t.conversationId, summary, t.integrationId)
    return {}


def _pin(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    fact = _string(msg, "fact", MAX_FACT)
    return {"fact": m.pin(t.characterId, t.conversationId, fact, t.integrationId)}


def _remember(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    text = _string(msg, "text")
    importance = msg.get("importance", 0.5)
    if (
        isinstance(importance, bool)
        or not isinstance(importance, int | float)
        or not 0 <= importance <= 1
    ):
        raise OpError("importance must be a number from 0 to 1")
    source = msg.get("source", "game")
    if not isinstance(source, str) or not source.strip() or len(source) > 40:
        raise OpError('source must be a short word (at most 40 characters, e.g. "game")')
    m.remember(t.characterId, t.conversationId, text, importance, source, t.integrationId)
    return {}


def _unpin(m: Memory, t: _Target, msg: dict[str, Any]) -> dict[str, Any]:
    m.unpin(t.characterId, t.conversationId, _whole(msg, "factId"), t.integrationId)
    return {}


def _attitude(
    memory: Memory, client: str, message: dict[str, Any], integrationId: str | None
) -> Any:
    """
    Read or change a character's attitude to the player: C{set} and
    C{adjust} are objects of axes (not both), C{stance} a line.
    """
    target = _Target(memory, client, message, integrationId)
    named = {"characterId": target.characterId, "conversationId": target.conversationId}
    setTo, adjust, stance = message.get("set"), message.get("adjust"), message.get("stance")
    if setTo is not None and adjust is not None:
        raise OpError("attitude takes set or adjust, not both")
    if stance is not None and not isinstance(stance, str):
        raise OpError("stance must be a string")
    ids = (target.characterId, target.conversationId)

    def run(_: object) -> Deferred[dict[str, Any]]:
        def change() -> dict[str, Any]:
            if adjust is not None:
                made = memory.adjustAttitude(*ids, adjust, stance, target.integrationId, client)
            elif setTo is not None or stance is not None:
                made = memory.setAttitude(*ids, setTo, stance, target.integrationId, client)
            else:
                made = {**memory.attitude(*ids, target.integrationId), "changes": []}
            changes = made.pop("changes")
            return {**named, "attitude": made, "changes": changes}

        return _written(memory, change)

    return memory.loaded(*ids, target.integrationId).addCallback(run)


def _game(memory: Memory, client: str, message: dict[str, Any], required: bool = True) -> Any:
    """
    The game's conversation id a save op names, else the client's (a
    session's own conversations are never stored, so they have no saves).
    """
    named = _optional(message, "conversationId") or memory.chosen.get(client)
    if named is None and required:
        raise OpError(
            'this client has no game conversation id: send memory {op: "use", '
            "conversationId} first, or name conversationId (a session's own conversations "
            "are not stored, so they cannot be saved)"
        )
    if named is not None and named.startswith(SESSION_PREFIX):
        raise OpError(f"conversationId may not start with {SESSION_PREFIX!r}")
    return named


def _save(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    conversationId = _game(m, client, msg)
    saveId = _string(msg, "saveId", MAX_ID)
    characterId = _optional(msg, "characterId")
    integrationId = _optional(msg, "integrationId") or integrationId
    d = m.save(saveId, conversationId, integrationId, characterId)
    return d.addCallback(lambda brief: {"save": brief})


def _loadSave(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    conversationId = _game(m, client, msg)
    saveId = _string(msg, "saveId", MAX_ID)
    integrationId = _optional(msg, "integrationId") or integrationId
    return m.loadSave(saveId, conversationId, integrationId)


def _saves(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    conversationId = None if msg.get("all") is True else _game(m, client, msg, required=False)
    integrationId = _optional(msg, "integrationId") or integrationId
    d = m.listSaves(conversationId, integrationId)
    return d.addCallback(lambda found: {"conversationId": conversationId, "saves": found})


def _dropSave(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    conversationId = _game(m, client, msg)
    saveId = _string(msg, "saveId", MAX_ID)
    integrationId = _optional(msg, "integrationId") or integrationId
    d = m.dropSave(saveId, conversationId, integrationId)
    return d.addCallback(
        lambda dropped: {"saveId": saveId, "conversationId": conversationId, "dropped": dropped}
    )


def _amount(message: dict[str, Any], name: str, whole: bool = True) -> Any:
    value = message.get(name)
    if value is None:
        return None
    number = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, number) or value < 0:
        kind = "a whole number" if whole else "a number"
        raise OpError(f"{name} must be {kind} of at least 0")
    return value


def _prune(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    olderThanDays = _amount(msg, "olderThanDays", whole=False)
    keepEntries, keepSaves = _amount(msg, "keepEntries"), _amount(msg, "keepSaves")
    maxBytes = _amount(msg, "maxBytes")
    if (olderThanDays, keepEntries, keepSaves, maxBytes) == (None, None, None, None):
        raise OpError("prune needs olderThanDays, keepEntries, keepSaves or maxBytes")
    conversationId = _game(m, client, msg, required=False) if "conversationId" in msg else None
    characterId = _optional(msg, "characterId")
    integrationId = _optional(msg, "integrationId") or integrationId
    d = m.prune(
        olderThanDays, keepEntries, keepSaves, maxBytes, conversationId, characterId, integrationId
    )
    return d


def _know(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    constant = msg.get("constant") is True
    integrationId = _optional(msg, "integrationId") or integrationId
    text = _string(msg, "text")
    keys, scope = _keys(msg), _scope(msg)
    return _written(m, lambda: {"knowledgeId": m.know(text, keys, scope, constant, integrationId)})


def _unknow(m: Memory, client: str, msg: dict[str, Any], integrationId: str | None) -> Any:
    knowledgeId = _whole(msg, "knowledgeId")
    integrationId = _optional(msg, "integrationId") or integrationId
    return _written(m, lambda: {"removed": m.unknow(knowledgeId, integrationId)})


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
    "remember": _target(_remember),
    "know": _know,
    "unknow": _unknow,
    "save": _save,
    "load-save": _loadSave,
    "saves": _saves,
    "drop-save": _dropSave,
    "prune": _prune,
    "attitude": _attitude,
}


def _keys(message: dict[str, Any]) -> tuple[str, ...]:
    keys = message.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k.strip() for k in keys):
        raise OpError("keys must be a list of non-empty strings")
    if not keys and message.get("constant") is not True:
        raise OpError("knowledge needs keys, or constant: true")
    for i in range(len(keys)):
        _string({"keys": keys[i]}, "keys")
    return tuple(keys)


def _scope(message: dict[str, Any]) -> str:
    scope = message.get("scope", "world")
    if not isinstance(scope, str) or not (
        scope == "world" or any(scope.startswith(p) and len(scope) > len(p) for p in SCOPES[1:])
    ):
        raise OpError('scope must be "world", "character:ID", "location:NAME" or "scene:NAME"')
    return _string({"scope": scope}, "scope", MAX_ID)


#: What the game got wrong: answered INVALID_MESSAGE.  Anything else is ours
#: (the store failed, or a bug): INTERNAL_ERROR naming the cause.
GAMES_MISTAKES = (OpError, KeyError, InvalidDocument, SaveRefused, AttitudeError)


def handle(
    memory: Memory,
    client: str,
    message: dict[str, Any],
    context: IChainContext,
    integrationId: str | None = None,
) -> None:
    """
    Do what a client's C{memory} message asks and answer it, always with
    its C{op} and C{id}: C{memory-result}, or C{error}.

    @param integrationId: what the client's C{character} named, if it did.
    """
    op = message.get("op")
    answer: dict[str, Any] = {"op": op}
    if "id" in message:
        answer["id"] = message["id"]

    def run() -> Any:
        if not isinstance(op, str) or op not in OPS:
            raise OpError(f"memory.op must be one of {', '.join(OPS)}")
        return OPS[op](memory, client, message, integrationId)

    def answered(result: dict[str, Any]) -> None:
        context.sendToGame(toClient(client, {"type": "memory-result", **answer, **result}))

    def failed(failure: Failure) -> None:
        e = failure.value
        if isinstance(e, InvalidDocument) or (
            isinstance(e, GAMES_MISTAKES) and not isinstance(e, StoreError)
        ):
            code = "INVALID_MESSAGE"
            why = f"no such {e.args[0]}" if isinstance(e, KeyError) else str(e)
        else:
            code = "INTERNAL_ERROR"
            why = describe(e)
            log.failure("memory {op} failed", failure, op=op)
        reply = {"type": "error", "code": code, "message": f"memory {op}: {why}"}
        context.sendToGame(toClient(client, {**reply, **answer}))

    d: Deferred[Any] = maybeDeferred(run)
    d.addCallbacks(answered, failed).addErrback(
        lambda f: log.failure("answering memory {op} failed", f, op=op)
    )
