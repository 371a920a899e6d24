"""
One client turn without sockets: a recorder for the messages a turn sends
to its client, and a turn started on an engine queue.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.client.turns import TEXT, Turn
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.engine.queue import EngineQueue


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.refuseAudio = False

    def __call__(self, message: dict[str, Any], audio: bool = False) -> bool:
        if audio and self.refuseAudio:
            return False
        self.sent.append(message)
        return True

    def types(self) -> list[str]:
        return [m["type"] for m in self.sent]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == kind]


def startedTurn(
    stream: ReplyStream, clock: Any, queue: EngineQueue, text: str = "Hello?", stall: float = 60.0
) -> tuple[Turn, Recorder]:
    """
    A text turn on C{stream} under the stall rule, started; and what it sent.
    """
    send = Recorder()
    turn = Turn(
        TEXT,
        stream,
        send,
        None,
        clock,
        300.0,
        lambda t: None,
        text,
        stallTimeout=stall,
        queue=queue,
    )
    turn.start()
    return turn, send
