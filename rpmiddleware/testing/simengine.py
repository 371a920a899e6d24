"""
The RPEngine side of protocol v3, without any transport.

L{SimulatedEngine} reads decoded envelopes from the game and writes full
envelopes through a callable, pacing everything with an L{IReactorTime}, so
tests drive it with a list and a L{Clock} and the WebSocket client in
L{rpmiddleware.testing.simulator} drives it with the real reactor.  It is
strict where the seed is explicit, so a middleware bug shows up as a
C{request.error} or an entry in L{SimulatedEngine.protocolErrors}, and it
keeps logs (what it received, sent, processed, cancelled) for assertions.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from rpmiddleware.envelope import Envelope
from rpmiddleware.testing.capture import MicrophoneCapture
from rpmiddleware.testing.cardstore import SessionCardStore
from rpmiddleware.testing.envelopecheck import ackReference, headProblem, text, welcomeProblem
from rpmiddleware.testing.replystream import ReplyStream
from rpmiddleware.testing.requestchecks import RequestError, checkEvent, checkIdentity, checkOutput
from rpmiddleware.testing.simoptions import SimulatorOptions, defaultReplyText


@dataclass
class _Turn:
    requestId: str
    fields: dict[str, Any]
    wantAudio: bool
    state: str = "queued"  # "capturing", "queued" or "active"
    transcript: str | None = None
    capture: MicrophoneCapture | None = None
    stream: ReplyStream | None = None


class SimulatedEngine:
    """
    RPEngine's side of one connection at a time.

    Logs (C{sent}, C{receivedMessages}, C{processed}, C{cancelled},
    C{completed}, C{duplicates}, C{protocolErrors}, C{cardTransfers}) span
    every session of this object; caches, seen ids and queues belong to one
    session and start afresh with L{connected}.

    @ivar welcomed: fires with this engine when the session is established;
        it never errbacks (nothing may be waiting for it).
    @ivar closed: fires when the connection is gone.
    @ivar transportDisconnect: set by a transport to let L{disconnect}
        drop the real connection.
    """

    def __init__(
        self,
        send: Callable[[dict[str, Any]], None],
        clock: IReactorTime,
        options: SimulatorOptions | None = None,
    ) -> None:
        self._send = send
        self.clock = clock
        self.options = options if options is not None else SimulatorOptions()
        self.transportDisconnect: Callable[[], None] | None = None
        #: The object carrying this engine's messages, if any (for tests
        #: that inspect the real connection).
        self.carrier: object | None = None
        self.sent: list[dict[str, Any]] = []
        self.receivedMessages: list[Any] = []
        self.processed: Counter[str] = Counter()
        self.cancelled: list[str] = []
        self.completed: list[str] = []
        self.duplicates: list[str] = []
        self.acksReceived: list[str] = []
        self.protocolErrors: list[tuple[str | None, str]] = []
        self.cardTransfers: list[tuple[str, int]] = []
        self.welcomed: Deferred[SimulatedEngine] = Deferred()
        self.closed: Deferred[None] = Deferred()
        self._welcomeTimer: IDelayedCall | None = None
        self._newSession()
        self._open = False

    def _newSession(self) -> None:
        self.sessionId: str | None = None
        self.serverVersion: str | None = None
        self.cards = SessionCardStore(self.cardTransfers)
        self._seen: set[str] = set()
        self._requestIds: set[str] = set()
        self._turns: dict[str, _Turn] = {}
        self._queue: deque[str] = deque()
        self._accepting = True
        self._lastCapacity: tuple[bool, int] | None = None

    # Connection life

    def connected(self) -> None:
        """
        The WebSocket is open: start a session and say C{hello} at once.
        """
        self._stopAll()
        self._newSession()
        if self.welcomed.called:
            self.welcomed = Deferred()
        if self.closed.called:
            self.closed = Deferred()
        self._open = True
        self._emit("hello", clientVersion=self.options.clientVersion)
        if self.options.welcomeTimeout is not None:
            self._welcomeTimer = self.clock.callLater(
                self.options.welcomeTimeout, self._welcomeTimedOut
            )

    def disconnect(self) -> None:
        """
        Go away abruptly (the player closed the tab), mid-turn or not.
        """
        self._stopAll()
        if self.transportDisconnect is not None:
            self.transportDisconnect()
        else:
            self.disconnected()

    def disconnected(self) -> None:
        """
        The connection is gone: stop every timer and stream.
        """
        self._stopAll()
        if not self.closed.called:
            self.closed.callback(None)

    def _stopAll(self) -> None:
        self._open = False
        if self._welcomeTimer is not None and self._welcomeTimer.active():
            self._welcomeTimer.cancel()
        self._welcomeTimer = None
        for turn in self._turns.values():
            if turn.stream is not None:
                turn.stream.stop()
            if turn.capture is not None:
                turn.capture.cancel(announce=False)
        self._turns.clear()
        self._queue.clear()

    def _welcomeTimedOut(self) -> None:
        self._welcomeTimer = None
        self.protocolErrors.append((None, "no welcome within the handshake timeout"))
        self.disconnect()

    # Writing

    def _emit(self, type: str, **fields: Any) -> dict[str, Any]:
        envelope = Envelope.build(type, self.sessionId, **fields).fields
        if self._open:
            self.sent.append(envelope)
            self._send(envelope)
        return envelope

    def _ack(self, messageId: str, duplicate: bool = False) -> None:
        if self.options.dropAcks:
            return
        if duplicate:
            self._emit("ack", sourceMessageId=messageId, duplicate=True)
        else:
            self._emit("ack", sourceMessageId=messageId)

    def _error(
        self,
        code: str,
        message: str,
        retryable: bool,
        sourceMessageId: str | None = None,
        requestId: str | None = None,
    ) -> None:
        fields: dict[str, Any] = {}
        if requestId is not None:
            fields["requestId"] = requestId
        if sourceMessageId is not None:
            fields["sourceMessageId"] = sourceMessageId
        self._emit("request.error", code=code, message=message, retryable=retryable, **fields)

    def _reject(self, rejected: RequestError, fields: dict[str, Any]) -> None:
        self._error(
            rejected.code,
            rejected.message,
            rejected.retryable,
            text(fields.get("messageId")),
            text(fields.get("requestId")),
        )

    def _protocolError(self, fields: Any, reason: str) -> None:
        known = fields if isinstance(fields, dict) else {}
        messageId = text(known.get("messageId"))
        self.protocolErrors.append((messageId, reason))
        self._error("request_failed", reason, False, messageId, text(known.get("requestId")))

    # Reading

    def undecodable(self, reason: str) -> None:
        """
        A frame that is not a JSON envelope at all.
        """
        if self._open:
            self.receivedMessages.append(None)
            self._protocolError(None, reason)

    def received(self, fields: Any) -> None:
        """
        Handle one decoded envelope from the game.
        """
        if not self._open:
            return
        self.receivedMessages.append(fields)
        problem = headProblem(fields, self.sessionId)
        if problem is not None:
            self._protocolError(fields, problem)
            return
        kind: str = fields["type"]
        messageId: str = fields["messageId"]
        if kind == "ack":
            reference = ackReference(fields)
            if reference is None:
                self._protocolError(fields, "ack does not name the messageId it acknowledges")
            else:
                self.acksReceived.append(reference)
            return
        if messageId in self._seen:
            self.duplicates.append(messageId)
            self._ack(messageId, duplicate=True)
            return
        if kind == "welcome":
            problem = welcomeProblem(fields, self.sessionId)
            if problem is not None:
                self._protocolError(fields, problem)
                return
        self._seen.add(messageId)
        if kind == "welcome":
            self._welcome(fields)
            return
        self._ack(messageId)
        handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "character.sync": self._characterSync,
            "reply.request": self._replyRequest,
            "request.cancel": self._requestCancel,
            "voice.capture.start": self._captureStart,
            "voice.capture.stop": self._captureStop,
            "voice.capture.cancel": self._captureCancel,
        }
        handlers[kind](fields)

    def _welcome(self, fields: dict[str, Any]) -> None:
        if self._welcomeTimer is not None and self._welcomeTimer.active():
            self._welcomeTimer.cancel()
        self._welcomeTimer = None
        self.sessionId = fields["sessionId"]
        self.serverVersion = fields["serverVersion"]
        self._ack(fields["messageId"])
        self._updateCapacity(force=True)
        if not self.welcomed.called:
            self.welcomed.callback(self)

    # Capacity

    def _capacity(self) -> tuple[bool, int]:
        depth = len(self._turns)
        return self._accepting and depth < self.options.queueLimit, depth

    def _updateCapacity(self, force: bool = False) -> None:
        if self.sessionId is None:
            return
        state = self._capacity()
        if state == self._lastCapacity and not force:
            return
        self._lastCapacity = state
        self._emit(
            "capacity.update",
            acceptingRequests=state[0],
            queueDepth=state[1],
            queueLimit=self.options.queueLimit,
        )

    def setAccepting(self, accepting: bool) -> None:
        """
        Open or close RPEngine's gate for new work; always announced.
        """
        self._accepting = accepting
        self._updateCapacity(force=True)

    @property
    def queueDepth(self) -> int:
        return len(self._turns)

    # Characters and requests

    def _characterSync(self, fields: dict[str, Any]) -> None:
        try:
            checkIdentity(fields)
            targetHash, _ = self.cards.resolve(fields.get("card"))
        except RequestError as e:
            self._reject(e, fields)
            return
        self._emit(
            "character.synced",
            integrationId=fields["integrationId"],
            characterId=fields["characterId"],
            targetHash=targetHash,
        )

    def _admit(self, fields: dict[str, Any], capture: bool) -> _Turn:
        """
        Run a new turn's checks in RPEngine's order and register it.

        A requestId counts as seen only once accepted, so a retryable
        rejection (a card resync, a full queue) can be retried under the
        same requestId.
        """
        requestId: str = fields["requestId"]
        if not self.options.serviceStarted:
            raise RequestError("service_not_started", "the RPEngine service is not started", True)
        if capture and not self.options.microphoneEnabled:
            raise RequestError(
                "microphone_not_enabled", "the player has not enabled the microphone"
            )
        if requestId in self._requestIds:
            raise RequestError("duplicate_request", f"requestId {requestId!r} was already accepted")
        checkIdentity(fields)
        if capture:
            busy = next((t for t in self._turns.values() if t.state == "capturing"), None)
            if busy is not None:
                raise RequestError(
                    "request_failed", f"the microphone is capturing for {busy.requestId!r}"
                )
        self.cards.resolve(fields.get("card"))
        wantAudio = checkOutput(fields.get("output"))
        seconds = None if capture else checkEvent(fields.get("event"))
        accepting, depth = self._capacity()
        if not accepting:
            raise RequestError(
                "capacity_exceeded",
                f"not accepting requests ({depth} of {self.options.queueLimit} in the queue)",
                True,
            )
        turn = _Turn(requestId, fields, wantAudio)
        if seconds is not None:
            turn.transcript = f"(simulated transcript of {seconds:.2f} s of audio)"
        self._requestIds.add(requestId)
        self._turns[requestId] = turn
        return turn

    def _replyRequest(self, fields: dict[str, Any]) -> None:
        try:
            turn = self._admit(fields, capture=False)
        except RequestError as e:
            self._reject(e, fields)
            return
        self._queue.append(turn.requestId)
        self._updateCapacity()
        self._pump()

    def _pump(self) -> None:
        active = sum(1 for t in self._turns.values() if t.state == "active")
        while self._queue and active < max(1, self.options.concurrency):
            if self._activate(self._turns[self._queue.popleft()]):
                active += 1

    def _activate(self, turn: _Turn) -> bool:
        turn.state = "active"
        self.processed[turn.requestId] += 1
        request = dict(turn.fields)
        if turn.transcript is not None:
            request["transcript"] = turn.transcript
        try:
            reply = (self.options.replyText or defaultReplyText)(request)
        except Exception as e:
            # A replyText that raises simulates a failed generation.
            del self._turns[turn.requestId]
            self._error(
                "request_failed",
                f"reply generation failed: {e}",
                False,
                text(turn.fields.get("messageId")),
                turn.requestId,
            )
            self._updateCapacity()
            return False
        turn.stream = ReplyStream(
            turn.requestId,
            reply,
            turn.wantAudio,
            self._emit,
            self.clock,
            self.options.pacing(),
            self._streamFinished,
            transcript=turn.transcript,
        )
        turn.stream.start()
        return True

    def _streamFinished(self, stream: ReplyStream) -> None:
        if self._turns.pop(stream.requestId, None) is None:
            return
        self.completed.append(stream.requestId)
        self._updateCapacity()
        self._pump()

    def _cancelTurn(self, requestId: str) -> bool:
        turn = self._turns.pop(requestId, None)
        if turn is None:
            return False
        if turn.stream is not None:
            turn.stream.stop()
        if turn.capture is not None:
            turn.capture.cancel()
        if requestId in self._queue:
            self._queue.remove(requestId)
        self.cancelled.append(requestId)
        self._emit("reply.cancelled", requestId=requestId)
        self._updateCapacity()
        self._pump()
        return True

    def _unknownRequest(self, fields: dict[str, Any], what: str) -> None:
        requestId = fields["requestId"]
        why = "it has already finished" if requestId in self._requestIds else "it is not known"
        self._error(
            "request_failed",
            f"{what} {requestId!r}: {why}",
            False,
            fields["messageId"],
            requestId,
        )

    def _requestCancel(self, fields: dict[str, Any]) -> None:
        if not self._cancelTurn(fields["requestId"]):
            self._unknownRequest(fields, "no queued or active request")

    # The microphone

    def _captureStart(self, fields: dict[str, Any]) -> None:
        try:
            turn = self._admit(fields, capture=True)
        except RequestError as e:
            self._reject(e, fields)
            return
        turn.state = "capturing"
        turn.capture = MicrophoneCapture(
            turn.requestId,
            self._emit,
            self.clock,
            self.options.captureSpeechSeconds,
            lambda seconds: self._speechEnded(turn, seconds),
        )
        self._updateCapacity()
        turn.capture.start()

    def _speechEnded(self, turn: _Turn, seconds: float) -> None:
        turn.transcript = f"(simulated transcript of {seconds:.2f} s of speech)"
        turn.state = "queued"
        self._queue.append(turn.requestId)
        self._pump()

    def _captureTurn(self, fields: dict[str, Any]) -> _Turn | None:
        turn = self._turns.get(fields["requestId"])
        if turn is None:
            self._unknownRequest(fields, "no voice capture for request")
            return None
        if turn.capture is None:
            self._error(
                "request_failed",
                f"request {turn.requestId!r} is a reply.request, not a voice capture",
                False,
                fields["messageId"],
                turn.requestId,
            )
            return None
        return turn

    def _captureStop(self, fields: dict[str, Any]) -> None:
        turn = self._captureTurn(fields)
        if turn is not None and turn.capture is not None:
            # Stopping speech that already ended is harmless, as in the app.
            turn.capture.stop()

    def _captureCancel(self, fields: dict[str, Any]) -> None:
        if self._captureTurn(fields) is not None:
            self._cancelTurn(fields["requestId"])

    # For tests

    def sentOfType(self, *types: str, requestId: str | None = None) -> list[dict[str, Any]]:
        """
        What this engine sent of the given types (all, if none given),
        optionally only for one request.
        """
        return [
            m
            for m in self.sent
            if (not types or m["type"] in types)
            and (requestId is None or m.get("requestId") == requestId)
        ]
