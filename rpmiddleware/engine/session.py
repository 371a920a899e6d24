"""
One RPEngine connection session: handshake, validation, duplicates, acks.

This is the protocol's reliability layer and knows nothing of WebSockets: it
reads decoded JSON objects and writes through an L{IMessageWriter}-shaped
object, so tests drive it with a list and a L{Clock}.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from rpmiddleware.plugin.interfaces import IEngineSessionInfo
from rpmiddleware.protocol.envelope import (
    Direction,
    Envelope,
    isoTimestamp,
    loadJson,
    newMessageId,
    summarize,
)
from rpmiddleware.protocol.messages import (
    MAX_ID_LENGTH,
    MESSAGES,
    WITHDRAWING,
    ProtocolViolation,
    ackReference,
    validate,
)
from rpmiddleware.protocol.rules import MAX_MESSAGE_BYTES, EngineRefusal

#: RPEngine's answer to a message it cannot read: no requestId, no
#: sourceMessageId, no ack (app.rs transport_message).
INVALID_PAYLOAD = "invalid_payload"
#: The middleware's code for a request RPEngine ended with a terminal
#: envelope that breaks the protocol (malformedEnding).
MALFORMED_ENDING = "engine_protocol_error"
#: How many malformed endings' messageIds are remembered, to drop copies.
MALFORMED_WINDOW = 256

#: Close codes this side uses (4000-4999 are for applications).
CLOSE_HELLO_TIMEOUT = 4008
CLOSE_SUPERSEDED = 4001
CLOSE_SHUTDOWN = 1001


class MessageWriter(Protocol):
    def sendText(self, payload: bytes) -> None: ...

    def close(self, code: int, reason: str) -> None: ...


@dataclass
class SessionOptions:
    serverVersion: str = "rpmiddleware"
    helloTimeout: float = 5.0
    ackTimeout: float = 5.0
    maxRetransmits: int = 3
    dedupWindow: int = 4096
    ackEngineMessages: bool = False


@dataclass
class _Unacked:
    envelope: Envelope
    payload: bytes
    attempts: int = 0
    timer: IDelayedCall | None = field(default=None, repr=False)


@implementer(IEngineSessionInfo)
class EngineSession:
    """
    The game side of one RPEngine connection.

    @param onWelcome: called with this session once C{welcome} is sent.
    @param onEnvelope: called with each valid, new, non-ack envelope.
    @param onAcked: called with each envelope of ours that RPEngine acked.
    @param onClosed: called with this session when the connection ends.
    """

    log = Logger()
    #: Whether this session runs over RPEngine's file mailbox (file transport
    #: v1), where some messages exist that the WebSocket never carries.
    fileMode = False

    def __init__(
        self,
        writer: MessageWriter,
        clock: IReactorTime,
        options: SessionOptions,
        onWelcome: Callable[[EngineSession], None],
        onEnvelope: Callable[[EngineSession, Envelope], None],
        onClosed: Callable[[EngineSession], None],
        onAcked: Callable[[EngineSession, Envelope], None] = lambda s, e: None,
        peer: str = "",
    ) -> None:
        self._writer = writer
        self._clock = clock
        self._options = options
        self._onWelcome = onWelcome
        self._onEnvelope = onEnvelope
        self._onAcked = onAcked
        self._onClosed = onClosed
        self.peer = peer
        self.sessionId: str | None = None
        self.startedAt: float | None = None
        self.closed = False
        #: Set by the link once this session's requests were resent or failed.
        self.settled = False
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._unacked: OrderedDict[str, _Unacked] = OrderedDict()
        #: messageIds of malformed endings already handled (see _violation).
        self._malformedSeen: OrderedDict[str, None] = OrderedDict()
        #: The messageIds of what we wrote (acks aside), oldest first, until
        #: RPEngine answers each: it answers every message in order, with an
        #: ack or with an untied invalid_payload.
        self._awaitingAnswer: deque[str] = deque()
        self.duplicatesDropped = 0
        self.invalidDropped = 0
        self._helloTimer: IDelayedCall | None = clock.callLater(
            options.helloTimeout, self._helloTimedOut
        )

    # Reading

    def received(self, fields: Any) -> None:
        """
        One decoded JSON value arrived from RPEngine.
        """
        if self.closed:
            return
        try:
            spec = validate(fields, Direction.TO_GAME, self.sessionId)
        except ProtocolViolation as e:
            self._violation(fields, e)
            return
        envelope = Envelope(fields)
        if spec.fileModeOnly and not self.fileMode:
            self.invalid(f"{spec.type} travels only through the file mailbox", envelope.messageId)
            return
        if spec.type == "hello":
            self._hello(envelope)
            return
        if self.sessionId is None:
            self.invalid(f"{spec.type} arrived before hello", envelope.messageId)
            return
        messageId = str(envelope.messageId)
        if spec.type == "ack":
            self._acked(envelope)
            return
        if messageId in self._seen:
            self.duplicatesDropped += 1
            self._seen.move_to_end(messageId)
            self.log.info(
                "dropped duplicate {type} {messageId} from RPEngine",
                type=spec.type,
                messageId=messageId,
                sessionId=self.sessionId,
            )
            return
        self._remember(messageId)
        if spec.type == "request.error" and self._untiedRefusal(envelope):
            self._tieRefusal(envelope)
        if self._options.ackEngineMessages:
            self.send(Envelope.build("ack", acknowledgedMessageId=messageId))
        self._onEnvelope(self, envelope)

    def _violation(self, fields: Any, violation: ProtocolViolation) -> None:
        """
        Drop an envelope that breaks the protocol; but one that is terminal
        by its type and names a request still ends that request (the link
        knows whether it is live): RPEngine meant to end it, and nothing
        else will.  A copy under the same messageId is dropped unlogged.
        """
        ending = None
        if self.sessionId is not None and isinstance(fields, dict):
            # Another session's message ends nothing of this one.
            if fields.get("sessionId") == self.sessionId:
                ending = malformedEnding(fields, violation.reason)
        if ending is None:
            self.invalid(violation.reason, violation.messageId)
            return
        key = copyKey(violation.messageId)
        if key is not None:
            # Kept apart from the dedup window, which holds what was valid.
            if key in self._malformedSeen:
                self.duplicatesDropped += 1
                return
            self._malformedSeen[key] = None
            while len(self._malformedSeen) > MALFORMED_WINDOW:
                self._malformedSeen.popitem(last=False)
        self.invalid(violation.reason, violation.messageId)
        ending.fields["sessionId"] = self.sessionId
        self._onEnvelope(self, ending)

    def _remember(self, messageId: str) -> None:
        self._seen[messageId] = None
        while len(self._seen) > self._options.dedupWindow:
            self._seen.popitem(last=False)

    def invalid(self, reason: str, messageId: str | None = None) -> None:
        """
        Log and drop something RPEngine sent that breaks the protocol.
        """
        self.invalidDropped += 1
        self.log.warn(
            "dropped invalid envelope from RPEngine: {reason}",
            reason=clip(reason),
            messageId=messageId,
            sessionId=self.sessionId,
            peer=self.peer,
        )

    def _hello(self, hello: Envelope) -> None:
        if self.sessionId is not None:
            # RPEngine repeats the handshake only on a new connection; a second
            # hello here is a confused peer.  Keep the session it has.
            self.invalid("hello repeated on an established session", hello.messageId)
            return
        self._remember(str(hello.messageId))
        if self.fileMode:
            # Before the welcome, as RPEngine's own mock game does in file
            # mode (tools/mock-game/server.mjs consumeFileEnvelope): RPEngine
            # removes its hello file when it reads this.
            self.send(Envelope.build("ack", acknowledgedMessageId=str(hello.messageId)))
        self._establish()
        self.log.info(
            "RPEngine connected from {peer}: session {sessionId}",
            peer=self.peer,
            sessionId=self.sessionId,
            clientVersion=hello.get("clientVersion"),
        )
        self._onWelcome(self)

    def _establish(self) -> Envelope:
        """
        Become a session: a new sessionId, and C{welcome} written.
        """
        if self._helloTimer is not None and self._helloTimer.active():
            self._helloTimer.cancel()
        self._helloTimer = None
        self.sessionId = uuid.uuid4().hex
        self.startedAt = self._clock.seconds()
        return self.send(
            Envelope.build(
                "welcome",
                self.sessionId,
                serverVersion=self._options.serverVersion,
                **self._welcomeFields(),
            )
        )

    def _welcomeFields(self) -> dict[str, Any]:
        """
        Fields a transport adds to C{welcome} (the file mailbox adds its
        peer identity and next audio slot); none over the WebSocket.
        """
        return {}

    def _helloTimedOut(self) -> None:
        self._helloTimer = None
        self.log.warn(
            "no hello from {peer} within {timeout} s; closing",
            peer=self.peer,
            timeout=self._options.helloTimeout,
        )
        self._writer.close(CLOSE_HELLO_TIMEOUT, "no hello within the handshake timeout")

    @staticmethod
    def _untiedRefusal(error: Envelope) -> bool:
        return (
            error.get("code") == INVALID_PAYLOAD
            and not error.get("sourceMessageId")
            and not error.get("requestId")
        )

    def _tieRefusal(self, error: Envelope) -> None:
        """
        Name, in C{error}, the message RPEngine refused: the oldest one it
        has not answered.  It is not sent again (it would be refused again),
        and the request it carried ends with this error.
        """
        if not self._awaitingAnswer:
            return
        messageId = self._awaitingAnswer.popleft()
        entry = self._forget(messageId)
        if entry is None:
            return
        refused = entry.envelope
        self.log.warn(
            "RPEngine refused {envelope}: {reason}",
            envelope=summarize(refused.fields),
            reason=error.get("message"),
            sessionId=self.sessionId,
        )
        error["sourceMessageId"] = messageId
        # A refused cancel must not end the turn it names: that turn runs on
        # in RPEngine.
        if refused.requestId and refused.type not in WITHDRAWING:
            error["requestId"] = refused.requestId
        error["message"] = f"RPEngine refused the {refused.type}: {error.get('message') or ''}"

    def _forget(self, messageId: str) -> _Unacked | None:
        entry = self._unacked.pop(messageId, None)
        if entry is not None and entry.timer is not None and entry.timer.active():
            entry.timer.cancel()
        return entry

    def _answered(self, messageId: str) -> None:
        if messageId in self._awaitingAnswer:
            while self._awaitingAnswer.popleft() != messageId:
                pass

    def _acked(self, ack: Envelope) -> None:
        reference = ackReference(ack.fields)
        if reference:
            self._answered(reference)
        entry = self._forget(reference) if reference else None
        if entry is None:
            # A late ack for a retransmitted message, or for one we never sent.
            self.log.debug("ack for unknown messageId {reference}", reference=reference)
            return
        self._onAcked(self, entry.envelope)

    # Writing

    def send(self, envelope: Envelope) -> Envelope:
        """
        Stamp C{envelope} for this session and write it.  Everything but an
        ack is kept until RPEngine acknowledges it, and sent again with the
        same messageId if that takes longer than the ack timeout.

        What it carries is the sender's to check: the engine link checks
        every envelope that leaves the chain
        (L{rpmiddleware.protocol.rules.checkOutgoing}), once, before it holds or
        sends it, and the session's own messages (acks, C{welcome}, the
        mailbox's cancels and probes) are built right.  Only the size is
        judged here, once the envelope is stamped and encoded.

        @raise EngineRefusal: if it is larger than RPEngine reads; nothing
            is written then.
        """
        fields = envelope.fields
        if self.sessionId is not None:
            fields["sessionId"] = self.sessionId
        if not fields.get("messageId"):
            fields["messageId"] = newMessageId()
        fields["timestamp"] = isoTimestamp()
        payload = envelope.toBytes()
        if len(payload) > MAX_MESSAGE_BYTES:
            raise EngineRefusal(
                "message", f"is {len(payload)} bytes; RPEngine reads at most {MAX_MESSAGE_BYTES}"
            )
        if envelope.type != "ack":
            self._awaitingAnswer.append(fields["messageId"])
        if envelope.type != "ack" and self._options.maxRetransmits >= 0:
            entry = _Unacked(envelope, payload)
            self._unacked[fields["messageId"]] = entry
            entry.timer = self._clock.callLater(
                self._options.ackTimeout, self._retransmit, fields["messageId"]
            )
        self._write(fields["messageId"], payload, envelope.type == "ack")
        return envelope

    def _write(self, messageId: str, payload: bytes, ack: bool) -> None:
        """
        Hand one encoded envelope to the transport.  The file mailbox names
        its files after the messageId, and removes its acks itself (nobody
        acknowledges them), so it is told both here too.
        """
        self._writer.sendText(payload)

    def _stillQueued(self, messageId: str) -> bool:
        """
        Whether RPEngine has not even read C{messageId} yet, so that writing
        it again would not help (the file mailbox: its file is still
        there).  A WebSocket frame, once written, is never still queued.
        """
        return False

    def _retransmit(self, messageId: str) -> None:
        entry = self._unacked.get(messageId)
        if entry is None or self.closed:
            return
        if self._stillQueued(messageId):
            # Not read yet (RPEngine's tab may be throttled in the
            # background): waiting is all there is to do, and it is not a
            # failed attempt.
            entry.timer = self._clock.callLater(
                self._options.ackTimeout, self._retransmit, messageId
            )
            return
        if entry.attempts >= self._options.maxRetransmits:
            del self._unacked[messageId]
            self.log.warn(
                "RPEngine never acknowledged {envelope} after {attempts} retransmissions",
                envelope=summarize(entry.envelope.fields),
                attempts=entry.attempts,
            )
            return
        entry.attempts += 1
        self._awaitingAnswer.append(messageId)
        self.log.info(
            "retransmitting unacknowledged {envelope} (attempt {attempt})",
            envelope=summarize(entry.envelope.fields),
            attempt=entry.attempts,
        )
        self._write(messageId, entry.payload, False)
        entry.timer = self._clock.callLater(self._options.ackTimeout, self._retransmit, messageId)

    def unacknowledged(self) -> list[Envelope]:
        """
        What was sent in this session and never acknowledged, oldest first.
        """
        return [entry.envelope for entry in self._unacked.values()]

    def isAcknowledged(self, messageId: str) -> bool:
        return messageId not in self._unacked

    # Ending

    def close(self, code: int, reason: str) -> None:
        self._writer.close(code, reason)

    def connectionLost(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._helloTimer is not None and self._helloTimer.active():
            self._helloTimer.cancel()
        for entry in self._unacked.values():
            if entry.timer is not None and entry.timer.active():
                entry.timer.cancel()
        self._onClosed(self)

    def describe(self) -> dict[str, Any]:
        return {
            "sessionId": self.sessionId,
            "peer": self.peer,
            "unacknowledged": len(self._unacked),
            "duplicatesDropped": self.duplicatesDropped,
            "invalidDropped": self.invalidDropped,
        }


#: Characters of RPEngine's words kept in a log line or a client message.
CLIP = 200


def clip(text: str, limit: int = CLIP) -> str:
    """
    C{text} cut to C{limit} characters, saying how much was cut.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def copyKey(messageId: str | None) -> str | None:
    """
    The messageId by which copies of a malformed ending are known, if it is
    a well-formed id (a copy under a malformed one cannot be told apart).
    """
    if isinstance(messageId, str) and 0 < len(messageId) <= MAX_ID_LENGTH:
        return messageId
    return None


def malformedEnding(fields: Any, reason: str) -> Envelope | None:
    """
    The C{request.error} that ends the request a malformed terminal
    envelope from RPEngine names, or C{None} if it is no such envelope (not
    terminal by type, or no requestId).  Marked C{meta["malformed"]}: the
    link passes it on only for a request that is still open.
    """
    if not isinstance(fields, dict):
        return None
    kind, requestId = fields.get("type"), fields.get("requestId")
    spec = MESSAGES.get(kind) if isinstance(kind, str) else None
    if spec is None or not spec.terminal or Direction.TO_GAME not in spec.directions:
        return None
    if not isinstance(requestId, str) or not requestId or len(requestId) > 256:
        return None
    said = fields.get("message") if kind == "request.error" else None
    words = f" RPEngine's message: {clip(said)!r}." if isinstance(said, str) and said else ""
    ending = Envelope.build(
        "request.error",
        requestId=requestId,
        code=MALFORMED_ENDING,
        message=(
            f"RPEngine ended this turn with a {kind} that breaks protocol v3 "
            f"({clip(reason)}); the turn is over and can be asked again.{words}"
        ),
        retryable=True,
        malformedType=kind,
    )
    if isinstance(fields.get("messageId"), str):
        ending.fields["sourceMessageId"] = fields["messageId"][:256]
    ending.meta["synthetic"] = True
    ending.meta["malformed"] = True
    return ending


def decodeText(payload: bytes | str) -> Any:
    """
    Decode one text frame; L{ProtocolViolation} if it is not JSON.
    """
    try:
        return loadJson(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolViolation(f"not valid JSON: {e}")
    except RecursionError:
        # Nesting deeper than the interpreter's recursion limit ("[[[[...").
        raise ProtocolViolation("not valid JSON: nested too deeply")
