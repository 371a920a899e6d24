"""
What RPEngine does to the text its model generates, before the game sees it.

Written from the rules of RPEngine's C{crates/rp-engine-core/src/text.rs}:

  - display text hides expression tags (C{<laugh>}) and a tag still being
    streamed is held back until it closes;
  - speech is synthesised sentence by sentence, and a sentence is only
    handed to speech synthesis once the text after it has begun (the last
    one when generation ends);
  - buffered response processing runs regular-expression rules over the
    whole response, extracts captures under each rule's id and removes
    matches or captures from the text, the audio, both or neither.

RPEngine segments sentences with ICU4X and matches with Rust's C{regex}
crate; here Python approximates both (see L{sentenceBlocks} and
L{rustPattern}), which is close enough for the ordinary replies and
patterns a simulator sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rpmiddleware.protocol.sentences import sentenceBlocks, speakable

#: Limits of buffered response processing (text.rs).
MAX_RESPONSE_MATCHES = 64
MAX_RESPONSE_CAPTURE_BYTES = 4096


def displayText(source: str) -> str:
    """
    C{source} without expression tags: everything from a C{<} to the next
    C{>} is hidden, and an unclosed C{<} hides the rest (text.rs
    display_text_inner).
    """
    out: list[str] = []
    inTag = False
    for character in source:
        if character == "<":
            inTag = True
        elif character == ">":
            inTag = False
        elif not inTag:
            out.append(character)
    return "".join(out)


class DisplayTextStream:
    """
    Display text of a streamed response, delta by delta: the part of a
    chunk from an unclosed C{<} on waits for the next chunk (text.rs
    DisplayTextStreamCore).
    """

    def __init__(self) -> None:
        self._pending = ""

    def push(self, chunk: str) -> str:
        source = self._pending + chunk
        opened = source.rfind("<")
        if opened >= 0 and opened > source.rfind(">"):
            self._pending = source[opened:]
            return displayText(source[:opened])
        self._pending = ""
        return displayText(source)

    def finish(self) -> str:
        pending, self._pending = self._pending, ""
        return "" if pending.startswith("<") else displayText(pending)


def synthesisText(source: str, allowedTags: frozenset[str] = frozenset()) -> str:
    """
    What speech synthesis is given for C{source}: tags the voice model
    advertises kept (lowercased), other tags dropped, stray C{>} dropped,
    and everything from an unclosed C{<} on dropped (text.rs
    synthesis_text_inner).  The simulated voice advertises none.
    """
    out: list[str] = []
    index = 0
    while index < len(source):
        character = source[index]
        if character == "<":
            end = source.find(">", index + 1)
            if end < 0:
                break
            tag = source[index + 1 : end].strip().lower()
            if tag in allowedTags:
                out.append(f"<{tag}>")
            index = end + 1
            continue
        if character != ">":
            out.append(character)
        index += 1
    return "".join(out)


class ChangedText(ValueError):
    """
    Generated text no longer starts with what speech already consumed.
    """


class SpeechChunker:
    """
    Sentences of a growing response, each handed out once, numbered from
    zero (text.rs SpeechChunkerCore with a minimum of one character, as
    RPEngine's reply pipeline uses it).
    """

    def __init__(self) -> None:
        self._consumed = 0
        self._prefix = ""
        self._sequence = 0

    def update(self, text: str, final: bool) -> list[tuple[int, str]]:
        """
        The new sentences of C{text} (the whole response so far).

        @raise ChangedText: if C{text} rewrites what was already consumed.
        """
        if not text.startswith(self._prefix):
            raise ChangedText("the generated text changed after speech consumed part of it")
        blocks = sentenceBlocks(text[self._consumed :], final)
        chunks: list[tuple[int, str]] = []
        end = self._consumed
        for sentence, blockEnd in blocks:
            end = self._consumed + blockEnd
            trimmed = sentence.strip()
            if speakable(trimmed):
                chunks.append((self._sequence, trimmed))
                self._sequence += 1
        if blocks:
            self._consumed = end
            self._prefix = text[:end]
        return chunks


#: Rust's C{\\s}: Unicode White_Space.  Python's C{\\s} on a C{str} also
#: takes U+001C..U+001F, which Rust does not (found comparing the regex crate
#: at RPEngine's locked 1.13.0 with this module on 25,000 generated replies).
_RUST_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def rustPattern(pattern: str, flags: str) -> re.Pattern[str]:
    """
    Compile a Rust C{regex} pattern with Python's C{re}, translating what
    differs for ordinary patterns: C{(?<name>...)} groups, C{\\z}, C{$},
    which in Rust matches only at the very end unless multi-line, and
    C{\\s}/C{\\S}, which in Rust are Unicode White_Space exactly.

    @raise re.error: if Python cannot compile it.
    """
    multiline = "m" in flags
    out: list[str] = []
    index = 0
    inClass = False
    while index < len(pattern):
        character = pattern[index]
        if character == "\\" and index + 1 < len(pattern):
            escaped = pattern[index + 1]
            if escaped == "z" and not inClass:
                out.append(r"\Z")
            elif escaped == "s":
                out.append(_RUST_SPACE if inClass else f"[{_RUST_SPACE}]")
            elif escaped == "S" and not inClass:
                out.append(f"[^{_RUST_SPACE}]")
            else:
                out.append(pattern[index : index + 2])
            index += 2
            continue
        if inClass:
            if character == "]":
                inClass = False
            out.append(character)
        elif character == "[":
            inClass = True
            out.append(character)
            if pattern[index + 1 : index + 2] == "^":
                out.append("^")
                index += 1
            if pattern[index + 1 : index + 2] == "]":
                out.append("\\]")
                index += 1
        elif character == "$" and not multiline:
            out.append(r"\Z")
        elif pattern.startswith("(?<", index) and pattern[index + 3 : index + 4] not in ("=", "!"):
            out.append("(?P<")
            index += 3
            continue
        else:
            out.append(character)
        index += 1
    compiled = 0
    if "i" in flags:
        compiled |= re.IGNORECASE
    if multiline:
        compiled |= re.MULTILINE
    if "s" in flags:
        compiled |= re.DOTALL
    return re.compile("".join(out), compiled)


@dataclass(frozen=True)
class ResponseRule:
    id: str
    matcher: re.Pattern[str]
    captureGroup: int
    occurrence: str
    removal: str
    fromText: bool
    fromAudio: bool


@dataclass(frozen=True)
class ProcessedResponse:
    text: str
    audio: str
    extracted: dict[str, list[str]]


def _merged(spans: list[tuple[int, int]], source: str) -> str:
    """
    C{source} without the spans, overlapping ones merged (text.rs
    remove_spans).
    """
    if not spans:
        return source
    merged: list[list[int]] = []
    for start, end in sorted(spans, key=lambda span: span[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out: list[str] = []
    offset = 0
    for start, end in merged:
        out.append(source[offset:start])
        offset = end
    out.append(source[offset:])
    return "".join(out)


class ResponseProcessing:
    """
    Buffered response processing (text.rs parse_response_processing and
    ResponseProcessing::process).  The envelope's shape is checked by
    L{rpmiddleware.protocol.rules.checkEnvelope} when it arrives; L{parse}
    only compiles, and fails where Python cannot compile a pattern or a
    capture group does not exist.
    """

    def __init__(self, rules: list[ResponseRule]) -> None:
        self.rules = rules

    @classmethod
    def parse(cls, config: Any) -> ResponseProcessing | None:
        """
        @raise ValueError: for a configuration RPEngine would not run.
        """
        if config is None:
            return None
        if not isinstance(config, dict) or config.get("mode") != "buffered":
            raise ValueError("responseProcessing must be an object with mode buffered")
        rules: list[ResponseRule] = []
        for rule in config.get("rules") or []:
            if not isinstance(rule, dict) or not isinstance(rule.get("matcher"), dict):
                raise ValueError("each responseProcessing rule needs a matcher")
            matcher = rule["matcher"]
            ruleId = str(rule.get("id"))
            try:
                compiled = rustPattern(str(matcher.get("pattern")), str(matcher.get("flags", "")))
            except (re.error, RecursionError, OverflowError) as e:
                raise ValueError(f"rule {ruleId}: the pattern does not compile ({e})")
            group = rule.get("captureGroup")
            if type(group) is not int or not 0 <= group <= compiled.groups:
                raise ValueError(f"rule {ruleId}: capture group {group} does not exist")
            targets = rule.get("removeFrom") or []
            rules.append(
                ResponseRule(
                    ruleId,
                    compiled,
                    group,
                    str(rule.get("occurrence")),
                    str(rule.get("remove")),
                    "text" in targets,
                    "audio" in targets,
                )
            )
        if not rules:
            raise ValueError("responseProcessing needs at least one rule")
        return cls(rules)

    def _selected(self, rule: ResponseRule, source: str) -> list[re.Match[str]]:
        matches = rule.matcher.finditer(source)
        if rule.occurrence == "first":
            return [m for _, m in zip(range(1), matches, strict=False)]
        if rule.occurrence == "last":
            found = list(matches)
            return found[-1:]
        return [m for _, m in zip(range(MAX_RESPONSE_MATCHES), matches, strict=False)]

    def process(self, source: str) -> ProcessedResponse:
        extracted: dict[str, list[str]] = {}
        textSpans: list[tuple[int, int]] = []
        audioSpans: list[tuple[int, int]] = []
        for rule in self.rules:
            values: list[str] = []
            for match in self._selected(rule, source):
                capture = match.group(rule.captureGroup)
                if capture is not None and len(capture.encode()) <= MAX_RESPONSE_CAPTURE_BYTES:
                    values.append(capture)
                span: tuple[int, int] | None = None
                if rule.removal == "match":
                    span = match.span()
                elif rule.removal == "capture" and capture is not None:
                    span = match.span(rule.captureGroup)
                if span is not None:
                    if rule.fromText:
                        textSpans.append(span)
                    if rule.fromAudio:
                        audioSpans.append(span)
            extracted[rule.id] = values
        return ProcessedResponse(_merged(textSpans, source), _merged(audioSpans, source), extracted)
