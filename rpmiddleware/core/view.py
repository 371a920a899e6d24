"""
The core as the outer layers see it: one narrow, typed view.

The client endpoint (L{rpmiddleware.client}), the console
(L{rpmiddleware.console}) and C{/metrics} (L{rpmiddleware.console.metrics}) are given
a L{CoreView}, never the concrete middleware: they read whether RPEngine is
connected, its last C{capacity.update}, the work waiting in the middleware,
the chain's plugin names and the plugins that provide an interface; they
watch envelopes reaching the game, envelopes leaving the chain, and the
engine coming and going; and they ask turns of the Python API.  Nothing here
names the engine link, the chain, the router or the timeline, so those may
change without the outer layers noticing (C{tests/test_imports.py} keeps the
outer layers from importing them).

L{rpmiddleware.core.middleware.Middleware} provides it.  A test may give the
outer layers a fake of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.protocol.envelope import Direction, Envelope
from rpmiddleware.protocol.messages import Capacity

__all__ = [
    "Capacity",
    "ChainWatcher",
    "CoreView",
    "EngineQueueView",
    "EngineSessionView",
    "TurnRecord",
    "WaitingWork",
]

#: Stops an observer; calling it again does nothing.
Unsubscribe = Callable[[], None]


class EngineSessionView(Protocol):
    """
    What the outer layers may read of the live RPEngine session.
    """

    @property
    def sessionId(self) -> str | None:
        """The sessionId sent in welcome."""

    @property
    def startedAt(self) -> float | None:
        """Reactor time at which welcome was sent."""

    @property
    def peer(self) -> str:
        """RPEngine's address, for people to read."""

    @property
    def fileMode(self) -> bool:
        """Whether it came by the file mailbox rather than the WebSocket."""


class EngineQueueView(Protocol):
    """
    Which request RPEngine works on now, as far as it tells us
    (L{rpmiddleware.engine.queue}): what the client's stall rule asks.
    """

    def isActive(self, requestId: str) -> bool:
        """Whether RPEngine is working on C{requestId} now."""

    def whenActive(self, requestId: str, callback: Callable[[], None]) -> None:
        """Call C{callback} once, when C{requestId} becomes the active request."""


class TurnRecord(Protocol):
    """
    What the middleware remembers of one request: when it was asked and
    when its replies came (reactor seconds), and what plugins noted.
    """

    @property
    def requestId(self) -> str: ...

    @property
    def client(self) -> str | None:
        """The client session that asked, if a client did."""

    @property
    def submitted(self) -> float | None: ...

    @property
    def firstText(self) -> float | None: ...

    @property
    def firstAudio(self) -> float | None: ...

    @property
    def details(self) -> dict[str, Any]: ...

    def asDict(self) -> dict[str, Any]:
        """Everything, as JSON-ready values (C{marks}: the times by name)."""


class ChainWatcher(Protocol):
    """
    Told about every envelope when it leaves the chain
    (L{rpmiddleware.plugin.interfaces.IChainObserver}).
    """

    name: str

    def envelopeLeft(self, envelope: Envelope, direction: Direction, outcome: str) -> None: ...


@dataclass(frozen=True)
class WaitingWork:
    """
    Requests held in the middleware now.

    @ivar forEngine: waiting in the engine link for an RPEngine session.
    @ivar held: for each plugin that holds work
        (L{rpmiddleware.plugin.interfaces.IHeldWork}), in chain order, its name and
        how many requests it holds.
    """

    forEngine: int = 0
    held: tuple[tuple[str, int], ...] = ()

    @property
    def heldLocally(self) -> int:
        """How many the plugins hold, together."""
        return sum(count for _, count in self.held)


class CoreView(Protocol):
    """
    The core, as the client endpoint, the console and C{/metrics} use it.
    """

    # RPEngine.

    @property
    def engineConnected(self) -> bool:
        """Whether an RPEngine session is live."""

    @property
    def engineSession(self) -> EngineSessionView | None:
        """The live RPEngine session, or C{None}."""

    @property
    def engineProblem(self) -> str | None:
        """
        Why no RPEngine is connected, when the transport knows (the file
        mailbox: its tab stopped reading the folder); C{None} otherwise.
        """

    @property
    def engineReaderLost(self) -> int:
        """How many times a transport judged its RPEngine gone."""

    @property
    def engineMailbox(self) -> str | None:
        """The absolute path of RPEngine's file mailbox, when one is served."""

    @property
    def capacity(self) -> Capacity:
        """
        RPEngine's last C{capacity.update}; the empty L{Capacity} while a
        session has said nothing yet, or without RPEngine.
        """

    @property
    def engineQueue(self) -> EngineQueueView:
        """Which request RPEngine works on now."""

    def waiting(self) -> WaitingWork:
        """The requests the middleware holds now."""

    def observeEnvelopes(
        self, observer: Callable[[Envelope], None], types: Collection[str] | None = None
    ) -> Unsubscribe:
        """
        Show C{observer} every envelope that reaches the game end, or those
        of C{types} only, after the middleware's own record of it
        (L{capacity} is current).  Naming the types spares the others a
        call each: every speech chunk passes here.
        """

    def observeEngine(self, observer: Callable[[EngineSessionView | None], None]) -> Unsubscribe:
        """
        Call C{observer} with the new session (or C{None}) whenever RPEngine
        comes or goes.
        """

    def observeChain(self, observer: ChainWatcher) -> Unsubscribe:
        """Tell C{observer} about every envelope that leaves the chain."""

    # The chain.

    @property
    def pluginNames(self) -> list[str]:
        """The chain's plugins, in configured order."""

    def plugin(self, interface: Any) -> Any:
        """The first plugin that provides C{interface}, or C{None}."""

    def providers(self, interface: Any) -> list[Any]:
        """Every plugin that provides C{interface}, in chain order."""

    # Requests as the middleware remembers them.

    def recentTurns(self) -> list[TurnRecord]:
        """The requests remembered, oldest first."""

    def turnRecord(self, requestId: str) -> TurnRecord | None:
        """What is remembered of C{requestId}, if anything."""

    # The Python API.

    def registerCharacter(
        self, characterId: str, card: dict[str, Any], integrationId: str | None = None
    ) -> None: ...

    def character(self, characterId: str, integrationId: str | None = None) -> dict[str, Any]: ...

    def adoptCard(self, card: dict[str, Any]) -> dict[str, Any]:
        """
        Own C{card}, which nobody will change again, so that its hash is
        found by identity on every turn; returns what to keep in its place.
        """

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
    ) -> ReplyStream: ...

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
        returnTranscript: bool = True,
        silenceBehavior: str = "error",
        **extra: Any,
    ) -> ReplyStream: ...

    def stopVoiceCapture(self, stream: ReplyStream) -> None: ...

    def submit(self, envelope: Envelope) -> None:
        """Hand C{envelope} to the chain at the game end, in order."""

    def clientSessionEnded(self, clientId: str) -> None: ...

    def clientSessionResumed(self, clientId: str) -> None: ...
