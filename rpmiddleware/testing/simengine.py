"""
The RPEngine side of protocol v3, without any transport.

L{SimulatedEngine} reads envelopes from the game and writes full envelopes
through a callable, pacing everything with an L{IReactorTime}, so tests drive
it with a list and a L{Clock} and the WebSocket client in
L{rpmiddleware.testing.simulator} drives it with the real reactor.

It behaves as RPEngine's core does (crates/rp-engine-core/src/app.rs,
C{CoreSession}; each method below names the function it follows): the same
acknowledgements, the same errors in the same order, the same
C{capacity.update} at the same moments, the same streams.  What RPEngine's
browser host does around the core -- the microphone, the models -- is
simulated (L{rpmiddleware.testing.capture},
L{rpmiddleware.testing.replystream}).  It keeps logs (what it received,
sent, processed, cancelled) for assertions.
"""

from __future__ import annotations

import base64
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from rpmiddleware.envelope import PROTOCOL, PROTOCOL_VERSION, isoTimestamp
from rpmiddleware.testing.capture import (
    CAPTURE_SAMPLE_RATE,
    CaptureEvents,
    MicrophoneCapture,
    Recording,
)
from rpmiddleware.testing.cardstore import SessionCardStore
from rpmiddleware.testing.envelopecheck import (
    InvalidPayload,
    ackReference,
    checkFields,
    decodeFrame,
)
from rpmiddleware.testing.replystream import PCM_CHUNK_BYTES, ReplyStream, chunked
from rpmiddleware.testing.requestchecks import (
    STT_LANGUAGE_NAMES,
    RequestError,
    checkSpeechOutput,
    pointer,
    recordingSeconds,
    wantsAudio,
)
from rpmiddleware.testing.responsetext import ResponseProcessing
from rpmiddleware.testing.simoptions import PlayerTake, SimulatorOptions, defaultReplyText

#: RPEngine remembers this many messageIds to spot duplicates (app.rs
#: transport_message).
DUPLICATE_WINDOW = 2000
#: The message of the state RPEngine reports when a capture that heard
#: nothing listens again (app.rs stt_completed); the brief quotes it.
LISTENING_AGAIN = "No speech was recognized; listening again."


@dataclass
class _Reply:
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
class _Capture:
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


class SimulatedEngine(CaptureEvents):
    """
    RPEngine's side of one connection at a time.

    Logs (C{sent}, C{receivedMessages}, C{processed}, C{cancelled},
    C{cancellations}, C{completed}, C{duplicates}, C{protocolErrors},
    C{cardTransfers}, C{acksReceived}) span every connection of this
    object, and so does the duplicate window, as RPEngine keeps its seen
    messageIds across reconnects; the session, its card cache and its
    requests end with the connection.

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
        self.receivedMessages: list[Any] = []
        self.processed: Counter[str] = Counter()
        #: Requests cancelled because the game asked.
        self.cancelled: list[str] = []
        #: Every C{reply.cancelled} decided, delivered or not:
        #: (requestId, reason).
        self.cancellations: list[tuple[str, str]] = []
        self.completed: list[str] = []
        self.duplicates: list[str] = []
        self.acksReceived: list[str] = []
        #: Frames refused as C{invalid_payload}, and a welcome that never
        #: came: (messageId or None, why).
        self.protocolErrors: list[tuple[str | None, str]] = []
        self.cardTransfers: list[tuple[str, int]] = []
        self.welcomed: Deferred[SimulatedEngine] = Deferred()
        self.closed: Deferred[None] = Deferred()
        self.sessionId: str | None = None
        self.serverVersion: str | None = None
        self.cards = SessionCardStore(self.cardTransfers)
        self._seen: set[str] = set()
        self._seenOrder: deque[str] = deque()
        self._accepted: set[str] = set()
        self._queue: deque[_Reply] = deque()
        self._active: dict[str, _Reply] = {}
        self._capture: _Capture | None = None
        self._runtimesReady = True
        self._takes: deque[PlayerTake] = deque(self.options.captureTakes or ())
        self._welcomeTimer: IDelayedCall | None = None
        self._handshaking = False
        self._open = False

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
        (src/app-host.ts replyAudioTransport): when it cannot deliver it,
        the request ends with C{audio_transport_failed} and its remaining
        audio and completion are kept back.
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
                message="speech could not be delivered through the mailbox; later requests "
                "get text only",
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

    def receivedFrame(self, payload: bytes | str) -> None:
        """
        Handle one text frame from the game, as RPEngine reads it.
        """
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
        if self._open:
            self.receivedMessages.append(None)
            self._invalidPayload(None, reason)

    def received(self, fields: Any) -> None:
        """
        Handle one decoded message from the game.
        """
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
        while len(self._seenOrder) > DUPLICATE_WINDOW:
            self._seen.discard(self._seenOrder.popleft())
        requestId = fields.get("requestId")
        requestId = requestId if isinstance(requestId, str) else ""
        if kind == "welcome":
            self._welcome(fields)
        elif kind == "ack":
            reference = ackReference(fields)
            if reference is not None:
                self.acksReceived.append(reference)
        elif kind == "character.sync":
            self._characterSync(fields)
        elif kind == "reply.request":
            self._acceptReply(fields)
        elif kind == "voice.capture.start":
            self._acceptCapture(fields)
        elif kind == "voice.capture.stop":
            self._stopCapture(requestId)
        elif kind in ("voice.capture.cancel", "request.cancel"):
            self._cancelRequest(requestId, "requested_by_game")

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

    def _acceptReply(self, fields: dict[str, Any]) -> None:
        """
        app.rs accept_reply.
        """
        requestId: str = fields["requestId"]
        try:
            self._preflight(requestId, voice=False)
            resolvedHash, card = self._resolveCard(fields)
        except RequestError as e:
            self._requestError(requestId, fields["messageId"], e)
            return
        self._accepted.add(requestId)
        self._emit(
            "reply.accepted",
            requestId=requestId,
            eventId=fields.get("eventId"),
            resolvedCardHash=resolvedHash,
            queueDepth=self.queueDepth + 1,
        )
        self._queue.append(_Reply(requestId, fields, card))
        self._publishCapacity()
        self._startNextReply()

    def _startNextReply(self) -> None:
        """
        app.rs start_next_reply: the next queued reply becomes active, or
        fails at once for its language, voice or response processing.
        """
        if len(self._active) >= max(1, self.options.concurrency):
            return
        if not self._queue:
            self._publishCapacity()
            return
        reply = self._queue.popleft()
        fields = reply.fields
        try:
            processing = ResponseProcessing.parse(pointer(fields, "output", "responseProcessing"))
        except ValueError as e:
            processing = None
            failure: RequestError | None = RequestError("invalid_request", str(e))
        else:
            failure = None
        if failure is None:
            try:
                checkSpeechOutput(fields)
            except RequestError as e:
                failure = e
        if failure is not None:
            # RPEngine leaves such a requestId in its accepted set.
            self._requestError(reply.requestId, reply.sourceMessageId, failure)
            self._startNextReply()
            return
        self._active[reply.requestId] = reply
        self.processed[reply.requestId] += 1
        audio = pointer(fields, "event", "audio")
        if isinstance(audio, dict):
            if not self._transcribeRecording(reply, audio, processing):
                return
        else:
            self._beginGeneration(reply, None, processing)
        self._publishCapacity()

    def _transcribeRecording(
        self, reply: _Reply, audio: dict[str, Any], processing: ResponseProcessing | None
    ) -> bool:
        """
        A reply with C{event.audio} is transcribed first (app.rs
        start_next_reply, stt_completed).  C{False} when the model for its
        language is missing: RPEngine then publishes no second capacity
        update.
        """
        language = audio.get("language")
        language = language if isinstance(language, str) else self.options.selectedLanguage
        if language not in self.options.installedSttLanguages:
            name = STT_LANGUAGE_NAMES.get(language, "English")
            self._failActive(
                reply,
                RequestError(
                    "stt_model_not_installed", f"the {name} speech recognition model is missing"
                ),
            )
            return False
        try:
            seconds = recordingSeconds(audio)
        except RequestError as e:
            self._failActive(reply, e)
            return True
        transcript = self.options.audioTranscript
        if transcript is None:
            transcript = f"(simulated transcript of {seconds:.2f} s of audio)"
        reply.timers.append(
            self.clock.callLater(
                self.options.transcriptionSeconds,
                self._recordingTranscribed,
                reply,
                transcript,
                processing,
            )
        )
        return True

    def _recordingTranscribed(
        self, reply: _Reply, transcript: str, processing: ResponseProcessing | None
    ) -> None:
        if self._active.get(reply.requestId) is not reply:
            return
        self._beginGeneration(reply, transcript.strip(), processing)
        self._publishCapacity()

    def _beginGeneration(
        self, reply: _Reply, transcript: str | None, processing: ResponseProcessing | None
    ) -> None:
        """
        app.rs begin_gemma: the model is asked for a reply to the event's
        text and the transcript; with neither, the request fails.
        """
        reply.transcript = transcript
        said = pointer(reply.fields, "event", "text")
        said = said.strip() if isinstance(said, str) else ""
        if not said and not transcript:
            self._failActive(
                reply, RequestError("request_failed", "the request has no text and no speech")
            )
            return
        request = dict(reply.fields)
        if transcript:
            request["transcript"] = transcript
        try:
            text = (self.options.replyText or defaultReplyText)(request)
        except Exception as e:
            # A replyText that raises simulates a failed generation, which
            # RPEngine learns of after the model started.
            error = RequestError("request_failed", f"generation failed: {e}")
            reply.timers.append(self.clock.callLater(0, self._generationFailed, reply, error))
            return
        modalities = pointer(reply.fields, "output", "modalities")
        reply.stream = ReplyStream(
            reply.requestId,
            text,
            wantsAudio(reply.fields),
            self._emit,
            self.clock,
            self.options.pacing(),
            self._replyFinished,
            transcript,
            modalities=modalities if isinstance(modalities, list) else ["text"],
            processing=processing,
            onFailed=lambda stream, code, message: self._generationFailed(
                reply, RequestError(code, message)
            ),
            audioSegment=self._audioSegment if self.sendAudioSegment is not None else None,
        )
        reply.stream.start()

    def _generationFailed(self, reply: _Reply, error: RequestError) -> None:
        if self._active.get(reply.requestId) is reply:
            self._failActive(reply, error)

    def _replyFinished(self, stream: ReplyStream) -> None:
        """
        The rest of app.rs complete_if_ready, after C{reply.completed}.
        """
        reply = self._active.pop(stream.requestId, None)
        if reply is None:
            return
        self._accepted.discard(reply.requestId)
        self.completed.append(reply.requestId)
        self._publishCapacity()
        self._startNextReply()

    def _failActive(self, reply: _Reply, error: RequestError) -> None:
        """
        app.rs fail_active.
        """
        if self._active.pop(reply.requestId, None) is None:
            return
        self._stopReply(reply)
        self._accepted.discard(reply.requestId)
        self._requestError(reply.requestId, reply.sourceMessageId, error)
        self._publishCapacity()
        self._startNextReply()

    @staticmethod
    def _stopReply(reply: _Reply) -> None:
        if reply.stream is not None:
            reply.stream.stop()
        for timer in reply.timers:
            if timer.active():
                timer.cancel()
        reply.timers = []

    # Cancelling (app.rs cancel_request, cancel_all)

    def _cancelled(self, requestId: str, reason: str) -> None:
        self.cancellations.append((requestId, reason))
        if reason == "requested_by_game":
            self.cancelled.append(requestId)
        self._emit("reply.cancelled", requestId=requestId, reason=reason)

    def _cancelRequest(self, requestId: str, reason: str) -> None:
        capture = self._capture
        if capture is not None and capture.requestId == requestId:
            self._dropCapture()
            self._accepted.discard(requestId)
            self._cancelled(requestId, reason)
            self._publishCapacity()
            return
        queued = next((r for r in self._queue if r.requestId == requestId), None)
        if queued is not None:
            self._queue.remove(queued)
            self._accepted.discard(requestId)
            self._cancelled(requestId, reason)
            self._publishCapacity()
            return
        active = self._active.pop(requestId, None)
        if active is not None:
            self._stopReply(active)
            self._accepted.discard(requestId)
            self._cancelled(requestId, reason)
            self._publishCapacity()
            self._startNextReply()
            return
        self.cancellations.append((requestId, "not_active"))
        self._emit("reply.cancelled", requestId=requestId, reason="not_active")

    def _cancelAll(self, reason: str) -> None:
        """
        Cancel everything: queued, then active, then the capture, in that
        order, with no capacity update (app.rs cancel_all).
        """
        ids = [r.requestId for r in self._queue] + list(self._active)
        if self._capture is not None:
            ids.append(self._capture.requestId)
        for reply in self._active.values():
            self._stopReply(reply)
        self._dropCapture()
        self._queue.clear()
        self._active.clear()
        self._accepted.clear()
        for requestId in ids:
            self._cancelled(requestId, reason)

    # The microphone (app.rs accept_capture, stop_capture, capture_*,
    # stt_completed)

    def _nextTake(self) -> PlayerTake:
        if self._takes:
            return self._takes.popleft()
        return PlayerTake(speechSeconds=self.options.captureSpeechSeconds)

    def _acceptCapture(self, fields: dict[str, Any]) -> None:
        """
        app.rs accept_capture: C{reply.accepted} with the depth counting
        the capture, the microphone starts, capacity is published.
        """
        requestId: str = fields["requestId"]
        try:
            self._preflight(requestId, voice=True)
            resolvedHash, card = self._resolveCard(fields)
        except RequestError as e:
            self._requestError(requestId, fields["messageId"], e)
            return
        self._accepted.add(requestId)
        microphone = MicrophoneCapture(
            requestId,
            self.clock,
            self,
            self._nextTake,
            fields.get("silenceBehavior") == "restart",
            self.options.captureLevelInterval,
        )
        self._capture = _Capture(requestId, fields, card, microphone)
        self._emit(
            "reply.accepted",
            requestId=requestId,
            eventId=fields.get("eventId"),
            resolvedCardHash=resolvedHash,
            queueDepth=self.queueDepth,
        )
        microphone.start()
        self._publishCapacity()

    def _dropCapture(self) -> None:
        capture, self._capture = self._capture, None
        if capture is None:
            return
        capture.microphone.cancel()
        if capture.timer is not None and capture.timer.active():
            capture.timer.cancel()

    def _currentCapture(self, microphone: MicrophoneCapture) -> _Capture | None:
        capture = self._capture
        return capture if capture is not None and capture.microphone is microphone else None

    def _stopCapture(self, requestId: str) -> None:
        """
        app.rs stop_capture: only a capture that is still capturing stops;
        anything else is ignored.
        """
        capture = self._capture
        if capture is None or capture.requestId != requestId or capture.phase != "capturing":
            return
        capture.phase = "stopping"
        capture.microphone.stop()

    def captureState(
        self,
        capture: MicrophoneCapture,
        state: str,
        seconds: float,
        autoEndEnabled: bool,
        message: str | None,
    ) -> None:
        """
        app.rs capture_state: passed on; C{speech_ended} stops the capture.
        """
        if self._capture is None:
            return
        self._emit(
            "voice.capture.state",
            requestId=capture.requestId,
            state=state,
            seconds=seconds,
            autoEndEnabled=autoEndEnabled,
            message=message,
        )
        if state == "speech_ended":
            self._stopCapture(capture.requestId)

    def captureLevel(
        self, capture: MicrophoneCapture, seconds: float, peak: float, rms: float
    ) -> None:
        """
        app.rs capture_level.
        """
        if self._capture is not None:
            self._emit(
                "voice.capture.level",
                requestId=capture.requestId,
                seconds=seconds,
                peak=peak,
                rms=rms,
            )

    def captureFailed(self, capture: MicrophoneCapture, message: str) -> None:
        """
        app.rs capture_failed: the capture ends with C{request_failed}.
        """
        current = self._currentCapture(capture)
        source = str(current.fields.get("messageId", "")) if current is not None else ""
        if current is not None:
            self._dropCapture()
        self._accepted.discard(capture.requestId)
        self._requestError(capture.requestId, source, RequestError("request_failed", message))
        self._publishCapacity()

    def captureCompleted(
        self, capture: MicrophoneCapture, recording: Recording, take: PlayerTake
    ) -> None:
        """
        app.rs capture_completed: the recording goes to speech recognition,
        echoed first to RPEngine's own mock game when it asks for it.
        """
        current = self._currentCapture(capture)
        if current is None:
            return
        if current.fields.get("integrationId") == "mock-game" and (
            pointer(current.fields, "debug", "echoCapturedAudio") is True
        ):
            self._echoRecording(current.requestId, recording)
        current.phase = "transcribing"
        transcript = take.transcript
        if transcript is None:
            transcript = f"(simulated transcript of {recording.speechSeconds:.2f} s of speech)"
        current.timer = self.clock.callLater(
            self.options.transcriptionSeconds, self._captureTranscribed, current, transcript
        )

    def _echoRecording(self, requestId: str, recording: Recording) -> None:
        """
        app.rs capture_completed: the recording as PCM16 in 32 KiB chunks.
        """
        pcm = recording.pcm()
        parts = chunked(pcm, PCM_CHUNK_BYTES)
        self._emit(
            "voice.capture.audio.start",
            requestId=requestId,
            format="pcm_s16le",
            sampleRate=CAPTURE_SAMPLE_RATE,
            channels=1,
        )
        for sequence, part in enumerate(parts):
            self._emit(
                "voice.capture.audio.chunk",
                requestId=requestId,
                sequence=sequence,
                data=base64.b64encode(part).decode("ascii"),
            )
        self._emit(
            "voice.capture.audio.completed",
            requestId=requestId,
            chunkCount=len(parts),
            totalBytes=len(pcm),
            durationSeconds=len(pcm) / 2 / CAPTURE_SAMPLE_RATE,
        )

    def _captureTranscribed(self, capture: _Capture, text: str) -> None:
        """
        app.rs stt_completed for a capture: listen again, report the
        transcript, fail with C{empty_speech}, or queue the reply.
        """
        if self._capture is not capture:
            return
        text = text.strip()
        self._capture = None
        requestId = capture.requestId
        if not text and capture.fields.get("silenceBehavior") == "restart":
            capture.phase = "capturing"
            capture.timer = None
            self._capture = capture
            self._emit(
                "voice.capture.state",
                requestId=requestId,
                state="listening",
                seconds=0,
                autoEndEnabled=True,
                message=LISTENING_AGAIN,
            )
            capture.microphone.start()
            self._publishCapacity()
            return
        if capture.fields.get("returnTranscript") is True:
            self._emit(
                "voice.capture.transcript",
                requestId=requestId,
                text=text,
                language=self.options.selectedLanguage,
                elapsedMs=round(self.options.transcriptionSeconds * 1000.0, 3),
            )
        if not text:
            self._accepted.discard(requestId)
            self._requestError(
                requestId,
                str(capture.fields.get("messageId", "")),
                RequestError("empty_speech", "no speech was recognised in the recording"),
            )
        else:
            fields = dict(capture.fields, type="reply.request", event={"text": text})
            self._queue.append(_Reply(requestId, fields, capture.card))
            self._startNextReply()
        self._publishCapacity()

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
