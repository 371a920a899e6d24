"""
What RPEngine gives its model for one request, worked out as RPEngine does.

RPEngine keeps no conversation: every request's model invocation is built
from that request alone (``crates/rp-engine-core/src/prompt.rs``,
``assemble_prompt_value``, called by ``app.rs`` ``begin_gemma``;
``src/gemma.worker.ts`` hands the model ``[system, ...history]`` and the
event text as the user message).  The system prompt is a list of mandatory
blocks taken from the card and the request; the card's ``mes_example`` lines
become optional chat messages, each kept, in order, only while RPEngine's
running estimate (a quarter token per character, rounded up per block) stays
within the limit.  Mandatory blocks and the event text over the limit fail
the request with ``prompt_too_large``.

The memory plugin plans every request with this module, so that what it adds
always fits, and the simulator assembles with it, so a game's tests see what
the model would be given.  Only the rules are RPEngine's: the wording of
RPEngine's own instruction lines (the response-mode line, the fallback system
line, the expression-tag and language lines) is not reproduced; each is
written here in our words and counted at the length RPEngine's has
(``_Fixed``), so every estimate is RPEngine's.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: app.rs never sets C{maxInputTokens}, so prompt.rs's default holds.
DEFAULT_MAX_INPUT_TOKENS = 6000
#: The tags RPEngine's speech model offers (src/expression.ts), which app.rs
#: passes to the prompt of a spoken reply.
SPEECH_EXPRESSION_TAGS = ("laugh", "breath", "sigh")
#: prompt.rs's language names (its language_name table); other codes stay as given.
LANGUAGE_NAMES = {
    "en": "English",
    "ko": "Korean",
    "es": "Spanish",
    "pt": "Portuguese",
    "fr": "French",
    "de": "German",
    "it": "Italian",
    "pl": "Polish",
    "ru": "Russian",
    "nl": "Dutch",
    "cs": "Czech",
    "ar": "Arabic",
    "zh": "Simplified Chinese",
    "ja": "Japanese",
    "hu": "Hungarian",
    "tr": "Turkish",
    "fi": "Finnish",
    "sk": "Slovak",
    "da": "Danish",
    "hr": "Croatian",
    "el": "Greek",
    "sv": "Swedish",
    "nb": "Norwegian",
    "he": "Hebrew",
    "uk": "Ukrainian",
    "id": "Indonesian",
    "ms": "Malay",
    "vi": "Vietnamese",
    "th": "Thai",
    "ro": "Romanian",
    "bg": "Bulgarian",
}

#: Unicode White_Space, what Rust's C{str::trim} and its regex C{\s} mean
#: (Python's C{str.strip} also strips U+001C to U+001F).
WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_SPACE_CLASS = "[" + re.escape(WHITE_SPACE) + "]"
_CHAR = re.compile(r"\{\{" + _SPACE_CLASS + r"*char" + _SPACE_CLASS + r"*\}\}", re.IGNORECASE)
_USER = re.compile(r"\{\{" + _SPACE_CLASS + r"*user" + _SPACE_CLASS + r"*\}\}", re.IGNORECASE)
# Rust's case folding pairs i only with I; Python's also with dotless ı and İ.
_ORIGINAL = re.compile(
    r"\{\{" + _SPACE_CLASS + r"*original" + _SPACE_CLASS + r"*\}\}", re.IGNORECASE | re.ASCII
)
_CHAR_TAG = re.compile("<CHAR>", re.IGNORECASE)
_USER_TAG = re.compile("<USER>", re.IGNORECASE)
_START = re.compile("<START>", re.IGNORECASE)
_EXAMPLE_LINE = re.compile(r"^([^:\n]{1,80}):" + _SPACE_CLASS + r"*(.+)$", re.DOTALL)
#: prompt.rs's tag pattern, case-insensitive as Rust folds (ſ and the Kelvin
#: sign fold to s and k; nothing else outside ASCII).
_TAG_NAME = re.compile("[a-zA-Z\u017f\u212a][a-zA-Z0-9_\u017f\u212a-]*")


class _Fixed:
    """
    The lengths, in characters, of RPEngine's own instruction lines around
    the names they hold (prompt.rs), so that our wording is counted as
    RPEngine's would be.
    """

    VOICE_MODE = 189  # + the character's name once
    TEXT_MODE = 99  # + the character's name once
    FALLBACK = 70  # + the character's name twice and the player's once
    TAGS = 101  # + the tags, each in angle brackets, joined by ", "
    LANGUAGE = 12  # + the language's name
    SCENE_HEADING = 21  # + the promptScene's sceneLine
    #: app.rs begin_gemma, between typed text and a transcript.
    SPOKEN_JOIN = 32


class PromptTooLarge(ValueError):
    """
    The mandatory blocks and the event text alone are over the limit:
    RPEngine fails the request with C{prompt_too_large}.
    """

    def __init__(self, tokens: int, limit: int) -> None:
        self.tokens = tokens
        self.limit = limit
        super().__init__(f"the mandatory prompt needs about {tokens} tokens; the limit is {limit}")


@dataclass(frozen=True)
class PromptBlock:
    """
    One block of a prompt, with RPEngine's estimate of its size.
    """

    id: str
    content: str
    mandatory: bool
    included: bool
    tokens: int

    def asDict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "mandatory": self.mandatory,
            "included": self.included,
            "estimatedTokens": self.tokens,
        }


@dataclass(frozen=True)
class AssembledPrompt:
    """
    What the model is given: the system prompt, the chat messages before the
    event (C{(role, content)}, role C{"user"} or C{"assistant"}), the event
    text as the user message; the blocks and the estimate they add up to.
    """

    system: str
    user: str
    history: tuple[tuple[str, str], ...]
    blocks: tuple[PromptBlock, ...]
    tokens: int
    limit: int

    @property
    def droppedExamples(self) -> int:
        return sum(1 for b in self.blocks if b.id == "example" and not b.included)

    def asDict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "user": self.user,
            "history": [{"role": r, "content": c} for r, c in self.history],
            "blocks": [b.asDict() for b in self.blocks],
            "estimatedTokens": self.tokens,
            "limit": self.limit,
        }


def estimateTokens(text: str) -> int:
    """
    RPEngine's estimate: a token per four characters (Unicode scalar
    values), rounded up.
    """
    return _estimateLength(len(text))


def _estimateLength(length: int) -> int:
    # The estimate of a text known by its length alone (a block whose
    # rendering is measured, not built): the one place the rule is written.
    return math.ceil(length / 4)


def trimmed(value: Any) -> str:
    """
    A string field as prompt.rs reads it: trimmed, or empty when absent or
    not a string.
    """
    return value.strip(WHITE_SPACE) if isinstance(value, str) else ""


def renderMacros(text: str, character: str, player: str) -> str:
    """
    C{{{char}}}, C{{{user}}}, C{<CHAR>} and C{<USER>}, any case, become the
    names, in that order.
    """
    text = _CHAR.sub(lambda _: character, text)
    text = _USER.sub(lambda _: player, text)
    text = _CHAR_TAG.sub(lambda _: character, text)
    return _USER_TAG.sub(lambda _: player, text)


def speakerKey(name: str) -> str:
    """
    How a speaker's name is compared with the card's: decomposed, marks
    removed, each character lower-cased on its own.
    """
    decomposed = unicodedata.normalize("NFD", name)
    return "".join(c.lower() for c in decomposed if not unicodedata.category(c).startswith("M"))


def _lines(section: str) -> Iterable[str]:
    """Rust's C{str::lines}: split at line feeds, one trailing CR dropped."""
    parts = section.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    for part in parts:
        yield part[:-1] if part.endswith("\r") else part


def exampleMessages(source: str, character: str, player: str) -> list[tuple[str, str]]:
    """
    The chat messages a card's C{mes_example} becomes: sections split at
    C{<START>}, each line C{Speaker: words} a message, the assistant's
    when the speaker is the card's character, else the user's.
    """
    rendered = renderMacros(source, character, player)
    characterKey = speakerKey(character)
    messages = []
    for section in _START.split(rendered):
        for raw in _lines(section):
            match = _EXAMPLE_LINE.match(raw.strip(WHITE_SPACE))
            if match is None:
                continue
            speaker = match.group(1).strip(WHITE_SPACE)
            content = match.group(2).strip(WHITE_SPACE)
            role = "assistant" if speakerKey(speaker) == characterKey else "user"
            messages.append((role, content))
    return messages


def languageName(code: str) -> str:
    # Rust's to_ascii_lowercase: only ASCII letters change.
    return LANGUAGE_NAMES.get(code.translate(_ASCII_LOWER), code)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def promptRequest(
    fields: Mapping[str, Any],
    card: Mapping[str, Any],
    transcript: str | None = None,
    expressionTags: Sequence[str] = SPEECH_EXPRESSION_TAGS,
) -> dict[str, Any]:
    """
    The prompt request app.rs C{begin_gemma} builds from a C{reply.request}'s
    fields, the card RPEngine resolved for it, and the transcript of its
    recording, if any.  (A request with neither is RPEngine's
    C{request_failed} before any prompt is made.)
    """
    event = fields.get("event")
    text = trimmed(event.get("text") if isinstance(event, Mapping) else None)
    spoken = trimmed(transcript)
    if text and spoken:
        eventText = f"{text}\n\nWhat the player said aloud:\n{spoken}"
    else:
        eventText = text or spoken
    output = fields.get("output")
    output = output if isinstance(output, Mapping) else {}
    modalities = output.get("modalities")
    voice = isinstance(modalities, list) and "audio" in modalities
    player = fields.get("player")
    language = output.get("language")
    return {
        "card": card,
        "eventText": eventText,
        "eventTextJoined": bool(text and spoken),
        "playerDisplayName": player.get("displayName") if isinstance(player, Mapping) else None,
        "outputMode": "voice" if voice else "text",
        "language": language if isinstance(language, str) else "en",
        "expressionTags": list(expressionTags) if voice else [],
        "interactionMode": fields.get("interactionMode"),
        "promptScene": fields.get("promptScene"),
        "promptDirective": fields.get("promptDirective"),
    }


@dataclass(frozen=True)
class _Names:
    character: str
    player: str

    def render(self, text: str) -> str:
        return renderMacros(text.strip(WHITE_SPACE), self.character, self.player)


def _names(request: Mapping[str, Any]) -> _Names:
    if not isinstance(request, Mapping):
        raise ValueError("the prompt request must be an object")
    card = request.get("card")
    data = card.get("data") if isinstance(card, Mapping) else None
    if not isinstance(data, Mapping):
        raise ValueError("the prompt request's card has no data")
    player = trimmed(request.get("playerDisplayName")) or "Player"
    return _Names(trimmed(data.get("name")), player)


def _sceneContext(request: Mapping[str, Any], names: _Names) -> tuple[str, int, str] | None:
    """
    The scene-context block (its text, its estimate) and the mode's guide,
    when the request has all three prompt fields and neither comes out
    empty (prompt.rs prompt_context).
    """
    mode = request.get("interactionMode")
    scene = request.get("promptScene")
    directive = request.get("promptDirective")
    if not (
        isinstance(mode, str) and isinstance(scene, Mapping) and isinstance(directive, Mapping)
    ):
        return None
    configured = trimmed(directive.get("sceneContext"))
    if configured:
        context = names.render(configured)
        size = len(context)
    else:
        raw = trimmed(scene.get("sceneLine"))
        line = names.render(raw)
        context = f"[Scene]\n{line}"
        # RPEngine trims the heading and line together: an empty line takes
        # the heading's line feed with it.
        size = _Fixed.SCENE_HEADING + len(line) if raw else _Fixed.SCENE_HEADING - 1
    guide = trimmed(directive.get("autoEventGuide" if mode == "auto_event" else "directUserGuide"))
    if not guide:
        return None
    return context, size, names.render(guide)


def mandatoryBlocks(request: Mapping[str, Any]) -> list[PromptBlock]:
    """
    The system prompt's blocks, in prompt.rs's order, empty ones left out.
    """
    names = _names(request)
    data = request["card"]["data"]
    character, player = names.character, names.player
    blocks: list[PromptBlock] = []

    def add(id: str, content: str, size: int | None = None) -> None:
        if content:
            length = len(content) if size is None else size
            blocks.append(PromptBlock(id, content, True, True, _estimateLength(length)))

    fallback = f"Play {character} true to the card, speaking to {player} as {character}."
    fallbackSize = _Fixed.FALLBACK + 2 * len(character) + len(player)
    system = trimmed(data.get("system_prompt"))
    if system:
        rendered = names.render(system)
        originals = _ORIGINAL.findall(rendered)
        add(
            "system",
            _ORIGINAL.sub(lambda _: fallback, rendered),
            len(rendered) - sum(map(len, originals)) + len(originals) * fallbackSize,
        )
    else:
        add("system", fallback, fallbackSize)
    for field in ("description", "personality", "scenario"):
        add(field, names.render(trimmed(data.get(field))))
    scene = _sceneContext(request, names)
    if scene is not None:
        add("scene_context", scene[0], scene[1])
        add("interaction_guide", scene[2])
    voice = request.get("outputMode") == "voice"
    if voice:
        add(
            "response_mode",
            f"Answer only with the words {character} says aloud, briefly and plainly.",
            _Fixed.VOICE_MODE + len(character),
        )
    else:
        add(
            "response_mode",
            f"Answer briefly as {character}, in character.",
            _Fixed.TEXT_MODE + len(character),
        )
    given = request.get("expressionTags")
    tags = [
        t
        for t in (given if isinstance(given, list) else ())
        if isinstance(t, str) and _TAG_NAME.fullmatch(t)
    ]
    if voice and tags:
        listed = ", ".join(f"<{t}>" for t in tags)
        add("expression", f"Expression tags you may use: {listed}.", _Fixed.TAGS + len(listed))
    post = trimmed(data.get("post_history_instructions"))
    if post:
        add("post_history", _ORIGINAL.sub("", names.render(post)))
    language = request.get("language")
    name = languageName(language if isinstance(language, str) else "en")
    add("language", f"Language: {name}.", _Fixed.LANGUAGE + len(name))
    return blocks


def eventTokens(request: Mapping[str, Any]) -> int:
    text = trimmed(request.get("eventText"))
    size = len(text)
    if request.get("eventTextJoined"):
        size += _Fixed.SPOKEN_JOIN - len("\n\nWhat the player said aloud:\n")
    return _estimateLength(size)


def limitOf(request: Mapping[str, Any]) -> int:
    limit = request.get("maxInputTokens")
    # serde_json reads a number past u64 as a float, which as_u64 refuses.
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < 2**64:
        return limit
    return DEFAULT_MAX_INPUT_TOKENS


def assemble(request: Mapping[str, Any]) -> AssembledPrompt:
    """
    The model invocation for C{request} (a L{promptRequest}), as RPEngine
    assembles it.

    @raise PromptTooLarge: when the mandatory blocks and the event text are
        over the limit.
    @raise ValueError: for a request without a card.
    """
    blocks = mandatoryBlocks(request)
    limit = limitOf(request)
    total = sum(b.tokens for b in blocks) + eventTokens(request)
    if total > limit:
        raise PromptTooLarge(total, limit)
    names = _names(request)
    history = []
    examples = []
    source = trimmed(request["card"]["data"].get("mes_example"))
    for role, content in exampleMessages(source, names.character, names.player):
        tokens = estimateTokens(content)
        included = total + tokens <= limit
        examples.append(PromptBlock("example", content, False, included, tokens))
        if included:
            total += tokens
            history.append((role, content))
    system = "\n\n".join(b.content for b in blocks)
    return AssembledPrompt(
        system,
        trimmed(request.get("eventText")),
        tuple(history),
        tuple(blocks + examples),
        total,
        limit,
    )
