"""
The moderation plugin's local rules: words and regular expressions, found in
whole texts and in streamed text, and masking what they find.

A word split across two deltas is still caught because L{Rules.scan} says
how much of a stream may be emitted now: it holds back only the shortest tail
that could still become a match.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: Raw text already emitted that is kept to find matches that began in it.
CONTEXT_CHARS = 256
_WORD_CHAR = re.compile(r"\w")


@dataclass(frozen=True)
class Hit:
    """
    One rule matching C{text[start:end]}.
    """

    start: int
    end: int
    rule: str

    def describe(self) -> str:
        kind = "word" if self.rule.startswith("words") else "pattern"
        return f"it matched a blocked {kind} ({self.rule})"


class Rules:
    """
    The local rules, and where a stream of text may safely be cut.
    """

    def __init__(self, words: Sequence[str], patterns: Sequence[str], maxHold: int = 64) -> None:
        self._words = [w.lower() for w in words]
        self._longestWord = max((len(w) for w in words), default=0)
        self._maxHold = maxHold
        self._hasPatterns = bool(patterns)
        self._rules = [
            (f"words[{i}]", re.compile(rf"(?<!\w){re.escape(w)}(?!\w)", re.IGNORECASE))
            for i, w in enumerate(words)
        ] + [(f"patterns[{i}]", re.compile(p)) for i, p in enumerate(patterns)]

    def __bool__(self) -> bool:
        return bool(self._rules)

    def hits(self, text: str) -> list[Hit]:
        found = [
            Hit(m.start(), m.end(), name)
            for name, regex in self._rules
            for m in regex.finditer(text)
            if m.end() > m.start()
        ]
        return sorted(found, key=lambda h: (h.start, h.end))

    def scan(self, context: str, text: str, final: bool) -> tuple[int, list[Hit]]:
        """
        How much of C{text} may be emitted now, and the matches inside that
        part (clipped to it, relative to C{text}).

        @param context: raw text already emitted just before C{text}, so
            that word boundaries and matches that began there are seen.
        @param final: no more text follows: everything may be emitted.
        """
        full = context + text
        offset, end = len(context), len(full)
        hold = end
        confirmed = []
        for hit in self.hits(full):
            if hit.end <= offset:
                continue
            if not final and hit.end == end:
                # More text could still extend it or undo it ("darn" + "ed").
                hold = min(hold, max(hit.start, offset))
            else:
                confirmed.append(hit)
        if not final:
            hold = min(hold, self._possibleStart(full, offset))
        return hold - offset, [
            Hit(max(h.start, offset) - offset, min(h.end, hold) - offset, h.rule)
            for h in confirmed
            if max(h.start, offset) < hold
        ]

    def _possibleStart(self, full: str, offset: int) -> int:
        """
        The earliest position at or after C{offset} where a match could
        begin that more text would complete.
        """
        end = len(full)
        start = end
        for i in range(max(offset, end - self._longestWord + 1), end):
            if i > 0 and _WORD_CHAR.match(full[i - 1]):
                continue
            tail = full[i:].lower()
            if any(len(w) > len(tail) and w.startswith(tail) for w in self._words):
                start = i
                break
        if self._hasPatterns and end > offset and _WORD_CHAR.match(full[-1]):
            # Regular expressions cannot say what could still match: hold
            # the unfinished last word, as far back as max_hold_chars.
            word = end
            while word > max(offset, end - self._maxHold) and _WORD_CHAR.match(full[word - 1]):
                word -= 1
            start = min(start, word)
        return start


def masked(text: str, hits: Sequence[Hit], char: str) -> str:
    chars = list(text)
    for hit in hits:
        chars[hit.start : hit.end] = char * (hit.end - hit.start)
    return "".join(chars)


def maskedWhole(text: str, char: str) -> str:
    """
    A text the remote service flagged as a whole: every visible character.
    """
    return re.sub(r"\S", char, text)
