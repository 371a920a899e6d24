"""
The simulated RPEngine's session core, without any transport: the
connection's life (hello, welcome and its timeout, going away), writing
envelopes, reading and acknowledging the game's (duplicates, invalid
payloads), capacity, character cards, and the checks every request passes
first (app.rs transport_opened, transport_message, publish_capacity,
character_sync, preflight).

L{rpmiddleware.testing.simreplies} and L{rpmiddleware.testing.simcapture}
add replies and the microphone on top;
L{rpmiddleware.testing.simengine.SimulatedEngine} is the whole engine.
"""

from __future__ import annotations

import uuid
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from rpmiddleware.protocol.envelope import PROTOCOL, PROTOCOL_VERSION, isoTimestamp
from rpmiddleware.protocol.messages import ENGINE_DEDUP_WINDOW
from rpmiddleware.protocol.prompt import AssembledPrompt
from rpmiddleware.testing.cardstore import SessionCardStore
from rpmiddleware.testing.envelopecheck import (
    InvalidPayload,
    ackReference,
    checkFields,
    decodeFrame,
)
from rpmiddleware.testing.requestchecks import RequestError
from rpmiddleware.testing.simoptions import PlayerTake, SimulatorOptions
from rpmiddleware.testing.simrequests import SimCapture, SimReply

#: The message RPEngine's host sends with audio_transport_failed; the game
#: sees it verbatim (src/app-host.ts execute, replyAudioTransport).
AUDIO_TRANSPORT_FAILED_MESSAGE = (
    "Audio delivery is unavailable for this game process; later requests are text-only."
)

_log = Logger(namespace="rpmiddleware.testing.simcore")


class EngineCore:
    """
    The session core of L{rpmiddleware.testing.simengine.SimulatedEngine},
    which documents the logs and Deferreds kept here.  Messages about
    requests go to C{_request}, and cancelling every request to
    C{_cancelAll}, both the engine's.
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
        #: Set by a transport that takes speech a phrase at a time (RPEngine's
        #: file mailbox): called with each phrase instead of sending
        #: C{reply.audio.start} and chunks; C{False} means it could not be
        #: delivered (src/app-host.ts replyAudioTransport).
        self.sendAudioSegment: Callable[[dict[str, Any]], object] | None = None
        self._audioFailed: set[str] = set()
        #: The object carrying this engine's messages, if any (for tests
        #: that inspect the real connection).
        self.carrier: object | None = None
        self.sent: list[dict[str, Any]] = []
        #: Each model invocation, as RPEngine assembles it (its system prompt,
        #: the chat messages before the event, the event text): requests
        #: share nothing, as RPEngine's never do.
        self.invocations: list[AssembledPrompt] = []
        #: Request id to the sentences its speech was synthesised from.
        self.spoken: dict[str, list[str]] = {}
        self.receivedMessages: list[Any] = []
        self.processed: Counter[str] = Counter()
        #: Requests cancelled because the game asked.
        self.cancelled: list[str] = []
        #: Every C{reply.cancelled} decided, delivered or not:
        #: (requestId, reason).
        self.cancellations: list[tuple[str, str]] = []
        self.completed: list[str] = []
        #: With C{speech="words"}: what each completed reply spoke, by its
        #: request id (L{rpmiddleware.testing.simspeech.KnownSpeech} per
        #: segment), so a test checks speech marks against the truth.
        self.knownSpeech: dict[str, list[Any]] = {}
        self.duplicates: list[str] = []
        self.acksReceived: list[str] = []
        #: Frames refused as C{invalid_payload}, and a welcome that never
        #: came: (messageId or None, why).
        self.protocolErrors: list[tuple[str | None, str]] = []
        self.cardTransfers: list[tuple[str, int]] = []
        self.welcomed: Deferred[Any] = Deferred()
        self.closed: Deferred[None] = Deferred()
        self.sessionId: str | None = None
        self.serverVersion: str | None = None
        self.cards = SessionCardStore(self.cardTransfers)
        self._seen: set[str] = set()
        self._seenOrder: deque[str] = deque()
        self._accepted: set[str] = set()
        self._queue: deque[SimReply] = deque()
        self._active: dict[str, SimReply] = {}
        self._capture: SimCapture | None = None
        self._runtimesReady = True
        self._takes: deque[PlayerTake] = deque(self.options.captureTakes or ())
        self._welcomeTimer: IDelayedCall | None = None
        self._handshaking = False
        self._open = False
        #: The game's messages waiting for the one being handled (L{_dispatch}).
        self._inbox: deque[Callable[[], None]] = deque()
        self._draining = False

    # Connection life

    def connected(self) -> None:
        """
        The WebSocket is open: say C{hello} with no session and wait five
        seconds for C{welcome} (app.rs transport_opened).
        """
        self._closeSession()
        if self.welcomed.called:
            self.welcomed = Deferred()
        if self.closed.called:
            self.closed = Deferred()
        self._open = True
        self._handshaking = True
        self._emit("hello", clientVersion=self.options.clientVersion)
        if self.options.welcomeTimeout is not None:
            self._welcomeTimer = self.clock.callLater(
                self.options.welcomeTimeout, self._welcomeTimedOut
            )

    def disconnect(self) -> None:
        """
        Go away abruptly (the browser tab was killed), mid-turn or not.
        """
        if self.transportDisconnect is not None:
            self.transportDisconnect()
        else:
            self.disconnected()

    def stopService(self) -> None:
        """
        The player stops RPEngine (or closes its tab): every request is
        cancelled with C{service_stopped}, then the connection is closed
        (app.rs stop_service).
        """
        self._cancelAll("service_stopped")
        self._stopWelcomeTimer()
        self.disconnect()

    def disconnected(self) -> None:
        """
        The connection is gone: the session ends, the card cache is
        cleared and every request is cancelled with C{connection_lost},
        which cannot be delivered (app.rs transport_closed).
        """
        self._closeSession()
        if not self.closed.called:
            self.closed.callback(None)

    def _closeSession(self) -> None:
        """
        The connection is closed: no session, no cards, and every request
        cancelled with C{connection_lost}, undeliverable (app.rs
        transport_closed).
        """
        self._open = False
        self._stopWelcomeTimer()
        self._handshaking = False
        self.sessionId = None
        self.cards.clear()
        self._cancelAll("connection_lost")

    def _stopWelcomeTimer(self) -> None:
        if self._welcomeTimer is not None and self._welcomeTimer.active():
            self._welcomeTimer.cancel()
        self._welcomeTimer = None

    def _welcomeTimedOut(self) -> None:
        """
        No welcome within five seconds: RPEngine drops the connection
        (app.rs timer_fired "welcome").
        """
        self._welcomeTimer = None
        if not self._handshaking:
            return
        self.protocolErrors.append((None, "no welcome within the handshake timeout"))
        self.disconnect()

    # Writing (app.rs send; src/protocol.ts clientEnvelope)

    def _emit(self, type: str, **fields: Any) -> dict[str, Any]:
        envelope: dict[str, Any] = {
            "protocol": PROTOCOL,
            "protocolVersion": PROTOCOL_VERSION,
            "type": type,
            "messageId": str(uuid.uuid4()),
            "sessionId": self.sessionId,
            "timestamp": isoTimestamp(),
        }
        envelope.update(fields)
        requestId = fields.get("requestId")
        if requestId in self._audioFailed and type in ("reply.audio.completed", "reply.completed"):
            # RPEngine's host keeps these back once a phrase could not be
            # delivered: the request ended with audio_transport_failed.
            if type == "reply.completed":
                self._audioFailed.discard(requestId)
            return envelope
        if self._open:
            self.sent.append(envelope)
            self._send(envelope)
        return envelope

    def _audioSegment(self, segment: dict[str, Any]) -> None:
        """
        One synthesised phrase for a transport that takes whole phrases
        (src/app-host.ts C{execute}, C{replyAudioTransport}): when it cannot
        deliver it, the host itself sends C{request.error
        audio_transport_failed} (requestId, code, message, retryable false;
        no C{sourceMessageId}), once per phrase refused, and keeps back that
        request's C{reply.audio.completed} and C{reply.completed} (see
        L{_emit}).  Only a transport that refuses at once counts: RPEngine's
        socket adapter never refuses, and a mailbox write that fails later
        is only reported to the player.
        """
        assert self.sendAudioSegment is not None
        segment["sessionId"] = self.sessionId
        if self.sendAudioSegment(segment) is False:
            requestId = segment["requestId"]
            self._audioFailed.add(requestId)
            self._emit(
                "request.error",
                requestId=requestId,
                code="audio_transport_failed",
                message=AUDIO_TRANSPORT_FAILED_MESSAGE,
                retryable=False,
            )

    def _requestError(
        self, requestId: str | None, sourceMessageId: str, error: RequestError
    ) -> None:
        """
        app.rs request_error_code: always all five fields.
        """
        self._emit(
            "request.error",
            requestId=requestId,
            sourceMessageId=sourceMessageId,
            code=error.code,
            message=error.message,
            retryable=error.retryable,
        )

    def _publishCapacity(self) -> None:
        """
        app.rs publish_capacity: sent wherever RPEngine calls it, repeats
        and all.
        """
        depth = self.queueDepth
        self._emit(
            "capacity.update",
            queueDepth=depth,
            queueLimit=self.options.queueLimit,
            acceptingRequests=self.ready and depth < self.options.queueLimit,
        )

    # Reading (app.rs transport_message)

    def _dispatch(self, handle: Callable[[], None]) -> None:
        """
        Handle the game's messages one at a time, each to the end --
        everything it causes sent -- before the next is looked at, as
        RPEngine's host does: the socket adapter hands each frame to
        C{AppHost.dispatch}, which queues it, and C{drain} runs the queue
        with a guard against re-entry (src/socket-adapter.ts C{onmessage};
        src/app-host.ts C{dispatch}, C{drain}).  A game that answers from
        inside the send callable, before the message it answers has been
        fully handled, is therefore heard after it, not in the middle of
        it.  As in the host, a message that raises leaves the rest queued
        for the next one.
        """
        self._inbox.append(handle)
        if self._draining:
            _log.debug("Game message queued behind the one being handled", waiting=len(self._inbox))
            return
        self._draining = True
        try:
            while self._inbox:
                self._inbox.popleft()()
        finally:
            self._draining = False

    def receivedFrame(self, payload: bytes | str) -> None:
        """
        Handle one text frame from the game, as RPEngine reads it (in turn,
        L{_dispatch}).
        """
        self._dispatch(lambda: self._frame(payload))

    def _frame(self, payload: bytes | str) -> None:
        if not self._open:
            return
        try:
            fields = decodeFrame(payload)
        except InvalidPayload as e:
            self.receivedMessages.append(None)
            self._invalidPayload(None, str(e))
            return
        self.receivedMessages.append(fields)
        self._transportMessage(fields)

    def undecodable(self, reason: str) -> None:
        """
        A frame that is not JSON text at all (a binary frame, bad UTF-8).
        """
        self._dispatch(lambda: self._undecodable(reason))

    def _undecodable(self, reason: str) -> None:
        if self._open:
            self.receivedMessages.append(None)
            self._invalidPayload(None, reason)

    def received(self, fields: Any) -> None:
        """
        Handle one decoded message from the game (in turn, L{_dispatch}).
        """
        self._dispatch(lambda: self._decoded(fields))

    def _decoded(self, fields: Any) -> None:
        if not self._open:
            return
        self.receivedMessages.append(fields)
        try:
            checkFields(fields)
        except InvalidPayload as e:
            messageId = fields.get("messageId") if isinstance(fields, dict) else None
            self._invalidPayload(messageId if isinstance(messageId, str) else None, str(e))
            return
        self._transportMessage(fields)

    def _invalidPayload(self, messageId: str | None, reason: str) -> None:
        self.protocolErrors.append((messageId, reason))
        self._emit("request.error", code="invalid_payload", message=reason)

    def _transportMessage(self, fields: dict[str, Any]) -> None:
        messageId: str = fields["messageId"]
        kind: str = fields["type"]
        duplicate = messageId in self._seen
        if kind != "ack":
            if duplicate:
                self._emit("ack", acknowledgedMessageId=messageId, duplicate=True)
            else:
                self._emit("ack", acknowledgedMessageId=messageId)
        if duplicate:
            self.duplicates.append(messageId)
            return
        self._seen.add(messageId)
        self._seenOrder.append(messageId)
        while len(self._seenOrder) > ENGINE_DEDUP_WINDOW:
            self._seen.discard(self._seenOrder.popleft())
        if kind == "welcome":
            self._welcome(fields)
        elif kind == "ack":
            reference = ackReference(fields)
            if reference is not None:
                self.acksReceived.append(reference)
        elif kind == "character.sync":
            self._characterSync(fields)
        else:
            requestId = fields.get("requestId")
            self._request(kind, requestId if isinstance(requestId, str) else "", fields)

    def _request(self, kind: str, requestId: str, fields: dict[str, Any]) -> None:
        """
        A message about a request (reply, capture, cancel): the engine's.
        """
        raise NotImplementedError

    def _cancelAll(self, reason: str) -> None:
        """
        Cancel every request (app.rs cancel_all): the engine's.
        """
        raise NotImplementedError

    def _welcome(self, fields: dict[str, Any]) -> None:
        """
        Adopt the game's sessionId (after the ack, which therefore carried
        none), start a fresh card cache, publish capacity (app.rs
        transport_message, "welcome").
        """
        sessionId = fields.get("sessionId")
        self.sessionId = sessionId if isinstance(sessionId, str) else None
        serverVersion = fields.get("serverVersion")
        self.serverVersion = serverVersion if isinstance(serverVersion, str) else None
        self._handshaking = False
        self.cards.clear()
        self._stopWelcomeTimer()
        self._publishCapacity()
        if not self.welcomed.called:
            self.welcomed.callback(self)

    # Capacity

    @property
    def ready(self) -> bool:
        """
        RPEngine's service is started and its models are loaded (app.rs
        ready).
        """
        return self.options.serviceStarted and self._runtimesReady

    @property
    def queueDepth(self) -> int:
        """
        Queued, active and capturing requests (app.rs queue_depth).
        """
        return len(self._queue) + len(self._active) + (self._capture is not None)

    def setAccepting(self, accepting: bool) -> None:
        """
        Load or unload the simulated models: while unloaded, capacity says
        C{acceptingRequests: false} and requests are refused with
        C{service_not_started}.  Always announced.
        """
        self._runtimesReady = accepting
        self._publishCapacity()

    # Characters (app.rs character_sync, resolve_card)

    def _resolveCard(self, fields: dict[str, Any]) -> tuple[str, Any]:
        if "card" not in fields:
            raise RequestError("card_resync_required", "the request carries no card transfer")
        return self.cards.resolve(
            fields["card"], str(fields.get("integrationId", "")), str(fields.get("characterId", ""))
        )

    def _characterSync(self, fields: dict[str, Any]) -> None:
        try:
            targetHash, _ = self._resolveCard(fields)
        except RequestError as e:
            self._requestError(None, fields["messageId"], e)
            return
        self._emit(
            "character.synced",
            sourceMessageId=fields["messageId"],
            integrationId=fields["integrationId"],
            characterId=fields["characterId"],
            targetHash=targetHash,
        )

    # Requests

    def _preflight(self, requestId: str, voice: bool) -> None:
        """
        app.rs preflight, in its order.
        """
        if requestId in self._accepted:
            raise RequestError("duplicate_request", f"request {requestId!r} is already active")
        if not self.ready:
            raise RequestError("service_not_started", "RPEngine has not been started")
        if self.queueDepth >= self.options.queueLimit:
            raise RequestError(
                "capacity_exceeded", f"the queue is full ({self.options.queueLimit} requests)"
            )
        if voice and not self.options.microphoneEnabled:
            raise RequestError(
                "microphone_not_enabled", "the player has not enabled the microphone"
            )
        if voice and self._capture is not None:
            raise RequestError("voice_capture_active", "another voice capture is in progress")

    def _admit(self, fields: dict[str, Any], voice: bool) -> tuple[str, Any] | None:
        """
        A request passes L{_preflight} and its card resolves, and it is
        accepted: its resolved card hash and card; else it is refused with
        its C{request.error} and C{None} (app.rs accept_reply, accept_capture).
        """
        requestId: str = fields["requestId"]
        try:
            self._preflight(requestId, voice)
            resolved = self._resolveCard(fields)
        except RequestError as e:
            self._requestError(requestId, fields["messageId"], e)
            return None
        self._accepted.add(requestId)
        return resolved

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
