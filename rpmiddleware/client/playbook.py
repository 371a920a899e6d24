"""
The client endpoint's side of playbooks and live game events.

Clients send three extension messages, checked here and passed to the
playbook plugin as envelopes through the chain (L{rpmiddleware.playbookwire}):

  - C{playbook} C{{playbook: object | null}} or C{{toml: string}}: play this
    playbook (null: back to the configured one);
  - C{event} C{{text, scene?, replyPolicy: "auto" | "none", priority?}}: what
    just happened in the game;
  - C{tool-result} C{{callId, result | error}}: the answer to a
    C{tool-call-start} of a tool the client runs.

The plugin's envelopes toward the game reach L{PlaybookBridge}, a router
observer, which finds the connection of their session and tells it
C{stage-change}, C{tool-call-start}, C{tool-call-end} (exactly the seed's
fields), C{error} (TOOL_ERROR, PLAYBOOK_ERROR, ...) and C{playbook-state}, or
starts the C{auto_event} turn the plugin asks for, as a turn of the
connection like any other (barge-in, queueing, history).

After a successful C{reconnect} the plugin is asked to tell the client the
stage its session is in (L{sessionResumed}).

Nothing here knows a playbook's rules; without the playbook plugin in the
chain the three messages are refused with PLAYBOOK_ERROR.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rpmiddleware import playbookwire as pw
from rpmiddleware.api import ReplyStream
from rpmiddleware.client import messages as wire
from rpmiddleware.client.errors import (
    CLIENT_CODES,
    INTERNAL_ERROR,
    INVALID_MESSAGE,
    PLAYBOOK_ERROR,
    errorMessage,
)
from rpmiddleware.client.extensions import ExtensionBridge, openConnection
from rpmiddleware.client.messages import InvalidMessage
from rpmiddleware.client.surface import ClientSurface, Handler
from rpmiddleware.envelope import Envelope

#: The client message types added here.
CLIENT_TYPES = ("playbook", "event", "tool-result")
#: The plugins that start tool calls a client answers with C{tool-result}.
TOOL_PLUGINS = (pw.PLUGIN_NAME, "actions")
#: What a turn started for game events is, in history entries (C{source}).
EVENT = "event"
REPLY_POLICIES = ("auto", "none")
#: Longest event text and scene (both become prompt text).
MAX_EVENT_CHARS = 2000
MAX_SCENE_CHARS = 8000


def _pluginInChain(connection: ClientSurface) -> bool:
    return pw.PLUGIN_NAME in connection.middleware.chain.names


def _enabled(connection: ClientSurface, kind: str = "") -> None:
    names = connection.middleware.chain.names
    if kind == "tool-result" and any(name in names for name in TOOL_PLUGINS):
        return
    if not _pluginInChain(connection):
        raise _Refused(
            "playbooks and game events need the playbook plugin, which this middleware's "
            "[chain] leaves out"
        )


class _Refused(Exception):
    """
    A playbook message this middleware cannot serve (PLAYBOOK_ERROR).
    """


def _tellPlugin(connection: ClientSurface, kind: str, **fields: Any) -> None:
    connection.middleware.chain.sendToEngine(pw.toPlugin(kind, connection.session.id, **fields))


def _guarded(handler: Callable[[ClientSurface, dict[str, Any]], None]) -> Handler:
    def handle(connection: ClientSurface, message: dict[str, Any]) -> None:
        try:
            _enabled(connection, message["type"])
        except _Refused as e:
            connection.send(errorMessage(PLAYBOOK_ERROR, f"{message['type']}: {e}"))
            return
        handler(connection, message)

    return handle


def _playbook(connection: ClientSurface, message: dict[str, Any]) -> None:
    has = [name for name in ("playbook", "toml") if name in message]
    if len(has) != 1:
        raise InvalidMessage(
            "playbook needs one of playbook (an object, or null to go back to the configured "
            "one) or toml (the playbook as TOML text)"
        )
    if has == ["toml"]:
        _tellPlugin(connection, pw.LOAD, toml=wire.string(message, "toml"))
        return
    document = message["playbook"]
    if document is not None and not isinstance(document, dict):
        raise InvalidMessage("playbook.playbook must be an object or null")
    _tellPlugin(connection, pw.LOAD, playbook=document)


def _event(connection: ClientSurface, message: dict[str, Any]) -> None:
    text = wire.string(message, "text")
    if len(text) > MAX_EVENT_CHARS:
        raise InvalidMessage(f"event.text is longer than {MAX_EVENT_CHARS} characters")
    scene = message.get("scene")
    if scene is not None:
        if not isinstance(scene, str):
            raise InvalidMessage("event.scene must be a string or null")
        if len(scene) > MAX_SCENE_CHARS:
            raise InvalidMessage(f"event.scene is longer than {MAX_SCENE_CHARS} characters")
    policy = wire.string(message, "replyPolicy")
    if policy not in REPLY_POLICIES:
        raise InvalidMessage(f'event.replyPolicy must be "auto" or "none", got {policy[:32]!r}')
    priority = message.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise InvalidMessage("event.priority must be a number")
    _tellPlugin(connection, pw.EVENT, text=text, scene=scene, replyPolicy=policy, priority=priority)


def _toolResult(connection: ClientSurface, message: dict[str, Any]) -> None:
    callId = wire.identifier(message, "callId")
    error = message.get("error")
    if error is not None:
        if "result" in message and message["result"] is not None:
            raise InvalidMessage("tool-result has both result and error; send one")
        if not isinstance(error, str) or not error.strip():
            raise InvalidMessage("tool-result.error must be a non-empty string")
        _tellPlugin(connection, pw.TOOL_RESULT, callId=callId, error=error)
        return
    _tellPlugin(connection, pw.TOOL_RESULT, callId=callId, result=message.get("result"))


def sessionResumed(connection: ClientSurface) -> None:
    """
    The connection took back its session with C{reconnect}.  The plugin's
    messages for a session no connection has are dropped (see
    L{PlaybookBridge}), so the client may have missed stage changes: the
    plugin is asked to tell it the stage it is in.  Without the plugin in
    the chain there is nothing to tell, and nothing is sent.
    """
    if _pluginInChain(connection):
        _tellPlugin(connection, pw.RESUMED)


#: In the endpoint's dispatch table (L{rpmiddleware.client.endpoint}).
PLAYBOOK_HANDLERS: dict[str, Handler] = {
    "playbook": _guarded(_playbook),
    "event": _guarded(_event),
    "tool-result": _guarded(_toolResult),
}


# Toward the client.


def stageChange(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "stage-change",
        "from": fields["from"],
        "to": fields["to"],
        "reason": fields["reason"],
    }


def toolCallStart(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool-call-start",
        "name": fields["name"],
        "callId": fields["callId"],
        "arguments": fields.get("arguments") or {},
    }


def toolCallEnd(fields: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "tool-call-end", "callId": fields["callId"]}
    if "error" in fields:
        message["error"] = fields["error"]
    else:
        message["result"] = fields.get("result")
    message["durationMs"] = fields["durationMs"]
    return message


def playbookState(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "playbook-state",
        "playbook": fields.get("playbook"),
        "stage": fields.get("stage"),
        "source": fields.get("source"),
    }


def playbookError(fields: dict[str, Any]) -> dict[str, Any]:
    code = fields.get("code")
    code = code if code in CLIENT_CODES else INTERNAL_ERROR
    extra = {"callId": fields["callId"]} if isinstance(fields.get("callId"), str) else {}
    return errorMessage(code, str(fields.get("message") or code), False, **extra)


_MESSAGES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    pw.STAGE_CHANGE: stageChange,
    pw.TOOL_CALL_START: toolCallStart,
    pw.TOOL_CALL_END: toolCallEnd,
    pw.STATE: playbookState,
    pw.ERROR: playbookError,
}


class PlaybookBridge:
    """
    A router observer: the playbook plugin's envelopes to the connection of
    their session.  A session with no open connection (between a disconnect
    and its reconnect, or the Python API's C{"api"}) is not this endpoint's
    to serve: its messages are dropped here, and a turn asked for it is left
    to the plugin's timeout.

    @param connections: the endpoint's open connections, looked up on each
        envelope (at most C{server.max_connections}).
    """

    def __init__(self, connections: Callable[[], Iterable[ClientSurface]]) -> None:
        self.connections = connections

    def __call__(self, envelope: Envelope) -> None:
        kind = envelope.type
        if not kind.startswith(pw.PREFIX):
            return
        clientId = envelope.get("clientId")
        connection = self._find(clientId)
        if connection is None:
            # Not a session of an open connection here: the Python API's, or
            # one waiting for its reconnect.
            return
        if kind == pw.TURN:
            self._turn(connection, envelope)
            return
        translate = _MESSAGES.get(kind)
        if translate is not None:
            connection.send(translate(envelope.fields))

    def _find(self, clientId: Any) -> ClientSurface | None:
        return openConnection(self.connections(), clientId)

    def _turn(self, connection: ClientSurface, envelope: Envelope) -> None:
        """
        Start the auto_event turn the plugin asked for (it barges in, or
        waits, like any turn), or tell the plugin why not.
        """
        token = str(envelope.get("token") or "")
        text = str(envelope.get("text") or "")
        before = (connection.current, connection.queued)

        def open(request: dict[str, Any]) -> ReplyStream:
            request = {
                **request,
                "interactionMode": "auto_event",
                "meta": {**request["meta"], pw.TURN_TOKEN: token},
            }
            return connection.middleware.requestReply(text=text, **request)

        why = None
        try:
            connection.submit(EVENT, text, open)
        except InvalidMessage as e:
            connection.send(errorMessage(INVALID_MESSAGE, f"event: {e}"))
            why = str(e)
        else:
            if connection.current is before[0] and connection.queued <= before[1]:
                why = "the client's turn could not start"
        if why is not None:
            connection.middleware.chain.sendToEngine(
                pw.toPlugin(pw.TURN_FAILED, connection.session.id, token=token, reason=why)
            )


def installBridge(factory: Any) -> PlaybookBridge:
    """
    Observe C{factory}'s middleware router for playbook envelopes, delivering
    them to C{factory}'s open connections.
    """

    def connections() -> list[ClientSurface]:
        found = (getattr(p, "connection", None) for p in list(factory.connections))
        return [c for c in found if c is not None]

    bridge = PlaybookBridge(connections)
    factory.middleware.router.observe(bridge)
    factory.middleware.router.observe(ExtensionBridge(connections))
    return bridge
