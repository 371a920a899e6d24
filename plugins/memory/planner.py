"""
Planning one request: the conversation so far, its summary, pinned facts and
world knowledge, fitted into RPEngine's prompt by RPEngine's own estimate.

RPEngine gives its model the card's C{mes_example} lines as chat messages
and the card's text fields as the system prompt
(L{rpmiddleware.protocol.prompt}), so that is where memory goes:

  - the conversation becomes C{mes_example} lines after the card's own
    examples (a C{<START>} between), one message per entry, the character's
    lines under the card's name (RPEngine's assistant role), everything else
    under another (the user role): newest last, the player's new line the
    user message, as RPEngine's core always has it;
  - the summary, the pinned facts and the knowledge placed after the
    character are added to the card's C{scenario}; knowledge placed
    C{before_char}, before its C{description};
  - the past moments recall found (L{rpmiddleware.builtin.memory.recall}),
    none of them in the history, end the C{scenario}, after the summary.

RPEngine keeps chat messages only while its running estimate stays within
its limit, and refuses the request when the mandatory blocks alone do not
fit.  So the plan is made with the same estimate, and everything it adds fits
in full: the mandatory part never grows past the limit because of memory
(recalled moments, then knowledge, then the summary, then facts give way
first), the newest exchange is always kept, and history is kept newest first
as a contiguous run back from the present, never cut from the middle.  What does not fit is
left for the summarizer to condense.  A turn whose words come as audio has
its transcript counted at L{Limits.spokenReserve} tokens, since its length is
unknown until RPEngine hears it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rpmiddleware.builtin.memory.clip import clip
from rpmiddleware.builtin.memory.conversation import (
    CHARACTER,
    EVENT,
    INTERRUPTED,
    OTHER,
    UNHEARD,
    Conversation,
    Entry,
)
from rpmiddleware.builtin.memory.lorebook import BEFORE_CHAR, activate
from rpmiddleware.builtin.memory.lorebook import Entry as LoreEntry
from rpmiddleware.builtin.memory.recall import Moment, Recalled, block, chosen, rank
from rpmiddleware.plugin import (
    estimateTokens,
    eventTokens,
    exampleMessages,
    limitOf,
    mandatoryBlocks,
    promptRequest,
    renderMacros,
    speakerKey,
    trimmed,
)

_START = re.compile("<START>", re.IGNORECASE)
#: A speaker label RPEngine reads: 1 to 80 characters, no colon.
MAX_LABEL = 80
#: What a line of the player's is shown as when nobody knows the words.
UNHEARD_TEXT = "(spoke, but the words were not heard)"
#: How an interrupted reply ends in the prompt.
CUT_OFF = " —"
#: What the model is shown of one pinned fact, in tokens by RPEngine's
#: estimate (a quarter token a character): a longer one would be clipped,
#: so the memory op and the Python API refuse it (L{MAX_FACT} characters).
FACT_TOKENS = 100
MAX_FACT = FACT_TOKENS * 4


@dataclass(frozen=True)
class Limits:
    """
    The budget a plan is made in (the memory plugin's settings).
    """

    #: RPEngine's limit (app.rs never sets maxInputTokens: 6000).
    maxInputTokens: int | None = None
    #: Tokens counted for a transcript RPEngine has not made yet.
    spokenReserve: int = 300
    summaryTokens: int = 600
    factsTokens: int = 400
    #: The knowledge budget when the card's book sets no token_budget.
    loreTokens: int = 1000


@dataclass
class Plan:
    """
    What one request is given: the card to send (C{None}: the game's card,
    unchanged), what was left out, and a report of every part with its
    estimated tokens (for the console, the timeline and tests).
    """

    card: dict[str, Any] | None
    report: dict[str, Any]
    #: Entries not summarized that did not fit: the summarizer's work.
    dropped: int = 0
    #: The card's C{data} fields the plan sets (all strings).
    changes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Line:
    label: str
    content: str
    tokens: int
    seq: int = 0


def flatten(text: str) -> str:
    """
    One line of prompt text: white space folded, and C{<START>} (which
    would split RPEngine's examples) defused.
    """
    return _START.sub("(START)", " ".join(text.split()))


def labels(character: str) -> tuple[str, str] | None:
    """
    The speaker labels for the character's lines and everyone else's, or
    C{None} when the card's name cannot label a line (empty, a colon, or
    longer than RPEngine reads).
    """
    if not character or ":" in character or len(character) > MAX_LABEL:
        return None
    other = "Player" if speakerKey("Player") != speakerKey(character) else "User"
    return character, other


def wordsOf(entry: Entry, named: bool = True) -> str | None:
    """
    What one entry says, as one line of prompt text, or C{None} for one
    with nothing to say.  Another character's line is said with its
    speaker's name (RPEngine gives the model only the words of a line, not
    its label), unless C{named} is false.
    """
    words = _words(entry.role, entry.status, entry.text)
    if named and words is not None and entry.role == OTHER and entry.speaker:
        return f"{flatten(entry.speaker)}: {words}"
    return words


@functools.lru_cache(maxsize=16384)
def _words(role: str, status: str, text: str) -> str | None:
    # Every turn plans the same recent entries again: each is read once.
    if status == UNHEARD:
        return UNHEARD_TEXT
    text = flatten(text)
    if not text:
        return None
    if role in (CHARACTER, OTHER):
        return text + (CUT_OFF if status == INTERRUPTED else "")
    if role == EVENT:
        return f"[Game event] {text}"
    return text


def lineOf(entry: Entry, names: tuple[str, str]) -> tuple[str, str] | None:
    """
    The label and words of one entry in C{mes_example} (C{names}: the
    character's label and everyone else's), or C{None}.
    """
    words = wordsOf(entry)
    if words is None:
        return None
    return (names[0] if entry.role == CHARACTER else names[1]), words


def _tokens(content: str, character: str, player: str) -> int:
    # RPEngine estimates each message after rendering its macros.
    if "{" in content or "<" in content:
        content = renderMacros(content, character, player)
    return estimateTokens(content)


def _section(title: str, body: str) -> str:
    return f"[{title}]\n{body}" if body else ""


def _joined(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


@dataclass
class _Budget:
    """
    The request as RPEngine will see it before memory is added, and the
    tokens its limit leaves.
    """

    request: dict[str, Any]
    limit: int
    #: The card's mandatory blocks as the game sent it.
    blocks: list[Any]
    player: str
    eventTokens: int
    #: The mandatory blocks and the event: what RPEngine needs at least.
    base: int
    #: What the limit leaves after C{base}: memory's room.
    available: int

    @property
    def blockTokens(self) -> int:
        return self.base - self.eventTokens


@dataclass
class _Mandatory:
    """
    What memory adds to the card's text fields, and what it costs.
    """

    #: The card's fields changed (description, scenario).
    changed: dict[str, str]
    #: The mandatory blocks with those changes.
    planned: list[Any]
    #: Tokens the changes add to the mandatory blocks.
    added: int
    kept: list[LoreEntry]
    left: list[LoreEntry]
    summary: str
    factText: str
    attitude: str = ""
    recalled: Sequence[Moment] = ()


def plan(
    fields: Mapping[str, Any],
    card: Mapping[str, Any],
    conversation: Conversation,
    lore: Sequence[LoreEntry],
    limits: Limits,
    spoken: bool,
    scanDepth: int,
    loreBudget: int | None,
    recursive: bool,
    attitude: str = "",
    recalled: Recalled | None = None,
) -> Plan:
    """
    The plan for one request of C{conversation}.

    @param fields: the request's fields (its prompt fields, output, player).
    @param card: the Character Card V2 the game sent.
    @param lore: the knowledge that may activate (the card's book, the game's).
    @param spoken: whether the player's words come as audio, unknown yet.
    @param attitude: the character's attitude to the player in one line
        (L{rpmiddleware.builtin.memory.attitude}), or "".
    @param recalled: what the store found for recall
        (L{rpmiddleware.builtin.memory.recall}), or C{None}.
    """
    data = card.get("data")
    if not isinstance(data, Mapping):
        return Plan(None, {"skipped": "the card has no data"})
    character = trimmed(data.get("name"))
    names = labels(character)
    if names is None:
        return Plan(None, {"skipped": "the card's name cannot label conversation lines"})
    budget = _measureBudget(fields, card, limits, spoken)
    report: dict[str, Any] = {
        "limit": budget.limit,
        "eventTokens": budget.eventTokens,
        "spoken": spoken,
    }
    if budget.base > budget.limit:
        report["skipped"] = f"the card and the event alone need about {budget.base} tokens"
        return Plan(None, report)
    available = budget.available

    lines, pending = _recentLines(conversation, names, character, budget.player, available)
    newest = min(available, sum(line.tokens for line in lines[-2:]))
    # The mandatory additions, within what the newest exchange leaves.
    factText = _pinnedFacts(conversation, limits.factsTokens)
    summary = clip(conversation.summary.strip(), limits.summaryTokens)
    recent = [line.content for line in lines[-scanDepth:]] if scanDepth else []
    scanned = [trimmed(_eventText(fields)), *recent]
    loreTokens = min(loreBudget or limits.loreTokens, max(0, available - newest))
    kept, left = activate(lore, scanned, recursive, loreTokens)
    mandatory = _fitMandatory(
        data, budget, kept, left, summary, factText, room=available - newest, attitude=attitude
    )
    room = available - mandatory.added

    history, spent = _keptHistory(lines, room)
    if recalled is not None and recalled.found and recalled.tokens and recalled.count:
        # Moments from before the history (never one it holds), fitted
        # beside the rest: they give way first, before the newest exchange.
        before = history[0].seq if history else conversation.nextSeq
        ranked = rank(conversation, recalled.found, before, character, budget.player)
        moments = chosen(ranked, recalled.tokens, recalled.count)
        if moments:
            mandatory = _fitMandatory(
                data,
                budget,
                kept,
                left,
                summary,
                factText,
                room=available - newest,
                attitude=attitude,
                recalled=moments,
            )
            room = available - mandatory.added
            history, spent = _keptHistory(lines, room)
    changed = mandatory.changed
    examples = _keptExamples(data, character, budget.player, room - spent)
    conversationText = "\n".join(f"{line.label}: {line.content}" for line in history)
    started = f"<START>\n{conversationText}" if history else ""
    if examples is not None:
        changed["mes_example"] = _joined(examples[0], started)
    else:
        changed["mes_example"] = started
    newCard = {**card, "data": {**data, **changed}}
    report.update(_report(budget, mandatory, conversation, pending, history, spent, examples))
    return Plan(newCard, report, pending - len(history), changed)


def _measureBudget(
    fields: Mapping[str, Any], card: Mapping[str, Any], limits: Limits, spoken: bool
) -> _Budget:
    """
    The request RPEngine will be sent, its limit, and what the card and the
    event need of it before any memory.
    """
    # A spoken turn's words are counted as a transcript of the reserve's size.
    transcript = "w" * (4 * limits.spokenReserve) if spoken else None
    request = promptRequest(fields, card, transcript)
    limit = limits.maxInputTokens or limitOf(request)
    request["maxInputTokens"] = limit
    blocks = mandatoryBlocks(request)
    player = trimmed(request.get("playerDisplayName")) or "Player"
    event = eventTokens(request)
    base = sum(b.tokens for b in blocks) + event
    return _Budget(request, limit, blocks, player, event, base, limit - base)


def _recentLines(
    conversation: Conversation,
    names: tuple[str, str],
    character: str,
    player: str,
    available: int,
) -> tuple[list[_Line], int]:
    """
    The conversation's lines not yet summarized, oldest first, reaching no
    further back than could ever fit in C{available}; and how many entries
    are not summarized (all of them, read or not).
    """
    # Newest first, and no further back than could ever fit: a long
    # conversation costs what fits, not what it holds.
    lines: list[_Line] = []
    pending = 0  # entries not summarized
    reach = 0
    for entry in reversed(conversation.entries):
        if entry.seq <= conversation.summarizedThrough:
            break
        pending += 1
        if reach > available:
            continue
        said = lineOf(entry, names)
        if said is not None:
            line = _Line(said[0], said[1], _tokens(said[1], character, player), entry.seq)
            lines.append(line)
            reach += line.tokens
    lines.reverse()
    return lines, pending


def _pinnedFacts(conversation: Conversation, factsTokens: int) -> str:
    """
    The conversation's pinned facts as a list, each clipped, as many as fit
    in C{factsTokens} in the order they were pinned.
    """
    factText = ""
    used = 0
    for f in conversation.facts:
        fact = f"- {clip(flatten(f.text), FACT_TOKENS)}"
        cost = estimateTokens("\n" + fact)
        if used + cost > factsTokens:
            break
        factText = f"{factText}\n{fact}" if factText else fact
        used += cost
    return factText


def _memoryFields(
    data: Mapping[str, Any],
    kept: list[LoreEntry],
    summary: str,
    factText: str,
    attitude: str = "",
    recalled: Sequence[Moment] = (),
) -> dict[str, str]:
    """
    The card's text fields with memory added: knowledge placed before the
    character ahead of its description; the rest of the knowledge, the
    facts and the summary after its scenario.
    """
    before = "\n".join(e.content for e in kept if e.position == BEFORE_CHAR)
    after = "\n".join(e.content for e in kept if e.position != BEFORE_CHAR)
    changed: dict[str, str] = {}
    if before:
        changed["description"] = _joined(before, trimmed(data.get("description")))
    scenario = _joined(
        trimmed(data.get("scenario")),
        _section("World knowledge", after),
        _section("Facts to remember", factText),
        flatten(attitude),
        _section("Earlier in this conversation", summary),
        _section(f"What {trimmed(data.get('name'))} remembers", block(recalled)),
    )
    if scenario != trimmed(data.get("scenario")):
        changed["scenario"] = scenario
    return changed


def _fitMandatory(
    data: Mapping[str, Any],
    budget: _Budget,
    kept: list[LoreEntry],
    left: list[LoreEntry],
    summary: str,
    factText: str,
    room: int,
    attitude: str = "",
    recalled: Sequence[Moment] = (),
) -> _Mandatory:
    """
    Memory's additions to the mandatory blocks, made to fit in C{room}:
    recalled moments give way first (the least relevant first), then
    knowledge (the least important), then the summary is
    shortened, then facts go, then the attitude line.  When nothing is left to give, what remains is
    returned even if it does not fit.
    """
    # Recalled moments give way first, the least relevant first.
    recalled = list(recalled)
    while True:
        changed = _memoryFields(data, kept, summary, factText, attitude, recalled)
        planned = mandatoryBlocks({**budget.request, "card": {"data": {**data, **changed}}})
        added = sum(b.tokens for b in planned) - budget.blockTokens
        if added <= room:
            break
        if recalled:
            recalled.pop()
        elif kept:
            worst = min(range(len(kept)), key=lambda i: (kept[i].priority, -i))
            left.append(kept.pop(worst))
        elif summary:
            # Halved each time, then gone.
            summary = clip(summary, estimateTokens(summary) // 2) if len(summary) > 64 else ""
        elif factText:
            factText = "\n".join(factText.split("\n")[:-1])
        elif attitude:
            attitude = ""
        else:
            break
    return _Mandatory(changed, planned, added, kept, left, summary, factText, attitude, recalled)


def _keptHistory(lines: list[_Line], room: int) -> tuple[list[_Line], int]:
    """
    The newest lines that fit in C{room}, a contiguous run back from the
    present, oldest first; and their tokens.
    """
    history: list[_Line] = []
    spent = 0
    for line in reversed(lines):
        if spent + line.tokens > room:
            break
        history.append(line)
        spent += line.tokens
    history.reverse()
    return history, spent


def _keptExamples(
    data: Mapping[str, Any], character: str, player: str, room: int
) -> tuple[str, int] | None:
    """
    The card's own C{mes_example} and its tokens when it fits in C{room}
    beside the history, else C{None} (the history goes first).
    """
    own = trimmed(data.get("mes_example"))
    if not own:
        return None
    examples = exampleMessages(own, character, player)
    tokens = sum(estimateTokens(content) for _, content in examples)
    return (own, tokens) if tokens <= room else None


def _report(
    budget: _Budget,
    mandatory: _Mandatory,
    conversation: Conversation,
    pending: int,
    history: list[_Line],
    spent: int,
    examples: tuple[str, int] | None,
) -> dict[str, Any]:
    """
    Every part of the plan with its estimated tokens.
    """
    exampleTokens = examples[1] if examples is not None else 0
    return {
        "blocks": [{"id": b.id, "estimatedTokens": b.tokens} for b in mandatory.planned],
        "mandatoryTokens": budget.blockTokens + mandatory.added,
        "memoryTokens": mandatory.added,
        "history": {
            "kept": len(history),
            "dropped": pending - len(history),
            "summarized": len(conversation.entries) - pending,
            "estimatedTokens": spent,
        },
        "summary": {
            "included": bool(mandatory.summary),
            "estimatedTokens": estimateTokens(mandatory.summary),
        },
        "facts": {"included": mandatory.factText.count("\n") + 1 if mandatory.factText else 0},
        "recall": {
            "moments": len(mandatory.recalled),
            "estimatedTokens": sum(m.tokens for m in mandatory.recalled),
        },
        "attitude": {
            "included": bool(mandatory.attitude),
            "estimatedTokens": estimateTokens(mandatory.attitude),
        },
        "lore": {
            "kept": [e.asDict() for e in mandatory.kept],
            "left": [e.asDict() for e in mandatory.left],
        },
        "examples": {"kept": examples is not None, "estimatedTokens": exampleTokens},
        "estimatedTokens": budget.base + mandatory.added + spent + exampleTokens,
    }


def _eventText(fields: Mapping[str, Any]) -> str:
    event = fields.get("event")
    text = event.get("text") if isinstance(event, Mapping) else None
    return text if isinstance(text, str) else ""


__all__ = [
    "Limits",
    "Plan",
    "flatten",
    "labels",
    "lineOf",
    "plan",
    "wordsOf",
]
