"""
Summaries that RPEngine writes: the request the memory plugin sends to have
the oldest exchanges of a conversation condensed, and what it reads back.

The request is the plugin's own: a text-only C{reply.request} for a
character of its own (L{SUMMARIZER_ID}, so that the character's card stays
the one RPEngine holds for it), whose event text holds the summary so far
and the exchanges to fold into it.  It is sized with RPEngine's estimate so
that it never meets C{prompt_too_large}.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.logger import Logger

from rpmiddleware.builtin.memory.conversation import CHARACTER, Conversation, Entry, Key
from rpmiddleware.builtin.memory.pauses import (
    PauseRequests,
    Pending,
    namesIn,
    ownCard,
    ownRequest,
    saidLines,
)
from rpmiddleware.builtin.memory.settings import MemorySettings
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.plugin import (
    TERMINAL,
    CardHasher,
    Envelope,
    IChainContext,
    textOfDelta,
)

SUMMARIZER_ID = "rpmiddleware-memory-summarizer"
REQUEST_PREFIX = "memory-summary-"
#: The card the summaries are asked of.
SUMMARIZER_CARD: dict[str, Any] = ownCard(
    name="Chronicler",
    description=(
        "The Chronicler keeps the record of a conversation between a player and a "
        "character in a game. It writes short, plain summaries in the third person: "
        "who said what, names, places, promises, feelings and facts that matter later."
    ),
    personality="Exact, brief, neutral. Never invents anything.",
    scenario="The Chronicler is asked to update a running summary.",
    systemPrompt=(
        "You update a running summary of a conversation. Reply with the new summary "
        "only: no greeting, no heading, no commentary."
    ),
)


def isSummaryRequest(requestId: Any) -> bool:
    return isinstance(requestId, str) and requestId.startswith(REQUEST_PREFIX)


def toCondense(conversation: Conversation, keepRecent: int, chunk: int) -> list[Entry]:
    """
    The oldest entries not yet summarized, leaving the newest C{keepRecent}
    tokens of them as they are, at most C{chunk} tokens of them: whole
    exchanges only, so that what is left never opens with the character
    answering a line the summary holds (the entry after the last chosen is
    never the character's).
    """
    pending = conversation.unsummarized()
    kept = 0
    cut = len(pending)
    while cut > 0 and kept + pending[cut - 1].tokens <= keepRecent:
        cut -= 1
        kept += pending[cut].tokens
    chosen: list[Entry] = []
    total = 0
    for entry in pending[:cut]:
        if chosen and total + entry.tokens > chunk:
            break
        chosen.append(entry)
        total += entry.tokens
    while chosen and len(chosen) < len(pending) and pending[len(chosen)].role == CHARACTER:
        chosen.pop()
    return chosen


def eventText(
    conversation: Conversation, entries: Sequence[Entry], words: int, character: str, player: str
) -> str:
    """
    What the summarizer is asked: the summary so far, the lines to fold in
    with who said each, and how long the new one may be.
    """
    character, player = character or "Character", player or "Player"
    lines = saidLines(entries, character, player)
    summary = conversation.summary.strip() or "(nothing yet)"
    return (
        f"The summary so far of the conversation between {player} and {character}:\n"
        f"{summary}\n\nWhat was said since:\n" + "\n".join(lines) + "\n\n"
        f"Write the updated summary in at most {words} words. Keep every name, fact, "
        "promise and open question; drop small talk."
    )


def summaryRequest(
    conversation: Conversation,
    entries: Sequence[Entry],
    words: int,
    character: str,
    player: str,
    card: dict[str, Any],
    language: str = "en",
) -> Envelope:
    """
    The request that asks RPEngine for the new summary (C{card}: the
    summarizer's card transfer).
    """
    return ownRequest(
        REQUEST_PREFIX,
        SUMMARIZER_ID,
        conversation,
        eventText(conversation, entries, words, character, player),
        {"modalities": ["text"], "language": language},
        card,
    )


@dataclass
class _Summary(Pending):
    parts: list[str] = field(default_factory=list)
    completed: str | None = None


class Summaries(PauseRequests[_Summary]):
    """
    The memory plugin's summary scheduling: which conversations are due to
    be condensed, the pause it waits for, the one summary request in
    flight, and what comes back of it (the rest is L{PauseRequests}').

    What it needs of the plugin is given to it as to L{PauseRequests};
    C{counts} is the plugin's counts (C{summaries}, C{summaryFailures}).
    """

    def __init__(
        self,
        *,
        reactor: Any,
        settings: MemorySettings,
        cards: CardHasher,
        busy: Callable[[], bool],
        storeFor: Callable[[Key], MemoryStore],
        counts: dict[str, int],
        context: Callable[[], IChainContext],
        log: Logger,
    ) -> None:
        super().__init__(
            reactor=reactor,
            settings=settings,
            cards=cards,
            ownCard=SUMMARIZER_CARD,
            busy=busy,
            storeFor=storeFor,
            counts=counts,
            context=context,
            log=log,
        )
        #: Called after every kick: what waits for the summaries' turn in the
        #: pauses (reflections) is scheduled then.
        self.then: Callable[[], None] = lambda: None

    def active(self) -> bool:
        """Whether a summary is asked, waits to be asked, or may be due."""
        waiting = self.idle is not None and self.idle.active()
        return self.current is not None or waiting or bool(self.due)

    def dueFor(self, key: Key) -> None:
        if self.settings.summaries and self.failures.get(key, 0) < 3:
            self.due[key] = None

    def forget(self, key: Key) -> None:
        """A conversation let go of: it is not condensed."""
        self.due.pop(key, None)

    def kept(self, key: Key) -> None:
        """A turn of a conversation was kept: its failures are forgiven."""
        self.failures.pop(key, None)

    def kick(self) -> None:
        """
        Once no player's turn waits, wait for a pause, then condense.
        """
        self.cancelIdle()
        if self.mayAsk():
            self.idle = self.reactor.callLater(self.settings.idle_seconds, self.summarizeNext)
        self.then()

    def summarizeNext(self) -> None:
        context = self.askingContext()
        if context is None:
            return
        while self.due:
            key = next(iter(self.due))
            del self.due[key]
            conversation = self.storeFor(key).cached(key)
            if conversation is None:
                continue  # let go of meanwhile: condensed at its next turn
            chosen = toCondense(
                conversation, self.settings.keep_recent_tokens, self.settings.summary_chunk_tokens
            )
            if chosen:
                self.send(context, conversation, chosen)
                return
        self.then()  # nothing to condense: the pause is the reflections'

    def send(self, context: IChainContext, conversation: Conversation, chosen: list[Any]) -> None:
        character, player = namesIn(chosen)
        envelope = summaryRequest(
            conversation,
            chosen,
            self.settings.summary_words,
            character or conversation.key.characterId,
            player,
            self.cardTransfer(),
        )
        summary = _Summary(envelope.requestId or "", conversation.key, chosen[-1].seq)
        self.ask(
            context,
            envelope,
            summary,
            self.settings.summary_timeout,
            self.timedOut,
            "condense",
            len(chosen),
        )

    def stop(self, context: IChainContext) -> None:
        summary = self.current
        if summary is not None and not summary.cancelled:
            self.cancel(context, summary)

    def timedOut(self, summary: _Summary) -> None:
        summary.timer = None
        if self.current is summary:
            self.failed(summary, "it took longer than summary_timeout")
            self.stop(self.context())

    def envelope(self, envelope: Envelope) -> None:
        summary = self.current
        if summary is None or summary.requestId != envelope.requestId:
            return
        kind = envelope.type
        if kind == "reply.text.delta":
            summary.parts.append(textOfDelta(envelope.fields))
        elif kind == "reply.text.completed" and isinstance(envelope.get("text"), str):
            summary.completed = envelope["text"]
        elif kind in TERMINAL:
            self.finished(summary)
            text = (
                summary.completed if summary.completed is not None else "".join(summary.parts)
            ).strip()
            conversation = self.storeFor(summary.key).cached(summary.key)
            if kind == "reply.completed" and not summary.cancelled and text and conversation:
                self.storeFor(summary.key).summarize(conversation, text, summary.through)
                self.counts["summaries"] += 1
                self.failures.pop(summary.key, None)
                if conversation.unsummarizedTokens() > self.settings.summarize_after_tokens:
                    self.dueFor(summary.key)
            elif not summary.cancelled:
                self.failed(summary, str(envelope.get("code") or kind))
            self.kick()

    def failed(self, summary: _Summary, why: str) -> None:
        self.counts["summaryFailures"] += 1
        self.failures[summary.key] = self.failures.get(summary.key, 0) + 1
        self.dueFor(summary.key)
        self.log.warn("RPEngine did not condense {key}: {why}", key=summary.key.asDict(), why=why)
