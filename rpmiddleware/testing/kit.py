"""
A testing kit for plugin authors: run a plugin (or a few) in a real chain with
a fake clock and catch what comes out of either end.

    from rpmiddleware.testing import PluginHarness

    harness = PluginHarness(MyPlugin())
    harness.startSession()
    harness.toEngine(harness.replyRequest("r1", text="Hello"))
    self.assertEqual(harness.sentToEngine[0]["card"]["mode"], "snapshot")

What leaves toward RPEngine is checked with RPEngine's rules, as the daemon
checks it before sending (L{rpmiddleware.protocol.rules}): an envelope the
daemon would not send fails the test (L{EngineWouldRefuse}).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from zope.interface import implementer

from rpmiddleware.cards.hasher import CanonicalCard, CardHasher
from rpmiddleware.cards.validation import snapshotTransfer
from rpmiddleware.config.settings import Settings, parseSettings
from rpmiddleware.core.chain import PluginChain
from rpmiddleware.core.middleware import DEFAULT_OUTPUT
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.clientext import fromClient
from rpmiddleware.plugin.interfaces import IEngineSessionInfo, IEnvelopePlugin, IPluginServices
from rpmiddleware.protocol.envelope import Direction, Envelope, summarize
from rpmiddleware.protocol.messages import MESSAGES
from rpmiddleware.protocol.rules import EngineRefusal, checkOutgoing
from rpmiddleware.protocol.timeline import Timeline


@implementer(IEngineSessionInfo)
class FakeSession:
    def __init__(self, sessionId: str, startedAt: float = 0.0) -> None:
        self.sessionId = sessionId
        self.startedAt = startedAt


#: The requests the game end gives an eventId (rpmiddleware.core.middleware).
_REQUEST_TYPES = ("reply.request", "voice.capture.start")

#: The start of the middleware's own envelope types (never RPEngine's).
MIDDLEWARE_PREFIX = "x-"

#: A card transfer that names a card without sending it, for requests whose
#: card does not matter to the plugin under test, or for what a plugin
#: further from the game than card-cache sees of a card RPEngine already has
#: (L{PluginHarness.replyRequest} sends a snapshot unless given this).
REFERENCE_CARD = {"format": "chara_card_v2", "mode": "reference", "targetHash": "0" * 64}


def _notAPlugin(thing: object) -> str:
    return (
        f"{thing!r} does not provide IEnvelopePlugin: subclass "
        "rpmiddleware.plugin.ChainPlugin (or declare @implementer(IEnvelopePlugin) on its "
        "class), or pass a list of plugins that do"
    )


class EngineWouldRefuse(AssertionError):
    """
    An envelope left a L{PluginHarness}'s chain toward RPEngine that the
    daemon would not send: RPEngine's rules refuse it (C{refusal}, an
    L{EngineRefusal} naming the field), or RPEngine does not take its type.
    The chain logs it as a failure, so the trial test that sent it fails.
    """

    def __init__(self, envelope: Envelope, refusal: EngineRefusal | None) -> None:
        if refusal is None:
            why = f"RPEngine does not take {envelope.type!r}; the daemon drops it at the engine end"
        else:
            why = (
                f"RPEngine would refuse it ({refusal}); the daemon does not send it and ends "
                f"its request with request.error {refusal.code}"
            )
        super().__init__(
            f"{summarize(envelope.fields)} left the chain toward RPEngine: {why} "
            "(PluginHarness(..., engineRules=False) leaves this unchecked)"
        )
        self.envelope = envelope
        self.refusal = refusal


def pluginServices(
    clock: Any = None,
    config: Settings | Mapping[str, Any] | None = None,
    cards: CardHasher | None = None,
) -> PluginServices:
    """
    The services a plugin's factory is built with
    (L{rpmiddleware.plugin.interfaces.IPluginServices}), as the daemon lends them:
    C{clock} as the reactor (a new L{Clock} unless given), C{config} (the
    default L{Settings} unless given; a mapping is read as the daemon reads
    its TOML file, C{{"client": {"barge_in": False}}}), a L{CardHasher} (or
    C{cards}, a L{HeldHasher} say) and a new L{Timeline}.

        clock = Clock()
        plugin = myFactory.buildPlugin({"volume": 2}, pluginServices(clock))
        harness = PluginHarness(plugin, clock)
    """
    clock = clock if clock is not None else Clock()
    if config is not None and not isinstance(config, Settings):
        config = parseSettings(config, "pluginServices(config=...)")
    return PluginServices(
        clock,
        config if config is not None else Settings(),
        cards if cards is not None else CardHasher(clock),
        Timeline(now=clock.seconds),
    )


class PluginHarness:
    """
    A chain of the given plugins between two lists.

    @param engineRules: check every envelope that leaves toward RPEngine as
        the daemon does before sending it (L{rpmiddleware.protocol.rules}): one
        it would not send is not added to C{sentToEngine} but raises
        L{EngineWouldRefuse}, which the chain logs, failing the test.
        C{False} to collect whatever leaves, unchecked.
    @param cards: the L{CardHasher} the cards of L{replyRequest} are hashed
        with, as the daemon hashes a game's card before the chain sees it
        (give it your plugin's C{services.cards}, so it finds their hashes by
        identity, as in the daemon); a new one unless given.
    @ivar sentToEngine: envelopes that left the chain toward RPEngine.
    @ivar sentToGame: envelopes that left the chain toward the game.
    @ivar clock: the L{Clock} the plugins see as their reactor.
    """

    def __init__(
        self,
        plugins: IEnvelopePlugin | Sequence[IEnvelopePlugin],
        clock: Any = None,
        *,
        engineRules: bool = True,
        cards: CardHasher | None = None,
    ) -> None:
        if IEnvelopePlugin.providedBy(plugins):
            plugins = [plugins]  # type: ignore[list-item]
        elif not isinstance(plugins, Iterable):
            raise TypeError(_notAPlugin(plugins))
        plugins = list(plugins)
        for plugin in plugins:
            if not IEnvelopePlugin.providedBy(plugin):
                raise TypeError(_notAPlugin(plugin))
        self.clock = clock if clock is not None else Clock()
        self.sentToEngine: list[Envelope] = []
        self.sentToGame: list[Envelope] = []
        self.engineRules = engineRules
        self.chain = PluginChain(
            list(plugins),  # type: ignore[arg-type]
            self._engineEnd,
            self.sentToGame.append,
            self.clock,
        )
        self.session: FakeSession | None = None
        self._sessions = 0
        self.cards = cards if cards is not None else CardHasher(self.clock)
        self._card: CanonicalCard | None = None

    def _engineEnd(self, envelope: Envelope) -> None:
        # The middleware's own types (x-...) are for plugins further on; the
        # daemon's engine end drops them, and a test may read them here.
        if self.engineRules and not envelope.type.startswith(MIDDLEWARE_PREFIX):
            spec = MESSAGES.get(envelope.type)
            if spec is None or Direction.TO_ENGINE not in spec.directions:
                raise EngineWouldRefuse(envelope, None)
            try:
                checkOutgoing(envelope.fields)
            except EngineRefusal as refusal:
                raise EngineWouldRefuse(envelope, refusal) from refusal
        self.sentToEngine.append(envelope)

    def startSession(self, sessionId: str | None = None) -> FakeSession:
        """
        Tell the plugins a new RPEngine session began (ending the current one).
        """
        if self.session is not None:
            self.endSession()
        self._sessions += 1
        self.session = FakeSession(sessionId or f"session-{self._sessions}", self.clock.seconds())
        self.chain.engineSessionStarted(self.session)
        return self.session

    def endSession(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            self.chain.engineSessionEnded(session)

    def endClientSession(self, clientId: str) -> None:
        """
        Client session C{clientId} is over, as the client endpoint says
        when one expires (L{rpmiddleware.plugin.interfaces.IClientExtension}).
        """
        self.chain.clientSessionEnded(clientId)

    def fromClient(self, clientId: str, message: dict[str, Any]) -> Deferred[None]:
        """
        Client session C{clientId} sends C{message} (a client message of a
        type a plugin takes, L{rpmiddleware.plugin.interfaces.IClientExtension}),
        into the chain at the game end as the client endpoint sends it.
        """
        return self.chain.sendToEngine(fromClient(clientId, message))

    def card(self) -> dict[str, Any]:
        """
        The card transfer of a game's request as a plugin nearer the game
        than card-cache sees it: a snapshot of L{exampleCard}, an owned
        document with its canonical hash (L{rpmiddleware.core.middleware}
        builds it so), the same document for every request, as a
        registered character's is.
        """
        if self._card is None:
            self._card = self.cards.canonicalNow(self.cards.adopt(exampleCard()))
        return snapshotTransfer(self._card.document, self._card.hash)

    def envelope(self, type: str, **fields: Any) -> Envelope:
        sessionId = self.session.sessionId if self.session is not None else None
        return Envelope.build(type, sessionId, **fields)

    def replyRequest(
        self,
        requestId: str = "r1",
        *,
        text: str | None = None,
        audio: dict[str, Any] | None = None,
        card: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        **fields: Any,
    ) -> Envelope:
        """
        A valid C{reply.request} (not yet sent): typed C{text} (default "hi"
        when there is no C{audio}), an C{eventId} unless given, and C{meta}
        for the plugins.  Its C{card} is what a plugin nearer the game than
        card-cache sees (L{card}: a snapshot of the example card) unless
        C{card} is given (L{REFERENCE_CARD}: what one further from the game
        sees of a card RPEngine has).
        """
        event: dict[str, Any] = {}
        if text is not None or audio is None:
            event["text"] = "hi" if text is None else text
        if audio is not None:
            event["audio"] = audio
        fields.setdefault("integrationId", "game")
        fields.setdefault("characterId", "c1")
        fields.setdefault("eventId", f"event-{requestId}")
        envelope = self.envelope(
            "reply.request",
            requestId=requestId,
            event=event,
            card=card if card is not None else self.card(),
            **fields,
        )
        envelope.meta.update(meta or {})
        return envelope

    def toEngine(self, envelope: Envelope | str, **fields: Any) -> Deferred[None]:
        """
        Send an envelope (or build one of that type) from the game into the chain.
        With C{engineRules}, a request without an C{eventId} or C{output} is
        given them, as the daemon's game end gives every request (the
        default output: text and speech).
        """
        if isinstance(envelope, str):
            envelope = self.envelope(envelope, **fields)
        if self.engineRules and envelope.type in _REQUEST_TYPES:
            if not envelope.get("eventId"):
                envelope["eventId"] = f"event-{envelope.requestId}"
            if "output" not in envelope.fields:
                envelope["output"] = copy.deepcopy(DEFAULT_OUTPUT)
        return self.chain.sendToEngine(envelope)

    def toGame(self, envelope: Envelope | str, **fields: Any) -> Deferred[None]:
        """
        Send an envelope (or build one of that type) from RPEngine into the chain.
        """
        if isinstance(envelope, str):
            envelope = self.envelope(envelope, **fields)
        return self.chain.sendToGame(envelope)

    def typesToEngine(self) -> list[str]:
        return [e.type for e in self.sentToEngine]

    def typesToGame(self) -> list[str]:
        return [e.type for e in self.sentToGame]


def builtinPlugin(
    name: str, settings: dict[str, Any] | None = None, services: IPluginServices | None = None
) -> IEnvelopePlugin:
    """
    The built-in plugin C{name} (C{"card-cache"}), built by its factory
    from C{settings} (its C{[plugins.NAME]} table; none unless given) and
    C{services} (L{pluginServices} unless given), to test a plugin beside
    the ones it sits next to in the daemon's chain.

    @raise KeyError: naming the built-in plugins, for an unknown C{name}.
    """
    import rpmiddleware.builtin as builtins

    factories = {factory.name: factory for factory in builtins.FACTORIES}
    if name not in factories:
        raise KeyError(f"no built-in plugin {name!r} (built-in: {', '.join(sorted(factories))})")
    return factories[name].buildPlugin(settings or {}, services or pluginServices())


def exampleCard(**data: Any) -> dict[str, Any]:
    """
    A fresh copy of the bundled example Character Card V2, with C{data} fields
    replaced.
    """
    text = resources.files("rpmiddleware").joinpath("data/example_character.json").read_text()
    card: dict[str, Any] = json.loads(text)
    card["data"].update(copy.deepcopy(data))
    return card


def exampleAction(**changes: Any) -> dict[str, Any]:
    """
    An action declaration for the actions plugin (docs/scenes.md): the
    guard's C{open_gate}, with C{changes} applied.
    """
    return {
        "name": "open_gate",
        "description": "Open one of the town gates.",
        "parameters": {
            "type": "object",
            "properties": {"gate": {"enum": ["north", "south"]}},
            "required": ["gate"],
            "additionalProperties": False,
        },
        **changes,
    }


def examplePromptContext(interactionMode: str = "direct_user") -> dict[str, Any]:
    """
    A complete prompt context in RPEngine's shapes: the three fields it takes
    together or not at all (crates/rp-engine-core/src/json_core.rs
    validate_prompt_context), to pass as a request's extra fields.
    """
    return {
        "interactionMode": interactionMode,
        "promptScene": {
            "kind": "conversation",
            "family": "tavern",
            "label": "The Rusty Anchor",
            "sceneLine": "A rainy evening at the inn.",
            "priority": 1,
        },
        "promptDirective": {
            "protocolVersion": 1,
            "sceneContext": "The inn is warm and loud.",
            "autoEventGuide": "React to what just happened.",
            "directUserGuide": "Answer the traveller.",
        },
    }


def exampleResponseRule(**changes: Any) -> dict[str, Any]:
    """
    One rule of RPEngine's buffered response processing (text.rs
    parse_response_processing): the last C{<emotion>} tag at the end of the
    reply is captured under C{emotion} and removed from text and speech.
    """
    rule: dict[str, Any] = {
        "id": "emotion",
        "matcher": {"type": "regex", "pattern": r"<([a-z][a-z0-9_]{0,63})>\s*$"},
        "captureGroup": 1,
        "occurrence": "last",
        "remove": "match",
        "removeFrom": ["text", "audio"],
    }
    rule.update(changes)
    return rule


class HeldHasher(CardHasher):
    """
    A L{CardHasher} whose answers wait until the test calls L{release}, as a
    large card's do until a later reactor turn: for testing what a plugin
    (or the middleware) does while a card is still being hashed.
    """

    def __init__(self) -> None:
        super().__init__(None)
        self.pending: list[tuple[Deferred[CanonicalCard], Any]] = []

    def canonical(self, document: Any) -> Deferred[CanonicalCard]:
        d: Deferred[CanonicalCard] = Deferred()
        self.pending.append((d, document))
        return d

    def release(self) -> None:
        """
        Answer the oldest pending request.
        """
        d, document = self.pending.pop(0)
        d.callback(self.canonicalNow(document))


def captureLogEvents(testCase: Any) -> list[dict[str, Any]]:
    """
    Collect every log event published while C{testCase} runs, so a test can
    assert what was logged (with its fields) rather than scrape text.
    """
    events: list[dict[str, Any]] = []

    @implementer(ILogObserver)
    def observe(event: dict[str, Any]) -> None:
        events.append(event)

    globalLogPublisher.addObserver(observe)
    testCase.addCleanup(globalLogPublisher.removeObserver, observe)
    return events
