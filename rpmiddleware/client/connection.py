"""
One client connection: the thin composition of its parts, each with one job.

Independent of Autobahn (L{rpmiddleware.client.websocket} adapts it):

  - L{rpmiddleware.client.inbox}: its messages, handled one at a time in
    order; reading pauses while one is waited for;
  - L{rpmiddleware.client.flow}: a client that stops reading loses its audio
    and its turn, then its connection (the reactions are here);
  - L{rpmiddleware.client.capacity}: RPEngine's capacity, the moves of its
    queue depth alone at a bounded rate;
  - L{rpmiddleware.client.turnqueue}: one turn plays at a time: a new one
    cancels it (barge-in) or waits behind it (bounded);
  - L{rpmiddleware.client.resume}: taking over a session after a reconnect.

Here: the connection's life (a malformed message is answered with
INVALID_MESSAGE and nothing else happens, the session lives on; when the
connection goes, its turn is cancelled upstream and its session waits for a
reconnect), and what it sends.

What each message means is not here: the endpoint's dispatch table
(L{rpmiddleware.client.endpoint.ClientEndpoint.handlers}) names the handler
of each type, in the module of its concern, and a handler sees this
connection only as a L{rpmiddleware.client.surface.ClientSurface}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.client import messages as wire
from rpmiddleware.client.capacity import DEPTH_INTERVAL, CapacityNotices
from rpmiddleware.client.endpoint import ClientEndpoint, Writer
from rpmiddleware.client.flow import SendGuard
from rpmiddleware.client.inbox import Inbox
from rpmiddleware.client.resume import resumeSession
from rpmiddleware.client.sessions import ClientConfig, ClientSession
from rpmiddleware.client.settings import Character
from rpmiddleware.client.surface import Opener, Reply
from rpmiddleware.client.turnqueue import TurnQueue
from rpmiddleware.client.turns import Turn
from rpmiddleware.core.view import CoreView
from rpmiddleware.protocol.clienterrors import (
    INTERNAL_ERROR,
    INVALID_MESSAGE,
    InvalidMessage,
    errorMessage,
)

if TYPE_CHECKING:
    from rpmiddleware.client.decode import DecodedAudio

__all__ = ["CLOSE_POLICY", "CLOSE_TAKEN_OVER", "DEPTH_INTERVAL", "ClientConnection"]

#: WebSocket close codes this endpoint uses.
CLOSE_POLICY = 1008
CLOSE_TAKEN_OVER = 4001


class ClientConnection:
    """
    Provides L{rpmiddleware.client.surface.ClientSurface} to the handlers.

    @ivar session: the client's session (replaced by a successful reconnect).
    @ivar turns: its turns, the one playing and those waiting.
    """

    log = Logger()

    def __init__(self, endpoint: ClientEndpoint, writer: Writer, peer: str = "") -> None:
        self.endpoint = endpoint
        self.settings = endpoint.settings
        self.writer = writer
        self.peer = peer
        self.session: ClientSession = endpoint.sessions.create(self)
        #: This client's WebRTC (L{rpmiddleware.webrtc.voice.VoiceLink}), from its first offer.
        self.voice: Any = None
        self.closed = False
        self.closing = False
        self.inbox = Inbox(self._handle, self._failed, self, writer)
        self.turns = TurnQueue(self, endpoint.clock, endpoint.capacity)
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
        self.capacity = CapacityNotices(
            endpoint.capacity,
            endpoint.clock,
            self.send,
            lambda: self.writer.port,
            lambda: self.closed,
        )

    # Life.

    def opened(self) -> None:
        self.log.info(
            "client {peer} connected (session {sessionId})",
            peer=self.peer,
            sessionId=self.session.id,
        )
        self.send(wire.ready(self.session.id, self.settings.ice_servers))
        self.capacity.send()

    def lost(self) -> None:
        """
        The connection is gone: cancel its work upstream, keep its session.
        """
        if self.closed:
            return
        self.closed = True
        self.guard.stop()
        self.capacity.stop()
        self.inbox.clear()
        self.turns.stop("the client disconnected")
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
        self.turns.stop("the session was resumed by another connection")
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
        channel = self.inbox.channel
        if channel is not None:
            channel(message)
        else:
            self.send(message)

    # Flow control's reactions (L{SendGuard} decides when).

    def _congested(self) -> None:
        self.log.warn(
            "client {peer} is not reading ({queued} bytes waiting); its audio stops and its "
            "turn is cancelled",
            peer=self.peer,
            queued=self.guard.pending(),
            sessionId=self.session.id,
        )
        self.turns.cancelCurrent("the client is not reading its messages fast enough")

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
        self.turns.cancelCurrent("the client is not reading its messages")
        self.writer.closeConnection(CLOSE_POLICY, "client too slow: it does not read its messages")

    # Reading (L{Inbox} keeps the order).

    def received(self, payload: bytes | str, isBinary: bool, reply: Reply | None = None) -> None:
        """
        A client message, in order with the others whichever way it came
        (see L{Inbox.received}).
        """
        self.inbox.received(payload, isBinary, reply)

    def _failed(self, failure: Failure) -> None:
        self.log.failure("handling a message of client {peer} failed", failure, peer=self.peer)
        self.error(INTERNAL_ERROR, "the middleware failed while handling a message")

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
    def middleware(self) -> CoreView:
        return self.endpoint.middleware

    @property
    def port(self) -> int:
        return self.writer.port

    @property
    def congested(self) -> bool:
        return self.guard.congested

    @property
    def current(self) -> Turn | None:
        return self.turns.current

    @property
    def queued(self) -> int:
        return len(self.turns.waiting)

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
        Take over the session C{sessionId} (see L{resumeSession}).

        @raise SessionLookupError: no such session (or it expired).
        """
        self.session = resumeSession(self.endpoint.sessions, sessionId, self, self.turns)
        return self.session

    def submit(
        self,
        kind: str,
        playerText: str | None,
        open: Opener,
        config: ClientConfig | None = None,
        played: Mapping[str, Any] | None = None,
    ) -> None:
        self.turns.submit(kind, playerText, open, config, played)

    def submitAudio(
        self,
        audio: dict[str, Any],
        config: ClientConfig | None = None,
        played: Mapping[str, Any] | None = None,
    ) -> None:
        self.turns.submitAudio(audio, config, played)

    def dropWaiting(self, reason: str) -> None:
        self.turns.dropWaiting(reason)

    def endedTurnPlayed(
        self, played: Mapping[str, Any] | None = None, turnId: str | None = None
    ) -> bool:
        return self.turns.endedTurnPlayed(played, turnId)

    def stopTrack(self, reason: str, turnId: str | None = None) -> bool:
        return self.turns.stopTrack(reason, turnId)
