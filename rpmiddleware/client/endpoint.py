"""
What a client connection is given: its writer (the WebSocket, or a fake in
tests) and the endpoint's shared parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from rpmiddleware.client.capacity import CapacityMonitor
from rpmiddleware.client.decode import DecodedAudio
from rpmiddleware.client.sessions import SessionStore
from rpmiddleware.client.settings import Character, ClientSettings

if TYPE_CHECKING:
    from rpmiddleware.client.connection import ClientConnection


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
        can; fails with L{AudioDecodeError}.
    """

    middleware: Any
    settings: ClientSettings
    sessions: SessionStore
    capacity: CapacityMonitor
    clock: IReactorTime
    decode: Callable[[str], Deferred[DecodedAudio]]
    defaultCharacter: Character | None = None
    #: Answers C{offer} messages (WebRTC, when installed); without it they
    #: get WEBRTC_UNAVAILABLE.
    answerOffer: Callable[[ClientConnection, dict[str, Any]], Deferred[None] | None] | None = None
