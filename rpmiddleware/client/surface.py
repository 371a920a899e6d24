"""
What a message handler may use of the connection its message came on.

Each client message is handled in the module of its concern (turns in
L{rpmiddleware.client.turnmessages}, C{character} and C{configure} in
L{rpmiddleware.client.character}, C{reconnect} in
L{rpmiddleware.client.reconnect}, C{status} and the playbook messages in
their modules, ...), through the endpoint's dispatch table
(L{rpmiddleware.client.endpoint.ClientEndpoint.handlers}).  A handler is
given a L{ClientSurface}, never the concrete
L{rpmiddleware.client.connection.ClientConnection} (the composition of a
connection's parts: its inbox, flow control, capacity notices, turn queue
and resume), so the handlers cannot reach into it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred

from rpmiddleware.client.sessions import ClientConfig, ClientSession
from rpmiddleware.client.settings import Character, ClientSettings
from rpmiddleware.client.turns import Turn
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.core.view import CoreView

if TYPE_CHECKING:
    from rpmiddleware.client.decode import DecodedAudio

#: Opens a turn's reply stream from the request fields the connection made
#: (character, card, output, prompt fields, meta); the handler adds its own.
Opener = Callable[[dict[str, Any]], ReplyStream]
#: Answers a message on the channel it came by (the WebRTC data channel);
#: C{None}: the WebSocket.
Reply = Callable[[dict[str, Any]], Any]


class ClientSurface(Protocol):
    """
    One client connection, as its message handlers see it.
    """

    #: This client's WebRTC link (L{rpmiddleware.webrtc.voice.VoiceLink}),
    #: from its first C{offer}; set by the offer handler.
    voice: Any

    @property
    def peer(self) -> str:
        """The client's address, for logs."""

    @property
    def settings(self) -> ClientSettings:
        """The endpoint's C{[client]} settings."""

    @property
    def middleware(self) -> CoreView:
        """The core's view, whose Python API turns are asked of."""

    @property
    def session(self) -> ClientSession:
        """The client's session (another one after a successful reconnect)."""

    @property
    def current(self) -> Turn | None:
        """The turn playing now, if any."""

    @property
    def queued(self) -> int:
        """How many turns wait behind the one playing."""

    @property
    def closed(self) -> bool:
        """The connection is gone."""

    @property
    def closing(self) -> bool:
        """The connection is being closed (taken over, or too slow)."""

    @property
    def port(self) -> int:
        """The local port the client connected to (for RPEngine's link)."""

    @property
    def congested(self) -> bool:
        """The client does not read what it is sent."""

    def send(self, message: dict[str, Any], audio: bool = False) -> bool:
        """
        Send a message unless the connection is going, or it is audio and
        the client is not reading.
        """

    def error(self, code: str, message: str, retryable: bool = False, **extra: Any) -> None:
        """Send an C{error} message."""

    def reply(self, message: dict[str, Any]) -> None:
        """Answer the message being handled on the channel it came by."""

    def received(self, payload: bytes | str, isBinary: bool, reply: Reply | None = None) -> None:
        """A client message that came other than on the WebSocket, in order."""

    def decode(self, data: str) -> Deferred[DecodedAudio]:
        """Decode a base64 recording (off the reactor thread when it can)."""

    def character(self) -> Character:
        """
        The character the client plays: its own, or the endpoint's default.

        @raise rpmiddleware.client.messages.InvalidMessage: when it has none.
        """

    def submit(
        self,
        kind: str,
        playerText: str | None,
        open: Opener,
        config: ClientConfig | None = None,
        played: Mapping[str, Any] | None = None,
    ) -> None:
        """
        Start a turn now (cancelling the one playing, with barge-in) or
        queue it behind the one playing.  C{played}: the client's report of
        how much of the playing turn's speech it played, for the cancel.

        @raise rpmiddleware.client.messages.InvalidMessage: when the client
            has no character.
        """

    def submitAudio(
        self,
        audio: dict[str, Any],
        config: ClientConfig | None = None,
        played: Mapping[str, Any] | None = None,
    ) -> None:
        """
        Start a turn from a recording in RPEngine's C{event.audio} shape,
        with any pending attachments' alt text as context.
        """

    def dropWaiting(self, reason: str) -> None:
        """Forget the turns waiting behind the one playing, telling the client."""

    def endedTurnPlayed(
        self, played: Mapping[str, Any] | None = None, turnId: str | None = None
    ) -> bool:
        """
        The client's most recent turn completed upstream but the player cut
        its speech off: tell the plugins how much was played (the client's
        C{played}, else the speech track's count), in order with the turns
        (L{rpmiddleware.client.turnqueue.TurnQueue.endedTurnPlayed}).
        """

    def stopTrack(self, reason: str, turnId: str | None = None) -> bool:
        """
        The client's WebRTC speech track still plays its most recent turn,
        which completed upstream (C{turnId}, when given, names it): silence
        it, the plugins told how much it played
        (L{rpmiddleware.client.turnqueue.TurnQueue.stopTrack}); whether it did.
        """

    def resume(self, sessionId: str) -> ClientSession:
        """
        Take over the session C{sessionId} (a C{reconnect}).

        @raise rpmiddleware.client.sessions.SessionLookupError: no such session.
        """


#: Handles one message type: a Deferred while the connection should wait
#: for it before reading the next message; raises
#: L{rpmiddleware.client.messages.InvalidMessage} for a malformed one.
Handler = Callable[[ClientSurface, dict[str, Any]], "Deferred[None] | None"]
