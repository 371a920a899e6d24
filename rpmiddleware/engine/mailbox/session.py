"""
An L{EngineSession} over the file mailbox, and the writer it writes through.

The session's reliability (handshake, dedup, acks, retransmission, tying
RPEngine's untied C{invalid_payload} to a message) is the WebSocket's,
unchanged; file transport v1 differs only where RPEngine's file mode does
(C{docs/file-transport-v1.md}, C{src/filesystem-mailbox-adapter.ts},
C{tools/mock-game/server.mjs}):

  - both sides acknowledge every message (RPEngine removes its files when
    it reads our ack), the hello included;
  - C{welcome} carries the game process's C{peerInstanceId} and the
    C{nextAudioSlot} RPEngine may write;
  - a message is only resent when RPEngine has read its file and not
    acknowledged it: one still waiting in the folder is left to be read;
  - a session can start without a hello: a C{welcome} written into the
    mailbox is adopted by an RPEngine that is already polling it (after the
    middleware restarted, or to give RPEngine a fresh set of audio slots);
  - RPEngine stamps its messages with whichever of our welcomes it read
    last (none, for what a new tab reads from the folder before its
    handshake), and acknowledges a welcome before adopting it, so messages
    stamped with no session or an earlier one of this mailbox, and acks
    under any session, are this session's.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import Any, Protocol

from twisted.internet.interfaces import IReactorTime

from rpmiddleware.engine.mailbox.audioslots import SlotLedger
from rpmiddleware.engine.session import EngineSession, SessionOptions
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import ackReference


class Outbox(Protocol):
    """
    What a L{MailboxWriter} writes into: the folder RPEngine reads.
    """

    def write(self, messageId: str, payload: bytes, ack: bool) -> None: ...

    def unread(self, messageId: str) -> bool: ...


class MailboxWriter:
    """
    The session's C{sendText}/C{close} over the mailbox: writes go to the
    shared L{Outbox}, and closing ends this session (there is no connection
    to close; the service is told).
    """

    def __init__(self, outbox: Outbox, onClose: Callable[[MailboxWriter, int, str], None]) -> None:
        self.outbox = outbox
        self._onClose = onClose
        self.session: MailboxSession | None = None
        self.closed = False

    def sendText(self, payload: bytes) -> None:
        raise TypeError("a mailbox session writes through write(), which names the file")

    def write(self, messageId: str, payload: bytes, ack: bool) -> None:
        if not self.closed:
            self.outbox.write(messageId, payload, ack)

    def unread(self, messageId: str) -> bool:
        return self.outbox.unread(messageId)

    def close(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self._onClose(self, code, reason)


class MailboxSession(EngineSession):
    """
    One RPEngine session through the file mailbox.

    @ivar pending: adopted without a hello and not yet confirmed by RPEngine
        (no message under its sessionId, no ack of its welcome): the engine
        link has not been told of it.
    """

    fileMode = True

    def __init__(
        self,
        writer: MailboxWriter,
        clock: IReactorTime,
        options: SessionOptions,
        ledger: SlotLedger,
        formerSessionIds: Set[str],
        onWelcome: Callable[[EngineSession], None],
        onEnvelope: Callable[[EngineSession, Envelope], None],
        onClosed: Callable[[EngineSession], None],
        onAcked: Callable[[EngineSession, Envelope], None] = lambda s, e: None,
        peer: str = "",
    ) -> None:
        super().__init__(
            writer,
            clock,
            options,
            onWelcome=onWelcome,
            onEnvelope=onEnvelope,
            onClosed=onClosed,
            onAcked=onAcked,
            peer=peer,
        )
        writer.session = self
        self.writer = writer
        self._ledger = ledger
        self._former = formerSessionIds
        self.pending = False
        self.welcomeId: str | None = None

    def _welcomeFields(self) -> dict[str, Any]:
        return self._ledger.welcomeFields()

    def _write(self, messageId: str, payload: bytes, ack: bool) -> None:
        # Acks are files like any other, but nobody acknowledges them: the
        # outbox removes ours after a while, as RPEngine does its own.
        self.writer.write(messageId, payload, ack)

    def _stillQueued(self, messageId: str) -> bool:
        return self.writer.unread(messageId)

    def adopt(self, announce: bool) -> None:
        """
        Start this session without a hello: write C{welcome} for an RPEngine
        that is already reading the mailbox.

        @param announce: tell the engine link now (RPEngine is known to be
            there); otherwise the session stays L{pending} until RPEngine
            shows it read the welcome.
        """
        self.welcomeId = self._establish().messageId
        self.log.info(
            "wrote a welcome (session {sessionId}) for the RPEngine reading {peer}",
            sessionId=self.sessionId,
            peer=self.peer,
            waitsForRPEngine=not announce,
        )
        if announce:
            self._onWelcome(self)
        else:
            self.pending = True

    def received(self, fields: Any) -> None:
        if isinstance(fields, dict) and self.sessionId is not None:
            stamped, kind = fields.get("sessionId"), fields.get("type")
            if self.pending and self._confirms(stamped, kind, fields):
                self.pending = False
                self.log.info(
                    "RPEngine adopted session {sessionId} from the mailbox",
                    sessionId=self.sessionId,
                )
                self._onWelcome(self)
            if kind == "ack" and stamped != self.sessionId:
                # Matched by the messageId it names (RPEngine acks a welcome
                # under the session it had before adopting it).
                fields["sessionId"] = None
            elif stamped is None and kind != "hello":
                # Read from the mailbox before RPEngine's handshake: a new
                # tab answers what waited in the folder before it has a
                # session at all.
                fields["sessionId"] = self.sessionId
            elif isinstance(stamped, str) and stamped in self._former:
                fields["sessionId"] = self.sessionId
        super().received(fields)

    def _confirms(self, stamped: Any, kind: Any, fields: dict[str, Any]) -> bool:
        if stamped == self.sessionId and kind != "hello":
            return True
        return kind == "ack" and ackReference(fields) == self.welcomeId
