"""
The words of a sentence, with their places in its text in code points.

Alignment speaks of words by their Unicode code-point offsets into the text
it was given (Python's own string indices), so that marks can point into a
line's display text whatever its script.  Expression tags in angle brackets
(C{<laugh>}) are not words: a voice renders them as sounds, not as mouth
shapes, and display text drops them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: An expression tag, as RPEngine writes them: C{<laugh>}, C{</emotion>}.
TAG = re.compile(r"</?[A-Za-z][\w-]*(?:\s[^<>]*)?>")

#: Chinese characters and Japanese kana: written without spaces, each is a
#: word of its own (a syllable), so that word marks move through the line.
_IDEOGRAPHS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
#: A word: one ideograph or kana, or letters, digits and marks joined by
#: inner apostrophes, hyphens, or the point or comma inside a number
#: (C{3.50}, C{don't}, C{well-known}).
WORD = re.compile(
    f"[{_IDEOGRAPHS}]"
    f"|[^\\W_{_IDEOGRAPHS}]+(?:(?:['’\\-]|(?<=\\d)[.,](?=\\d))[^\\W_{_IDEOGRAPHS}]+)*"
)


@dataclass(frozen=True)
class Word:
    """One word of a sentence: as written, and where."""

    text: str
    start: int
    end: int


def blankTags(text: str) -> str:
    """
    The text with every expression tag replaced by as many spaces, so that
    every other character keeps its offset.
    """
    return TAG.sub(lambda match: " " * len(match.group(0)), text)


def wordsOf(text: str) -> list[Word]:
    """The words of C{text} in order, tags left out."""
    return [
        Word(match.group(0), match.start(), match.end()) for match in WORD.finditer(blankTags(text))
    ]
