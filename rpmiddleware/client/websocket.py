"""
The WebSocket face of the client endpoint, C{/client/socket}.

The guarded server classes bring the origin rules (no Origin header: a native
program, accepted; browser origins only from C{server.client_origins}), the
8 MiB limit, the connection limit and TCP_NODELAY; a connection's life is
L{rpmiddleware.client.connection}, and what each message means is in the
module the endpoint's dispatch table names (L{rpmiddleware.client.endpoint}).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from rpmiddleware.client.capacity import CapacityMonitor
from rpmiddleware.client.clientext import installBridge
from rpmiddleware.client.connection import ClientConnection
from rpmiddleware.client.endpoint import ClientEndpoint
from rpmiddleware.client.flow import checkBacklogReadable, transportBacklog
from rpmiddleware.client.sessions import SessionStore
from rpmiddleware.client.settings import Character, ClientSettings, loadDefaultCharacter
from rpmiddleware.client.turns import VOICE
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.view import CoreView
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.web.websocket import GuardedServerFactory, GuardedServerProtocol
from rpmiddleware.webrtc.endpoint import WebRTCEndpoint

if TYPE_CHECKING:
    from rpmiddleware.client.decode import DecodedAudio

#: RPEngine's microphone reports, which may come without a requestId.
CAPTURE_REPORTS = frozenset({"voice.capture.state", "voice.capture.level"})


def _decodeAudio(data: str) -> DecodedAudio:
    """
    L{rpmiddleware.client.decode.decodeAudio}, imported at the first
    recording (in the decoding thread, so the reactor does not wait for it):
    it needs numpy, which an idle daemon does without.
    """
    from rpmiddleware.client.decode import decodeAudio

    return decodeAudio(data)


class ClientProtocol(GuardedServerProtocol):
    """
    One client's WebSocket, and the L{Writer} its L{ClientConnection} uses.
    """

    factory: ClientFactory
    connection: ClientConnection | None = None

    def onOpen(self) -> None:
        super().onOpen()
        self.connection = ClientConnection(self.factory.endpoint, self, str(self.peer))
        self.connection.opened()

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if self.connection is None:
            return
        if isBinary:
            self.connection.received(payload, True)
            return
        text = self.textOf(payload)
        if text is not None:
            self.connection.received(text, False)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        super().onClose(wasClean, code, reason)
        # Autobahn leaves its close-handshake timer running when the
        # connection is lost first (a slow client we closed, then dropped).
        timer = getattr(self, "closeHandshakeTimeoutCall", None)
        if timer is not None:
            self.closeHandshakeTimeoutCall = None
            timer.cancel()
        if self.connection is not None:
            self.connection.lost()

    # Writer.

    @property
    def port(self) -> int:
        host: Any = self.transport.getHost() if self.transport is not None else None
        return int(getattr(host, "port", 0) or self.factory.settings.server.port)

    def sendText(self, payload: bytes) -> None:
        if self.state == self.STATE_OPEN:
            self.sendMessage(payload, isBinary=False)

    def backlog(self) -> int:
        return transportBacklog(self.transport)

    def closeConnection(self, code: int, reason: str) -> None:
        self.closeWith(code, reason)

    def pauseReading(self) -> None:
        if self.transport is not None:
            self.transport.pauseProducing()  # type: ignore[attr-defined]

    def resumeReading(self) -> None:
        if self.transport is not None and self.state == self.STATE_OPEN:
            self.transport.resumeProducing()  # type: ignore[attr-defined]


class ClientFactory(GuardedServerFactory):
    """
    The client endpoint: its settings, sessions and capacity monitor.

    @raise rpmiddleware.config.settings.ConfigError: when the default character or
        the C{[client]} settings are unusable (at start-up, not at a turn).
    """

    protocol = ClientProtocol  # type: ignore[assignment]
    log = Logger()

    def __init__(
        self,
        reactor: Any,
        middleware: CoreView,
        settings: Settings,
        clientSettings: ClientSettings | None = None,
    ) -> None:
        server = settings.server
        super().__init__(
            reactor,
            allowedOrigins=server.client_origins,
            allowMissingOrigin=True,
            maxMessageBytes=server.max_message_bytes,
            connectionLimit=server.max_connections,
            endpointName="/client/socket",
        )
        self.reactor = reactor
        self.settings = settings
        self.middleware = middleware
        # A Twisted whose TCP transports hide their backlog is said at start-up.
        checkBacklogReadable(reactor)
        clientSettings = clientSettings or settings.client
        character = loadDefaultCharacter(settings)
        if character is not None:
            # The Python API may name it too.
            middleware.registerCharacter(
                character.characterId, character.card, character.integrationId
            )
            # The registered copy is owned: its hash is found by identity.
            character = replace(
                character,
                card=middleware.character(character.characterId, character.integrationId),
            )
            self.log.info(
                "default character {characterId} loaded from {path}",
                characterId=character.characterId,
                path=settings.game.default_character,
            )
        self.endpoint = ClientEndpoint(
            middleware=middleware,
            settings=clientSettings,
            sessions=SessionStore(reactor, clientSettings),
            capacity=CapacityMonitor(middleware),
            clock=reactor,
            decode=self.decode,
            defaultCharacter=character,
            answerOffer=WebRTCEndpoint(reactor, settings).offer,
        )

        middleware.observeEnvelopes(self._unaddressed, CAPTURE_REPORTS)
        installBridge(self)

    def _unaddressed(self, envelope: Envelope) -> None:
        """
        The seed leaves C{requestId} optional on RPEngine's microphone
        reports.  One without it belongs to the capture in progress, if
        exactly one client has one (RPEngine has one microphone).
        """
        if envelope.type not in CAPTURE_REPORTS or envelope.requestId is not None:
            return
        captures = [
            p.connection.current
            for p in self.connections
            if isinstance(p, ClientProtocol)
            and p.connection is not None
            and p.connection.current is not None
            and p.connection.current.kind == VOICE
            and p.connection.current.capturing
        ]
        if len(captures) == 1:
            captures[0].stream.received(envelope)
        else:
            self.log.debug(
                "{type} without a requestId and {count} captures in progress; dropped",
                type=envelope.type,
                count=len(captures),
            )

    @property
    def clientSettings(self) -> ClientSettings:
        return self.endpoint.settings

    @property
    def defaultCharacter(self) -> Character | None:
        return self.endpoint.defaultCharacter

    def decode(self, data: str) -> Deferred[DecodedAudio]:
        """
        Decode a recording in the reactor's thread pool: Opus decoding of a
        long recording takes tens of milliseconds that other clients' audio
        should not wait for.
        """
        if IReactorThreads.providedBy(self.reactor):
            return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), _decodeAudio, data)
        return maybeDeferred(_decodeAudio, data)
