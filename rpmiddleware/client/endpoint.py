"""
What a client connection is given: its writer (the WebSocket, or a fake in
tests) and the endpoint's shared parts, among them the dispatch table that
says which module handles each client message type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from rpmiddleware.client import messages as wire
from rpmiddleware.client.attachments import handleAttachments
from rpmiddleware.client.capacity import CapacityMonitor
from rpmiddleware.client.character import handleCharacter, handleConfigure
from rpmiddleware.client.reconnect import handleReconnect
from rpmiddleware.client.sessions import SessionStore
from rpmiddleware.client.settings import Character, ClientSettings
from rpmiddleware.client.status import statusHandler
from rpmiddleware.client.surface import ClientSurface, Handler
from rpmiddleware.client.turnmessages import (
    handleAudio,
    handleCancel,
    handleText,
    handleVoiceCapture,
)
from rpmiddleware.core.view import CoreView
from rpmiddleware.plugin.clientext import extensionTypes, fromClient
from rpmiddleware.plugin.interfaces import IClientExtension
from rpmiddleware.protocol import clientfields
from rpmiddleware.protocol.clienterrors import WEBRTC_UNAVAILABLE

if TYPE_CHECKING:
    from rpmiddleware.client.decode import DecodedAudio


class Writer(Protocol):
    """
    What a connection needs of its transport.
    """

    @property
    def port(self) -> int:
        """The local port the client connected to (for RPEngine's link)."""

    def sendText(self, payload: bytes) -> None:
        """Send one UTF-8 JSON text message."""

    def backlog(self) -> int:
        """Bytes written and not yet taken by the peer's socket."""

    def closeConnection(self, code: int, reason: str) -> None: ...

    def pauseReading(self) -> None: ...

    def resumeReading(self) -> None: ...


@dataclass
class ClientEndpoint:
    """
    What every connection of the endpoint shares.

    @ivar decode: decodes a base64 recording, off the reactor thread when it
        can; fails with L{rpmiddleware.protocol.clienterrors.AudioDecodeError}.
    @ivar handlers: the dispatch table, client message type to its handler
        (every type L{rpmiddleware.client.messages.CLIENT_TYPES} names).
    """

    #: The core, as the outer layers see it.
    middleware: CoreView
    settings: ClientSettings
    sessions: SessionStore
    capacity: CapacityMonitor
    clock: IReactorTime
    decode: Callable[[str], Deferred[DecodedAudio]]
    defaultCharacter: Character | None = None
    #: Answers C{offer} messages (WebRTC, when installed); without it they
    #: get WEBRTC_UNAVAILABLE.
    answerOffer: Handler | None = None
    handlers: dict[str, Handler] = field(init=False, repr=False, compare=False)
    #: Client message types the chain's plugins take, to the plugin's name
    #: (L{rpmiddleware.plugin.clientext}); each is handed to the chain as it came.
    extensions: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.handlers = {
            "ping": handlePing,
            "offer": self.offer,
            "reconnect": handleReconnect,
            "audio": handleAudio,
            "attachments": handleAttachments,
            "character": handleCharacter,
            "configure": handleConfigure,
            "text": handleText,
            "cancel": handleCancel,
            "voice-capture": handleVoiceCapture,
            "status": statusHandler(self),
        }
        # What plugins kept for a client session goes when the session does.
        self.sessions.onEnded = self.middleware.clientSessionEnded
        self.extensions = {
            kind: name
            for kind, name in extensionTypes(self.middleware.providers(IClientExtension)).items()
            if kind not in self.handlers
        }
        for kind in self.extensions:
            self.handlers[kind] = handleExtension

    def offer(self, client: ClientSurface, message: dict[str, Any]) -> Deferred[None] | None:
        if self.answerOffer is not None:
            return self.answerOffer(client, message)
        refuseOffer(client, message)
        return None


# The endpoint's own messages.


def handlePing(client: ClientSurface, message: dict[str, Any]) -> None:
    """
    Answered on the channel it came by: an LLMRTC client that pings on its
    WebRTC data channel waits for the C{pong} there.
    """
    client.reply(wire.pong(clientfields.number(message, "timestamp")))


def handleExtension(client: ClientSurface, message: dict[str, Any]) -> None:
    """
    A message of a plugin's own type goes to the chain, in order with the
    client's turns, for the plugin to take.
    """
    envelope = fromClient(client.session.id, message)
    character = client.session.character
    if character is not None and character.integrationId:
        # The integration the client's character named: the memory ops'.
        envelope.meta["integrationId"] = character.integrationId
    client.middleware.submit(envelope)


def refuseOffer(client: ClientSurface, message: dict[str, Any]) -> None:
    client.error(
        WEBRTC_UNAVAILABLE,
        "this server has no WebRTC; send recordings in audio messages over this WebSocket",
    )
