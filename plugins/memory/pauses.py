"""
Requests of the memory plugin's own, asked in the player's pauses: the
machinery summaries (L{rpmiddleware.builtin.memory.summarizer}) and
reflections (L{rpmiddleware.builtin.memory.reflection}) share, so that how
a pause is waited for, how a request is sent, timed and cancelled, and how
its end is taken are written once.  What each asks and what it makes of
the answer stays in its own module.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from rpmiddleware.builtin.memory.conversation import CHARACTER, PLAYER, Conversation, Entry, Key
from rpmiddleware.builtin.memory.planner import flatten, wordsOf
from rpmiddleware.builtin.memory.settings import MemorySettings
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.plugin import CardHasher, Envelope, IChainContext, snapshotTransfer


def ownCard(
    name: str, description: str, personality: str, scenario: str, systemPrompt: str
) -> dict[str, Any]:
    """
    A card of the plugin's own (a character RPEngine is asked as, never
    shown to players): a plain C{chara_card_v2} with no greeting or
    examples.
    """
    return {
        "spec": "chara_card_v2",
        "spec_version": "2.0",
        "data": {
            "name": name,
            "description": description,
            "personality": personality,
            "scenario": scenario,
            "first_mes": "",
            "mes_example": "",
            "creator_notes": "Used by rpmiddleware's memory plugin; never shown to players.",
            "system_prompt": systemPrompt,
            "post_history_instructions": "",
            "alternate_greetings": [],
            "tags": [],
            "creator": "rpmiddleware",
            "character_version": "1",
            "extensions": {},
        },
    }


def saidLines(entries: Sequence[Entry], character: str, player: str) -> list[str]:
    """
    The words of C{entries}, one line each with who said it (C{character}
    or C{player} for an entry that names no speaker): what both requests
    show of the conversation.
    """
    lines = []
    for entry in entries:
        said = wordsOf(entry, named=False)
        if said is not None:
            speaker = entry.speaker or (character if entry.role == CHARACTER else player)
            lines.append(f"{flatten(speaker)}: {said}")
    return lines


def namesIn(entries: Sequence[Entry]) -> tuple[str, str]:
    """The character's and the player's names as C{entries} give them ("": none)."""
    character = next((e.speaker for e in entries if e.role == CHARACTER and e.speaker), "")
    player = next((e.speaker for e in entries if e.role == PLAYER and e.speaker), "")
    return character, player


def ownRequest(
    prefix: str,
    characterId: str,
    conversation: Conversation,
    text: str,
    output: dict[str, Any],
    card: dict[str, Any],
) -> Envelope:
    """
    A text-only C{reply.request} of the plugin's own for its own character
    C{characterId} (so that the conversation's character keeps the card
    RPEngine holds for it), never shown to a client.
    """
    envelope = Envelope.build(
        "reply.request",
        requestId=prefix + uuid.uuid4().hex,
        eventId=uuid.uuid4().hex,
        integrationId=conversation.key.integrationId,
        characterId=characterId,
        event={"text": text},
        output=output,
        player={"displayName": "Game"},
        card=card,
    )
    envelope.meta["client"] = "memory"
    return envelope


@dataclass
class Pending:
    """A request in flight: of which conversation, through which entry."""

    requestId: str
    key: Key
    through: int
    cancelled: bool = False
    timer: IDelayedCall | None = None


P = TypeVar("P", bound=Pending)


class PauseRequests(Generic[P]):
    """
    What summaries and reflections share: the conversations due, the pause
    waited for (C{idle}), the one request in flight (C{current}), the
    failures in a row of each conversation, and the plugin's own card.

    C{busy} tells whether a player's turn is in flight, C{storeFor} the
    store of a conversation, C{context} the plugin's chain context;
    C{counts} is the plugin's counts, C{log} its logger; C{ownCard} the
    card the requests are asked of.
    """

    def __init__(
        self,
        *,
        reactor: Any,
        settings: MemorySettings,
        cards: CardHasher,
        ownCard: dict[str, Any],
        busy: Callable[[], bool],
        storeFor: Callable[[Key], MemoryStore],
        counts: dict[str, int],
        context: Callable[[], IChainContext],
        log: Logger,
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.cards = cards
        self.ownCard = ownCard
        self.busy = busy
        self.storeFor = storeFor
        self.counts = counts
        self.context = context
        self.log = log
        #: The request in flight, if any.
        self.current: P | None = None
        #: Conversations due to be asked about, in order.
        self.due: dict[Key, None] = {}
        #: Requests of a conversation that failed in a row.
        self.failures: dict[Key, int] = {}
        self.idle: IDelayedCall | None = None
        self.card: dict[str, Any] | None = None

    def cancelIdle(self) -> None:
        """The pause waited for is waited for no more."""
        if self.idle is not None and self.idle.active():
            self.idle.cancel()
        self.idle = None

    def mayAsk(self) -> bool:
        """Whether a pause may be waited for now: something is due and nothing asked."""
        return bool(self.due) and not self.busy() and self.current is None

    def askingContext(self) -> IChainContext | None:
        """
        The pause came: the chain context to ask in, or C{None} when a
        turn, a request in flight or no session means not now.
        """
        self.idle = None
        context = self.context()
        if self.busy() or self.current is not None or context.session is None:
            return None
        return context

    def cardTransfer(self) -> dict[str, Any]:
        """The own card's transfer, hashed once: a copy for each request."""
        if self.card is None:
            owned = self.cards.canonicalNow(self.ownCard)
            self.card = snapshotTransfer(owned.document, owned.hash)
        return dict(self.card)

    def ask(
        self,
        context: IChainContext,
        envelope: Envelope,
        pending: P,
        timeout: float,
        timedOut: Callable[[P], None],
        doing: str,
        count: int,
    ) -> None:
        """Send C{envelope}, the request C{pending} stands for, timed by C{timeout}."""
        pending.timer = self.reactor.callLater(timeout, timedOut, pending)
        self.current = pending
        self.log.info(
            "asking RPEngine to " + doing + " {count} entries of {key}",
            count=count,
            key=pending.key.asDict(),
            requestId=pending.requestId,
        )
        context.sendToEngine(envelope)

    def cancel(self, context: IChainContext, pending: P) -> None:
        """Cancel C{pending} at RPEngine; its conversation is due again."""
        pending.cancelled = True
        self.due[pending.key] = None
        context.sendToEngine(Envelope.build("request.cancel", requestId=pending.requestId))

    def finished(self, pending: P) -> None:
        """C{pending}'s request ended: nothing is in flight, its timer is stopped."""
        self.current = None
        if pending.timer is not None and pending.timer.active():
            pending.timer.cancel()

    def sessionEnded(self) -> None:
        """The engine session ended: the request in flight ends with it."""
        pending = self.current
        if pending is not None:
            # Its request ends with the session (engine_disconnected); asked again later.
            self.due[pending.key] = None

    def close(self) -> None:
        """The daemon is stopping: nothing is asked any more."""
        self.cancelIdle()
        pending = self.current
        if pending is not None and pending.timer is not None and pending.timer.active():
            pending.timer.cancel()
