"""
The middleware itself: the chain between the engine link and the game router,
and the Python API that in-process integrations and the client endpoint use.

    RPEngine <-> EngineSession <-> EngineLink <-> PluginChain <-> GameRouter <-> clients
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from rpmiddleware.cards.validation import (
    CanonicalCard,
    CardHasher,
    InvalidCard,
    snapshotTransfer,
    validateCard,
)
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.chain import PluginChain
from rpmiddleware.core.inorder import InOrder
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.core.router import GameRouter
from rpmiddleware.core.view import (
    ChainWatcher,
    CoreView,
    EngineSessionView,
    TurnRecord,
    Unsubscribe,
    WaitingWork,
)
from rpmiddleware.engine.link import EngineLink
from rpmiddleware.engine.queue import EngineQueue
from rpmiddleware.engine.session import EngineSession, MessageWriter, SessionOptions
from rpmiddleware.plugin.clientext import FROM_CLIENT, TURN_PLAYED, toClient
from rpmiddleware.plugin.interfaces import IEnvelopePlugin, IHeldWork
from rpmiddleware.plugin.services import PluginServices
from rpmiddleware.protocol.clienterrors import INVALID_MESSAGE, errorMessage
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import SPEECH_MODEL, Capacity
from rpmiddleware.protocol.meta import CLIENT, UNCLAIMED
from rpmiddleware.protocol.timeline import Timeline

DEFAULT_OUTPUT: dict[str, Any] = {
    "modalities": ["text", "audio"],
    "language": "en",
    "audio": {"model": SPEECH_MODEL, "voice": "F1", "format": "pcm_s16le"},
}


class Middleware(CoreView):
    """
    One middleware instance: what C{twistd rpmiddleware} serves and what
    tests and embedding programs drive directly.

    The client endpoint, the console and C{/metrics} see it only as a
    L{CoreView} (L{rpmiddleware.core.view}).
    """

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        settings: Settings | None = None,
        plugins: Sequence[IEnvelopePlugin] = (),
        services: PluginServices | None = None,
    ) -> None:
        self.reactor = reactor
        self.settings = settings or Settings()
        self.services = services or PluginServices(
            reactor, self.settings, CardHasher(reactor), Timeline(now=reactor.seconds)
        )
        self.router = GameRouter(self.services.timeline)
        self.chain = PluginChain(plugins, self._engineEnd, self.router.deliver, reactor)
        # Wired one way: the link is given the chain; the chain's engine end
        # is this middleware's (_engineEnd), which hands on to the link.
        self.link = EngineLink(self.chain, self.settings.engine.waiting_limit)
        #: RPEngine's last capacity.update (the view's capacity), recorded
        #: before any other observer of the game end hears of it.
        self._capacity = Capacity()
        self.router.observe(self._capacitySaid, {"capacity.update"})
        self.link.observeState(self._capacityReset)
        #: Which request RPEngine works on now (for the client's stall rule).
        self._engineQueue = EngineQueue()
        self.router.observe(self._engineQueue.received)
        self.link.observeState(self._engineQueue.reset)
        self._inOrder = InOrder(self.chain.sendToEngine)
        self.characters: dict[tuple[str, str], dict[str, Any]] = {}

    def _capacitySaid(self, envelope: Envelope) -> None:
        said = Capacity.fromEnvelope(envelope, self._capacity)
        if said is not None:
            self._capacity = said

    def _capacityReset(self, session: object) -> None:
        # A new session has told nothing yet; a gone one accepts nothing.
        self._capacity = Capacity(queueLimit=self._capacity.queueLimit)

    def _engineEnd(self, envelope: Envelope) -> None:
        """
        What leaves the chain toward RPEngine goes to the engine link; a
        client's message that no plugin took (L{rpmiddleware.plugin.clientext})
        is answered here instead, so the client hears that nothing took it.
        What the client endpoint says of a completed turn's playout
        (L{TURN_PLAYED}) is for a plugin that remembers (memory); a chain
        without one lets it go here, quietly: it is no one's error.
        """
        if envelope.type == FROM_CLIENT:
            self._unclaimed(envelope)
            return
        if envelope.type == TURN_PLAYED:
            self.log.debug(
                "no plugin took what was played of {requestId}", requestId=envelope.requestId
            )
            return
        self.link.send(envelope)

    def _unclaimed(self, envelope: Envelope) -> None:
        message = envelope.get("message")
        kind = message.get("type") if isinstance(message, dict) else None
        why = envelope.meta.get(UNCLAIMED) or f"{kind}: no plugin in the chain took it"
        client = str(envelope.meta.get(CLIENT) or "api")
        self.router.deliver(toClient(client, errorMessage(INVALID_MESSAGE, str(why))))

    @classmethod
    def fromSettings(cls, reactor: Any, settings: Settings, registry: Any = None) -> Middleware:
        """
        Build the configured chain (L{rpmiddleware.core.discovery}) and the middleware.

        @raise rpmiddleware.config.settings.ConfigError: for an unknown or misconfigured plugin.
        """
        from rpmiddleware.core.discovery import buildChain, discoverPlugins, logChain

        timeline = Timeline(now=reactor.seconds)
        services = PluginServices(reactor, settings, CardHasher(reactor), timeline)
        registry = registry if registry is not None else discoverPlugins()
        plugins = buildChain(settings, registry, services)
        logChain(plugins, settings, registry)
        return cls(reactor, settings, plugins, services)

    @property
    def timeline(self) -> Timeline:
        return self.services.timeline

    @property
    def cards(self) -> CardHasher:
        return self.services.cards

    @property
    def engineQueue(self) -> EngineQueue:
        return self._engineQueue

    # The core view (rpmiddleware.core.view), for the outer layers.

    @property
    def engineConnected(self) -> bool:
        return self.link.connected

    @property
    def engineSession(self) -> EngineSessionView | None:
        return self.link.session

    @property
    def engineProblem(self) -> str | None:
        return self.link.problem

    @property
    def engineReaderLost(self) -> int:
        return self.link.abandoned

    @property
    def engineMailbox(self) -> str | None:
        folder = self.settings.engine.mailbox
        if not folder:
            return None
        path = self.settings.relativePath(folder)
        return os.path.abspath(os.path.expanduser(path))

    @property
    def capacity(self) -> Capacity:
        return self._capacity

    def waiting(self) -> WaitingWork:
        return WaitingWork(
            len(self.link.waiting),
            tuple((plugin.name, len(plugin.held())) for plugin in self.providers(IHeldWork)),
        )

    def observeEnvelopes(
        self, observer: Callable[[Envelope], None], types: Collection[str] | None = None
    ) -> Unsubscribe:
        return self.router.observe(observer, types)

    def observeEngine(self, observer: Callable[[EngineSessionView | None], None]) -> Unsubscribe:
        return self.link.observeState(observer)

    def observeChain(self, observer: ChainWatcher) -> Unsubscribe:
        chain = self.chain
        chain.addObserver(observer)
        return lambda: chain.removeObserver(observer)

    @property
    def pluginNames(self) -> list[str]:
        return self.chain.names

    def providers(self, interface: Any) -> list[Any]:
        return [plugin for plugin in self.chain.plugins if interface.providedBy(plugin)]

    def recentTurns(self) -> list[TurnRecord]:
        return list(self.timeline.recent())

    def turnRecord(self, requestId: str) -> TurnRecord | None:
        return self.timeline.get(requestId)

    def adoptCard(self, card: dict[str, Any]) -> dict[str, Any]:
        return self.cards.adopt(card)

    # The engine side.

    def sessionOptions(self) -> SessionOptions:
        server, engine = self.settings.server, self.settings.engine
        from rpmiddleware import __version__

        return SessionOptions(
            serverVersion=server.server_version or f"rpmiddleware-{__version__}",
            helloTimeout=server.hello_timeout,
            ackTimeout=engine.ack_timeout,
            maxRetransmits=engine.max_retransmits,
            dedupWindow=engine.dedup_window,
            ackEngineMessages=engine.ack_engine_messages,
        )

    def newEngineSession(self, writer: MessageWriter, peer: str = "") -> EngineSession:
        """
        A session for a new RPEngine connection, wired to the engine link.
        """
        link = self.link
        return EngineSession(
            writer,
            self.reactor,
            self.sessionOptions(),
            onWelcome=link.welcomed,
            onEnvelope=link.received,
            onClosed=link.ended,
            peer=peer,
        )

    # Characters.

    def registerCharacter(
        self, characterId: str, card: dict[str, Any], integrationId: str | None = None
    ) -> None:
        """
        Remember the card to play as C{characterId}: a private copy, so that
        its hash is computed once; register it again to change it.

        @raise rpmiddleware.cards.validation.InvalidCard: naming the field that is wrong.
        """
        validateCard(card)
        try:
            owned = self.cards.canonicalNow(card)
        except ValueError as e:
            raise InvalidCard("card", f"is not canonical JSON ({e})")
        key = (integrationId or self.settings.game.integration_id, characterId)
        self.characters[key] = owned.document

    def character(self, characterId: str, integrationId: str | None = None) -> dict[str, Any]:
        key = (integrationId or self.settings.game.integration_id, characterId)
        try:
            return self.characters[key]
        except KeyError:
            raise KeyError(f"no character {characterId!r} is registered for {key[0]!r}")

    # The Python API.

    def requestReply(
        self,
        characterId: str,
        *,
        text: str | None = None,
        audio: Mapping[str, Any] | None = None,
        card: dict[str, Any] | None = None,
        integrationId: str | None = None,
        output: Mapping[str, Any] | None = None,
        player: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        retainAudio: bool = True,
        retainText: bool = True,
        **extra: Any,
    ) -> ReplyStream:
        """
        Ask C{characterId} to reply to an event: typed C{text}, recorded
        C{audio} (RPEngine's C{event.audio} object), or both.

        @param card: the Character Card V2 to play; defaults to the one registered.
        @param meta: middleware-only annotations for the plugins, never sent
            (C{client}: who asked, for fairness; C{outputSampleRate}: the
            rate the caller wants audio at).
        @param retainAudio: keep audio chunks in the stream's C{envelopes};
            a caller that forwards them as they come passes C{False} so a
            long reply's audio is not held twice.
        @param retainText: likewise for text deltas once the stream is
            followed (their text is kept for C{text()}).
        @param extra: further reply.request fields (interactionMode,
            promptScene, promptDirective, eventId, ...), passed as they are.
        """
        if text is None and audio is None:
            raise ValueError("a reply needs text, audio or both")
        event: dict[str, Any] = {}
        if text is not None:
            event["text"] = text
        if audio is not None:
            event["audio"] = dict(audio)
        return self._open(
            "reply.request",
            characterId,
            card,
            integrationId,
            output,
            player,
            meta,
            retainAudio,
            {"event": event, **extra},
            retainText,
        )

    def captureVoice(
        self,
        characterId: str,
        *,
        card: dict[str, Any] | None = None,
        integrationId: str | None = None,
        output: Mapping[str, Any] | None = None,
        player: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        retainAudio: bool = True,
        retainText: bool = True,
        returnTranscript: bool = True,
        silenceBehavior: str = "error",
        **extra: Any,
    ) -> ReplyStream:
        """
        Ask RPEngine to listen to its browser microphone and reply to what it hears.

        @param returnTranscript: have RPEngine send the player's words
            (C{voice.capture.transcript}); it sends them only when asked
            (app.rs stt_completed).
        @param silenceBehavior: C{"error"} ends the turn with C{empty_speech}
            when nothing was said; C{"restart"} listens again.
        """
        return self._open(
            "voice.capture.start",
            characterId,
            card,
            integrationId,
            output,
            player,
            meta,
            retainAudio,
            {"returnTranscript": returnTranscript, "silenceBehavior": silenceBehavior, **extra},
            retainText,
        )

    def stopVoiceCapture(self, stream: ReplyStream) -> None:
        """
        End the player's speech now instead of waiting for RPEngine's VAD.
        """
        self._sendInOrder(Envelope.build("voice.capture.stop", requestId=stream.requestId))

    def _open(
        self,
        kind: str,
        characterId: str,
        card: dict[str, Any] | None,
        integrationId: str | None,
        output: Mapping[str, Any] | None,
        player: Mapping[str, Any] | None,
        meta: Mapping[str, Any] | None,
        retainAudio: bool,
        fields: dict[str, Any],
        retainText: bool = True,
    ) -> ReplyStream:
        integrationId = integrationId or self.settings.game.integration_id
        if card is None:
            card = self.character(characterId, integrationId)
        else:
            validateCard(card)
        requestId = str(fields.pop("requestId", None) or uuid.uuid4().hex)
        cancelKind = "voice.capture.cancel" if kind == "voice.capture.start" else "request.cancel"

        def cancel(stream: ReplyStream) -> None:
            withdraw = Envelope.build(cancelKind, requestId=stream.requestId)
            withdraw.meta.update(meta or {})
            withdraw.meta.update(stream.cancelMeta)
            self._sendInOrder(withdraw)

        stream = ReplyStream(requestId, cancel, retainAudio=retainAudio, retainText=retainText)
        self.router.route(requestId, stream.received)
        asker = (meta or {}).get("client", "api")
        self.timeline.submitted(
            requestId,
            client=asker if isinstance(asker, str) else None,
            characterId=characterId,
            kind=kind,
        )
        envelope = Envelope.build(
            kind,
            requestId=requestId,
            eventId=str(fields.pop("eventId", None) or uuid.uuid4().hex),
            integrationId=integrationId,
            characterId=characterId,
            output=dict(output) if output is not None else dict(DEFAULT_OUTPUT),
            player=dict(player) if player is not None else {"displayName": "Player"},
            **fields,
        )
        envelope.meta.update(meta or {})
        envelope.meta.setdefault("client", "api")
        self._withCard(envelope, card).addErrback(self._failedToSubmit, stream)
        return stream

    def _withCard(self, envelope: Envelope, card: dict[str, Any]) -> Deferred[None]:
        def attach(canonical: CanonicalCard) -> Envelope:
            # The owned copy travels, so the chain finds its hash by identity.
            envelope["card"] = snapshotTransfer(canonical.document, canonical.hash)
            return envelope

        return self._inOrder.submit(self.cards.canonical(card).addCallback(attach))

    def submit(self, envelope: Envelope) -> None:
        """
        Hand C{envelope} to the chain at the game end, after every request
        submitted before it (which may still be waiting for its card's
        hash): the entry for anything a game sends, the client endpoint's
        messages for plugins among them (L{rpmiddleware.plugin.clientext}).
        """
        self._sendInOrder(envelope)

    def clientSessionEnded(self, clientId: str) -> None:
        """
        A client session is over: the plugins that keep anything for client
        sessions hear it (L{rpmiddleware.plugin.interfaces.IClientExtension}).
        """
        self.chain.clientSessionEnded(clientId)

    def clientSessionResumed(self, clientId: str) -> None:
        """
        A client took its session back with C{reconnect}: the plugins with
        client messages hear it.
        """
        self.chain.clientSessionResumed(clientId)

    def close(self) -> Deferred[None]:
        """
        The middleware is stopping: every plugin closes
        (L{rpmiddleware.core.chain.PluginChain.close}: bounded, each one
        isolated).  Fires once they have, or were abandoned; never fails.
        """
        return self.chain.close()

    def plugin(self, interface: Any) -> Any:
        """
        The first plugin of the chain that provides C{interface}, or C{None}:
        how a game finds a plugin's Python API (the memory plugin's
        C{IConversationMemory}, say) without knowing its name.
        """
        found = self.providers(interface)
        return found[0] if found else None

    def _sendInOrder(self, envelope: Envelope) -> None:
        """
        Send C{envelope} after every request submitted before it (which may
        still be waiting for its card's hash).
        """
        self._inOrder.submit(succeed(envelope)).addErrback(
            lambda failure: self.log.failure(
                "could not send {type} {requestId}",
                failure,
                type=envelope.type,
                requestId=envelope.requestId,
            )
        )

    def _failedToSubmit(self, failure: Any, stream: ReplyStream) -> None:
        self.log.failure(
            "could not submit request {requestId}", failure, requestId=stream.requestId
        )
        stream.received(
            Envelope.build(
                "request.error",
                requestId=stream.requestId,
                code="request_failed",
                message=f"the middleware could not submit this request: {failure.value}",
                retryable=False,
            )
        )

    def syncCharacter(
        self, characterId: str, card: dict[str, Any] | None = None, integrationId: str | None = None
    ) -> Deferred[None]:
        """
        Preload a character with C{character.sync} (no inference).
        """
        integrationId = integrationId or self.settings.game.integration_id
        if card is None:
            card = self.character(characterId, integrationId)
        else:
            validateCard(card)
        envelope = Envelope.build(
            "character.sync", integrationId=integrationId, characterId=characterId
        )
        return self._withCard(envelope, card)
