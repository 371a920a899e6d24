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

import uuid
from collections.abc import Sequence
from typing import Any

from rpmiddleware.builtin.memory.conversation import CHARACTER, Conversation, Entry
from rpmiddleware.builtin.memory.planner import flatten, wordsOf
from rpmiddleware.plugin import Envelope

SUMMARIZER_ID = "rpmiddleware-memory-summarizer"
REQUEST_PREFIX = "memory-summary-"
#: The card the summaries are asked of.
SUMMARIZER_CARD: dict[str, Any] = {
    "spec": "chara_card_v2",
    "spec_version": "2.0",
    "data": {
        "name": "Chronicler",
        "description": (
            "The Chronicler keeps the record of a conversation between a player and a "
            "character in a game. It writes short, plain summaries in the third person: "
            "who said what, names, places, promises, feelings and facts that matter later."
        ),
        "personality": "Exact, brief, neutral. Never invents anything.",
        "scenario": "The Chronicler is asked to update a running summary.",
        "first_mes": "",
        "mes_example": "",
        "creator_notes": "Used by rpmiddleware's memory plugin; never shown to players.",
        "system_prompt": (
            "You update a running summary of a conversation. Reply with the new summary "
            "only: no greeting, no heading, no commentary."
        ),
        "post_history_instructions": "",
        "alternate_greetings": [],
        "tags": [],
        "creator": "rpmiddleware",
        "character_version": "1",
        "extensions": {},
    },
}


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
    lines = []
    for entry in entries:
        said = wordsOf(entry, named=False)
        if said is not None:
            speaker = entry.speaker or (character if entry.role == CHARACTER else player)
            lines.append(f"{flatten(speaker)}: {said}")
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
    key = conversation.key
    envelope = Envelope.build(
        "reply.request",
        requestId=REQUEST_PREFIX + uuid.uuid4().hex,
        eventId=uuid.uuid4().hex,
        integrationId=key.integrationId,
        characterId=SUMMARIZER_ID,
        event={"text": eventText(conversation, entries, words, character, player)},
        output={"modalities": ["text"], "language": language},
        player={"displayName": "Game"},
        card=card,
    )
    envelope.meta["client"] = "memory"
    return envelope
