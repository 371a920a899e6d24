"""
What the simulated RPEngine holds of each request: a reply queued or being
generated, or the one voice capture (app.rs QueuedReply, ActiveReply,
CaptureRequest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twisted.internet.interfaces import IDelayedCall

from rpmiddleware.testing.capture import MicrophoneCapture
from rpmiddleware.testing.replystream import ReplyStream


@dataclass
class SimReply:
    """
    A queued or active reply (app.rs QueuedReply / ActiveReply).
    """

    requestId: str
    fields: dict[str, Any]
    card: Any
    transcript: str | None = None
    stream: ReplyStream | None = None
    timers: list[IDelayedCall] = field(default_factory=list)

    @property
    def sourceMessageId(self) -> str:
        return str(self.fields.get("messageId", ""))


@dataclass
class SimCapture:
    """
    The voice capture (app.rs CaptureRequest): C{capturing}, C{stopping}
    (the browser finishes the recording) or C{transcribing}.
    """

    requestId: str
    fields: dict[str, Any]
    card: Any
    microphone: MicrophoneCapture
    phase: str = "capturing"
    timer: IDelayedCall | None = None
