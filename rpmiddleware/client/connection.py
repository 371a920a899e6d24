"""
One client connection's life: its messages in order, its session, its turns.

Independent of Autobahn (L{rpmiddleware.client.protocol} adapts it) so that
the rules are read in one place:

  - messages are handled one at a time, in order; while one waits (audio
    being decoded in a thread) reading from the socket pauses, so a client
    cannot queue unbounded work and a C{cancel} never overtakes its turn;
  - one turn plays at a time: a new one cancels it first (barge-in) or, with
    barge-in off, waits behind it (bounded);
  - a malformed message is answered with INVALID_MESSAGE and nothing else
    happens; the session lives on;
  - when the connection goes, its turn is cancelled upstream and its session
    waits for a reconnect.

What each message means is not here: the endpoint's dispatch table
(L{rpmiddleware.client.endpoint.ClientEndpoint.handlers}) names the handler
of each type, in the module of its concern, and a handler sees this
connection only as a L{rpmiddleware.client.surface.ClientSurface}.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.api import ReplyStream
from rpmiddleware.client import messages as wire
from rpmiddleware.client.attachments import attachmentContext
from rpmiddleware.client.decode import DecodedAudio
from rpmiddleware.client.endpoint import ClientEndpoint, Writer
from rpmiddleware.client.errors import INTERNAL_ERROR, INVALID_MESSAGE, RATE_LIMITED, errorMessage
from rpmiddleware.client.flow import SendGuard
from rpmiddleware.client.messages import InvalidMessage
from rpmiddleware.client.sessions import ClientConfig, ClientSession
from rpmiddleware.client.settings import Character
from rpmiddleware.client.surface import Opener, Reply
from rpmiddleware.client.tts import SpeechOutput
from rpmiddleware.client.turns import AUDIO, Turn

#: WebSocket close codes this endpoint uses.
CLOSE_POLICY = 1008
CLOSE_TAKEN_OVER = 4001

#: Seconds between capacity messages that only move the queue depth.
DEPTH_INTERVAL = 0.25


class ClientConnection:
    """
    Provides L{rpmiddleware.client.surface.ClientSurface} to the handlers.

    @ivar session: the client's session (replaced by a successful reconnect).
    @ivar current: the turn playing now, if any.
    """

    log = Logger()

    def __init__(self, endpoint: ClientEndpoint, writer: Writer, peer: str = "") -> None:
        self.endpoint = endpoint
        self.settings = endpoint.settings
        self.writer = writer
        self.peer = peer
        self.session: ClientSession = endpoint.sessions.create(self)
        self.current: Turn | None = None
        #: This client's WebRTC (L{rpmiddleware.webrtc.voice.VoiceLink}), from its first offer.
        self.voice: Any = None
        self.waiting: deque[Callable[[], None]] = deque()
        self.closed = False
        self.closing = False
        self._inbox: deque[tuple[bytes | str, bool, Reply | None]] = deque()
        self._busy = False
        #: How to answer the message being handled, if not on the WebSocket.
        self._reply: Reply | None = None
        self.guard = SendGuard(
            endpoint.clock,
            writer.backlog,
            self.settings.send_buffer_soft,
            self.settings.send_buffer_hard,
            self.settings.slow_client_grace,
            self._congested,
            self._relieved,
            self._overflowed,
        )
        self._capacitySent: tuple[bool, bool, int, int] | None = None
        self._capacityLater: Any = None
        self._stopCapacity = endpoint.capacity.listen(self._capacityChanged)

    # Life.

    def opened(self) -> None:
        self.log.info(
            "client {peer} connected (session {sessionId})",
            peer=self.peer,
            sessionId=self.session.id,
        )
        self.send(wire.ready(self.session.id, self.settings.ice_servers))
        self._sendCapacity()

    def lost(self) -> None:
        """
        The connection is gone: cancel its work upstream, keep its session.
        """
        if self.closed:
            return
        self.closed = True
        self.guard.stop()
        self._stopCapacity()
        if self._capacityLater is not None and self._capacityLater.active():
            self._capacityLater.cancel()
        self._inbox.clear()
        self.waiting.clear()
        turn, self.current = self.current, None
        if turn is not None and not turn.ended:
            turn.cancel("the client disconnected")
        if self.voice is not None:
            self.voice.close()
        if self.session.owner is self:
            self.endpoint.sessions.detach(self.session)
        self.log.info(
            "client {peer} disconnected (session {sessionId} kept for reconnect)",
            peer=self.peer,
            sessionId=self.session.id,
        )

    def takenOver(self) -> None:
        """
        Another connection resumed this connection's session.
        """
        self.log.info(
            "session {sessionId} was resumed by another connection; closing {peer}",
            sessionId=self.session.id,
            peer=self.peer,
        )
        self.closing = True
        self.waiting.clear()
        turn, self.current = self.current, None
        if turn is not None and not turn.ended:
            turn.cancel("the session was resumed by another connection")
        self.writer.closeConnection(CLOSE_TAKEN_OVER, "session resumed by another connection")

    # Writing.

    def send(self, message: dict[str, Any], audio: bool = False) -> bool:
        """
        Send a message unless the connection is going, or it is audio and
        the client is not reading.
        """
        if self.closed or self.closing:
            return False
        if audio and self.guard.congested:
            return False
        payload = wire.encode(message)
        self.writer.sendText(payload)
        self.guard.wrote(len(payload))
        if self.voice is not None:
            self.voice.mirror(message)
        return True

    def error(self, code: str, message: str, retryable: bool = False, **extra: Any) -> None:
        self.send(errorMessage(code, message, retryable, **extra))

    def reply(self, message: dict[str, Any]) -> None:
        """
        Answer the message being handled on the channel it came by.
        """
        if self._reply is not None:
            self._reply(message)
        else:
            self.send(message)

    def _congested(self) -> None:
        self.log.warn(
            "client {peer} is not reading ({queued} bytes waiting); its audio stops and its "
            "turn is cancelled",
            peer=self.peer,
            queued=self.guard.pending(),
            sessionId=self.session.id,
        )
        if self.current is not None:
            self.current.cancel("the client is not reading its messages fast enough")

    def _relieved(self) -> None:
        self.log.info("client {peer} is reading again", peer=self.peer)

    def _overflowed(self, why: str) -> None:
        self.log.warn(
            "closing slow client {peer}: {why}",
            peer=self.peer,
            why=why,
            sessionId=self.session.id,
        )
        self.closing = True
        if self.current is not None:
            self.current.cancel("the client is not reading its messages")
        self.writer.closeConnection(CLOSE_POLICY, "client too slow: it does not read its messages")

    def _capacityChanged(self) -> None:
        """
        Tell the client.  A move of RPEngine's queue depth alone is sent at
        most every L{DEPTH_INTERVAL} seconds (the latest value always
        arrives): with many clients playing turns every request moves the
        depth, and telling every client of every move was most of what they
        received.  Anything else (engine, accepting, limit) goes at once.
        """
        state = self.endpoint.capacity.state()
        sent = self._capacitySent
        if sent is not None and state[:2] == sent[:2] and state[3] == sent[3]:
            if self._capacityLater is None:
                self._capacityLater = self.endpoint.clock.callLater(
                    DEPTH_INTERVAL, self._sendCapacity
                )
            return
        self._sendCapacity()

    def _sendCapacity(self) -> None:
        later, self._capacityLater = self._capacityLater, None
        if later is not None and later.active():
            later.cancel()
        if self.closed:
            return
        self._capacitySent = self.endpoint.capacity.state()
        self.send(self.endpoint.capacity.message(self.writer.port))

    # Reading.

    def received(self, payload: bytes | str, isBinary: bool, reply: Reply | None = None) -> None:
        """
        A client message, in order with the others whichever way it came.

        @param reply: for a message that came on the WebRTC data channel,
            how to send on that channel: a C{ping} there is answered there
            (an LLMRTC client that pings on its data channel waits for the
            C{pong} on it).
        """
        if self.closed or self.closing:
            return
        self._inbox.append((payload, isBinary, reply))
        self._drain()

    def _drain(self) -> None:
        while self._inbox and not self._busy and not (self.closed or self.closing):
            payload, isBinary, self._reply = self._inbox.popleft()
            try:
                pending = self._handle(payload, isBinary)
            finally:
                self._reply = None
            if pending is not None:
                self._busy = True
                self.writer.pauseReading()
                pending.addBoth(self._resume)

    def _resume(self, result: object) -> None:
        self._busy = False
        if isinstance(result, Failure):
            self.log.failure("handling a message of client {peer} failed", result, peer=self.peer)
            self.error(INTERNAL_ERROR, "the middleware failed while handling a message")
        if not self.closed:
            self.writer.resumeReading()
            self._drain()

    def _handle(self, payload: bytes | str, isBinary: bool) -> Deferred[None] | None:
        kind = "?"
        try:
            message = wire.decodeFrame(payload, isBinary, self.endpoint.extensions)
            kind = message["type"]
            self.log.debug(
                "client {peer} sent {kind} ({size} bytes)",
                peer=self.peer,
                kind=kind,
                size=len(payload),
            )
            return self.endpoint.handlers[kind](self, message)
        except InvalidMessage as e:
            self.log.info("invalid message from client {peer}: {why}", peer=self.peer, why=str(e))
            self.error(INVALID_MESSAGE, str(e))
        except Exception:
            self.log.failure(
                "handling a {kind} message of client {peer} failed", kind=kind, peer=self.peer
            )
            self.error(INTERNAL_ERROR, f"the middleware failed while handling {kind}")
        return None

    # What handlers use (see ClientSurface).

    @property
    def middleware(self) -> Any:
        return self.endpoint.middleware

    @property
    def port(self) -> int:
        return self.writer.port

    @property
    def congested(self) -> bool:
        return self.guard.congested

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def decode(self, data: str) -> Deferred[DecodedAudio]:
        return self.endpoint.decode(data)

    def character(self) -> Character:
        character = self.session.character or self.endpoint.defaultCharacter
        if character is None:
            raise InvalidMessage(
                "send a character message first: this middleware has no default character "
                "(game.default_character)"
            )
        return character

    def resume(self, sessionId: str) -> ClientSession:
        """
        Take over the session C{sessionId}: its previous connection, if any,
        is closed, this connection's turns are dropped and its own session
        forgotten.

        @raise SessionLookupError: no such session (or it expired).
        """
        session, previous = self.endpoint.sessions.resume(sessionId, self)
        if previous is not None and previous is not self:
            previous.takenOver()
        self.dropWaiting("a waiting turn was dropped: the connection resumed another session")
        turn, self.current = self.current, None
        if turn is not None and not turn.ended:
            turn.cancel("the connection resumed another session")
        self.endpoint.sessions.discard(self.session)
        self.session = session
        self.log.info(
            "client {peer} resumed session {sessionId} ({entries} history entries)",
            peer=self.peer,
            sessionId=sessionId,
            entries=len(session.history),
        )
        return session

    # Turns.

    def submit(
        self, kind: str, playerText: str | None, open: Opener, config: ClientConfig | None = None
    ) -> None:
        """
        L{rpmiddleware.client.surface.ClientSurface.submit}, with barge-in or
        queueing as configured.  C{config} is the configuration the turn
        plays with (the session's now when not given).
        """
        character = self.character()
        config = config or self.session.config
        turn = self.current
        if turn is not None and not turn.ended:
            if self.session.config.bargesIn(self.settings):
                self.dropWaiting("a waiting turn was replaced by a newer one (barge-in)")
                self.current = None
                turn.cancel("interrupted by a new turn (barge-in)")
            elif len(self.waiting) >= self.settings.queued_turns:
                self.error(
                    RATE_LIMITED,
                    f"{len(self.waiting)} turns already wait behind the one playing; "
                    "wait for reply-complete or send cancel",
                    retryable=True,
                )
                return
            else:
                self.waiting.append(lambda: self._start(kind, playerText, open, character, config))
                return
        self._start(kind, playerText, open, character, config)

    def submitAudio(self, audio: dict[str, Any], config: ClientConfig | None = None) -> None:
        """
        Start a turn from a recording already in RPEngine's C{event.audio}
        shape (PCM at any rate; the audio-resample plugin converts it), with
        any pending attachments' alt text as context.  The entry point for
        audio that arrives other than in an C{audio} message (a WebRTC
        microphone track).

        @raise InvalidMessage: when the client has no character.
        """
        context = attachmentContext(self)

        def open(request: dict[str, Any]) -> ReplyStream:
            return self.endpoint.middleware.requestReply(text=context, audio=audio, **request)

        self.submit(AUDIO, None, open, config)

    def _start(
        self,
        kind: str,
        playerText: str | None,
        open: Opener,
        character: Character,
        config: ClientConfig,
    ) -> None:
        if self.closed:
            return
        settings = self.settings
        # With a WebRTC speech track negotiated, the reply plays on it.
        track = self.voice.speechOutput() if self.voice and config.wantsAudio() else None
        rate = track.rate if track is not None else config.outputRate(settings)
        request: dict[str, Any] = {
            "characterId": character.characterId,
            "card": character.card,
            "integrationId": character.integrationId,
            "output": config.output(settings),
            "player": config.player,
            "meta": {"client": self.session.id, "outputSampleRate": rate},
            # The turn forwards each chunk as it comes; keeping them all on the
            # stream too would hold a whole reply's audio per client.
            "retainAudio": False,
            "retainText": False,
            **config.promptFields(),
        }
        speech = track or (
            SpeechOutput(rate, config.streams(settings)) if config.wantsAudio() else None
        )
        try:
            stream = open(request)
        except Exception:
            self.log.failure("starting a turn for client {peer} failed", peer=self.peer)
            self.error(INTERNAL_ERROR, "the middleware could not start this turn")
            self._startWaiting()
            return
        turn = Turn(
            kind,
            stream,
            self.send,
            speech,
            self.endpoint.clock,
            settings.accept_timeout,
            self._turnEnded,
            playerText,
            stallTimeout=settings.stall_timeout,
            queue=self.endpoint.middleware.engineQueue,
        )
        self.current = turn
        self.log.info(
            "client {peer} started a {kind} turn {turnId}",
            peer=self.peer,
            kind=kind,
            turnId=turn.id,
            sessionId=self.session.id,
        )
        turn.start()
        if not turn.ended and not self.endpoint.middleware.link.connected:
            self.send(
                self.endpoint.capacity.message(
                    self.writer.port, note="Your turn waits for RPEngine."
                )
            )

    def _turnEnded(self, turn: Turn) -> None:
        details = {"turnId": turn.id, "source": turn.kind}
        self.session.remember("player", turn.transcript or "", **details)
        if turn.replyText:
            self.session.remember("character", turn.replyText, outcome=turn.outcome, **details)
        if self.current is turn:
            self.current = None
            self._startWaiting()

    def _startWaiting(self) -> None:
        if self.waiting and self.current is None and not self.closed:
            self.waiting.popleft()()

    def dropWaiting(self, reason: str) -> None:
        """
        Forget the turns waiting behind the one playing, telling the client
        of each (they have no turnId yet).
        """
        while self.waiting:
            self.waiting.popleft()
            self.send({"type": "tts-cancelled", "reason": reason})
