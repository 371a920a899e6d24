"""
Client messages that belong to plugins, carried through the chain.

A plugin that provides L{rpmiddleware.plugin.interfaces.IClientExtension} names the
client message types it takes.  The client endpoint accepts those types while
the plugin is in the chain and passes each message, as it came, in a
L{FROM_CLIENT} envelope that enters the chain at the game end, in order with
the client's turns; the plugin takes it (L{clientMessage}) and drops it.  To
answer, or to tell a client anything, the plugin sends a L{TO_CLIENT}
envelope toward the game (L{toClient}); the endpoint writes its C{message}
to the connection of that client session.  Neither type is RPEngine's: the
engine end drops them, so a message no plugin took goes nowhere.

Every envelope carries the client session id in C{meta["client"]} (toward the
game, also as the field C{clientId}, for router observers).

A plugin that only adds to what a client is told anyway sets a field whose
name begins with C{x-} (L{PLUGIN_FIELD_PREFIX}) on an envelope toward the
game: RPEngine never sends one, so the client endpoint copies it onto every
client message made from that envelope (C{reply.text.completed} becomes
C{llm}: C{{"x-mood": "calm"}} on C{reply.text.completed} is
C{{"type": "llm", ..., "x-mood": "calm"}}) and never counts it among
RPEngine's statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any

from rpmiddleware.plugin.interfaces import IClientExtension
from rpmiddleware.protocol.envelope import Envelope

#: A client's message for a plugin: C{message} (the client's JSON object).
FROM_CLIENT = "x-client.message"
#: A plugin's message for a client: C{clientId}, C{message}.
TO_CLIENT = "x-client.send"
#: A plugin asks the client endpoint to start a turn for a client session, as
#: a turn of that client's own (barge-in and queueing as configured): toward
#: the game, C{clientId}, C{text}, C{token}, C{source}; C{interactionMode}
#: C{auto_event}; the request's C{meta} gets C{meta}.
START_TURN = "x-client.start-turn"
#: The endpoint could not start it: toward RPEngine, C{clientId}, C{token},
#: C{reason}, for the plugin that asked.
TURN_FAILED = "x-client.turn-failed"
#: A client's turn whose reply ended upstream (C{reply.completed}) was played
#: only this far: the player cut it off (a barge-in, a C{cancel} with
#: C{played}) while its speech still played.  Toward RPEngine, sent by the
#: client endpoint in order with the client's turns, before the next one:
#: C{requestId} (the completed turn's), C{played} (C{{samples, sampleRate}},
#: as L{rpmiddleware.protocol.meta.PLAYED}); C{meta["client"]}.  The memory
#: plugin cuts the reply it remembered whole to the sentences that were
#: played; the engine end drops it quietly (a chain without memory).
TURN_PLAYED = "x-client.played"
#: How the name of a plugin's field for clients begins (RPEngine's never do).
PLUGIN_FIELD_PREFIX = "x-"


def isPluginField(name: str) -> bool:
    """
    Whether C{name} is a plugin's field for clients (C{x-...}).
    """
    return name.startswith(PLUGIN_FIELD_PREFIX)


def pluginFields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """
    The plugins' fields for clients among C{fields}, as they are.
    """
    # Every envelope to a client passes here and RPEngine's have none: a
    # field named "x-..." sorts at or after "x-", so when even the greatest
    # name sorts before it there is none, found in one pass in C.
    if not fields or max(fields) < PLUGIN_FIELD_PREFIX:
        return {}
    return {k: v for k, v in fields.items() if k.startswith(PLUGIN_FIELD_PREFIX)}


def fromClient(clientId: str, message: Mapping[str, Any]) -> Envelope:
    envelope = Envelope.build(FROM_CLIENT, message=dict(message))
    envelope.meta["client"] = clientId
    return envelope


def toClient(clientId: str, message: Mapping[str, Any]) -> Envelope:
    """
    An envelope that tells client session C{clientId} C{message} (a JSON
    object with a string C{type}).
    """
    if not isinstance(message.get("type"), str):
        raise ValueError("a client message needs a string type")
    envelope = Envelope.build(TO_CLIENT, clientId=clientId, message=dict(message))
    envelope.meta["client"] = clientId
    return envelope


def startTurn(
    clientId: str, text: str, token: str, source: str, meta: Mapping[str, Any] | None = None
) -> Envelope:
    """
    An envelope asking client session C{clientId}'s connection to start an
    C{auto_event} turn with C{text} (a plugin's game events, say); C{source}
    is what the turn is in the session's history, C{token} comes back in a
    L{TURN_FAILED} when the turn could not start.
    """
    envelope = Envelope.build(
        START_TURN, clientId=clientId, text=text, token=token, source=source, meta=dict(meta or {})
    )
    envelope.meta["client"] = clientId
    return envelope


def turnPlayed(clientId: str, requestId: str, played: Mapping[str, Any]) -> Envelope:
    """
    A L{TURN_PLAYED} envelope: client session C{clientId}'s turn
    C{requestId}, which completed upstream, was played C{played}
    (C{{samples, sampleRate}}) of its speech before the player cut it off.
    """
    envelope = Envelope.build(TURN_PLAYED, requestId=requestId, played=dict(played))
    envelope.meta["client"] = clientId
    return envelope


def turnFailed(clientId: str, token: str, reason: str) -> Envelope:
    envelope = Envelope.build(TURN_FAILED, clientId=clientId, token=token, reason=reason)
    envelope.meta["client"] = clientId
    return envelope


def unclaimedResult(callId: Any) -> str:
    """
    What a client is told of a C{tool-result} that no call waits for (the
    playbook's and the actions plugin's calls take results alike).
    """
    return (
        f"tool-result: no tool call {str(callId)[:64]!r} of this session waits for a result "
        "(it ended, timed out, or never was)"
    )


def answerOp(
    message: Mapping[str, Any], resultType: str, run: Callable[[], Mapping[str, Any]]
) -> dict[str, Any]:
    """
    The answer to a plugin's C{{type, op, id?, ...}} message: C{resultType}
    with the C{op}, the client's C{id} and what C{run} returned, or, when it
    raises C{ValueError}, C{error} C{INVALID_MESSAGE} saying why (the
    message's type and op first, so the client knows which it was).
    """
    answer: dict[str, Any] = {"op": message.get("op")}
    if "id" in message:
        answer["id"] = message["id"]
    try:
        result = run()
    except ValueError as e:
        why = f"{message.get('type')} {message.get('op')}: {e}"
        return {"type": "error", "code": "INVALID_MESSAGE", "message": why, **answer}
    return {"type": resultType, **answer, **result}


def clientMessage(envelope: Envelope, types: Container[str]) -> dict[str, Any] | None:
    """
    The client message C{envelope} carries, when it is one of C{types}.
    """
    if envelope.type != FROM_CLIENT:
        return None
    message = envelope.get("message")
    if isinstance(message, dict) and message.get("type") in types:
        return message
    return None


def extensionTypes(plugins: Iterable[Any]) -> dict[str, str]:
    """
    Client message type to the name of the plugin that takes it, for the
    plugins of a chain; the first plugin to claim a type keeps it.
    """
    types: dict[str, str] = {}
    for plugin in plugins:
        if IClientExtension.providedBy(plugin):
            for kind in plugin.clientMessageTypes:
                types.setdefault(str(kind), str(getattr(plugin, "name", "")))
    return types
