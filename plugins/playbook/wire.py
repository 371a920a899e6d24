"""
The playbook plugin's own envelopes: what it is told (by a client's messages,
L{rpmiddleware.builtin.playbook.clientmessages}, or an in-process game
directly) and what it tells, before it becomes the client's messages.

The plugin keeps the dialogue logic and speaks to clients through the client
extension (L{rpmiddleware.plugin.clientext}); nothing in the core knows these
names.  Every one of them carries the client session id in C{meta["client"]};
those toward the game also carry it as the field C{clientId}.  They stay in
the plugin: the outbox turns those toward the game into client messages
(L{rpmiddleware.builtin.playbook.clientmessages.toGame}), keeping the
plugin's own envelope in the message's C{meta["playbook"]} for an in-process
game.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.plugin import Envelope

#: The name the playbook plugin has in the chain.
PLUGIN_NAME = "playbook"

PREFIX = "x-playbook."

# Game -> plugin (toward the engine), consumed by the plugin.

#: A client sent a playbook: C{playbook} (object or None to remove it) or C{toml} (str).
LOAD = "x-playbook.load"
#: A live game event: C{text}, C{scene} (str or None), C{replyPolicy}, C{priority}.
EVENT = "x-playbook.event"
#: A client-executed tool's answer: C{callId} and C{result} or C{error}.
TOOL_RESULT = "x-playbook.tool-result"
#: A client took its session back with C{reconnect}: no fields.
RESUMED = "x-playbook.resumed"

# Plugin -> game (toward the game), seen by router observers.

#: C{from}, C{to}, C{reason}: the seed's stage-change.
STAGE_CHANGE = "x-playbook.stage-change"
#: C{name}, C{callId}, C{arguments}, C{runBy}: the seed's tool-call-start.
TOOL_CALL_START = "x-playbook.tool-call-start"
#: C{callId}, C{result} or C{error}, C{durationMs}: the seed's tool-call-end.
TOOL_CALL_END = "x-playbook.tool-call-end"
#: C{code} (a client error code), C{message}, and maybe C{callId}.
ERROR = "x-playbook.error"
#: C{playbook} (name or None), C{stage}, C{source}: which playbook now runs.
STATE = "x-playbook.state"
#: Start an auto_event turn: C{token} (to put in the request's meta as
#: C{playbookTurn}) and C{text} (the events, for the turn's history).
TURN = "x-playbook.turn"

#: The meta key a turn started for C{TURN} carries its token under.
TURN_TOKEN = "playbookTurn"


def toPlugin(kind: str, clientId: str, **fields: Any) -> Envelope:
    """
    An envelope from a client (or an in-process game acting as one) for the
    playbook plugin.
    """
    envelope = Envelope.build(kind, **fields)
    envelope.meta["client"] = clientId
    return envelope


def toGame(kind: str, clientId: str, **fields: Any) -> Envelope:
    """
    An envelope from the playbook plugin for the client C{clientId}.
    """
    envelope = Envelope.build(kind, clientId=clientId, **fields)
    envelope.meta["client"] = clientId
    return envelope
