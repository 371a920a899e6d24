"""
The engine end without a socket: a fake session writer that keeps what
was sent, and L{Harness}, a middleware on a Clock with an engine session
driven by hand and a recording chain.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock

from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.engine.session import EngineSession
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard
from tests.support.chain import Recorder


class FakeWriter:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closedWith: tuple[int, str] | None = None

    def sendText(self, payload: bytes) -> None:
        self.sent.append(json.loads(payload))

    def close(self, code: int, reason: str) -> None:
        self.closedWith = (code, reason)

    def types(self) -> list[str]:
        return [m["type"] for m in self.sent]


class MetaRecorder(Recorder):
    """
    Also keeps a copy of the meta of every envelope going to the engine.
    """

    def __init__(self, name: str, trail: list[str]) -> None:
        super().__init__(name, trail)
        self.metas: list[dict[str, Any]] = []

    def envelopeToEngine(self, envelope: Envelope, context: Any) -> Any:
        self.metas.append(dict(envelope.meta))
        return super().envelopeToEngine(envelope, context)


class Harness:
    def __init__(self, waitingLimit: int = 64) -> None:
        self.clock = Clock()
        settings = Settings()
        settings.engine.waiting_limit = waitingLimit
        self.trail: list[str] = []
        self.plugin = MetaRecorder("recorder", self.trail)
        self.middleware = Middleware(self.clock, settings, [self.plugin])
        self.middleware.registerCharacter("mira", exampleCard())

    def connect(self) -> tuple[EngineSession, FakeWriter]:
        writer = FakeWriter()
        session = self.middleware.newEngineSession(writer, "peer")
        session.received(Envelope.build("hello").fields)
        return session, writer

    def engineSays(self, session: EngineSession, type: str, **fields: Any) -> None:
        session.received(Envelope.build(type, session.sessionId, **fields).fields)

    def ack(self, session: EngineSession, writer: FakeWriter, type: str) -> dict[str, Any]:
        sent = [m for m in writer.sent if m["type"] == type][-1]
        self.engineSays(session, "ack", acknowledgedMessageId=sent["messageId"])
        return sent
