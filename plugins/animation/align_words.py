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
#: Combining marks, which Python's \w leaves out: accents typed apart
#: (e + U+0301), Hebrew points, Arabic vowel marks, Thai vowels and tones
#: written above or below.  A word goes on through them.
_MARKS = (
    "\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670"
    "\u06d6-\u06ed\u0e31\u0e34-\u0e3a\u0e47-\u0e4e\u1ab0-\u1aff\u1dc0-\u1dff"
    "\u20d0-\u20ff\ufe20-\ufe2f"
)
_LETTER = f"(?:[^\\W_{_IDEOGRAPHS}]|[{_MARKS}])"
#: A word: one ideograph or kana, or letters, digits and marks joined by
#: inner apostrophes, hyphens, or the point or comma inside a number
#: (C{3.50}, C{don't}, C{well-known}).
WORD = re.compile(f"[{_IDEOGRAPHS}]|{_LETTER}+(?:(?:['’\\-]|(?<=\\d)[.,](?=\\d)){_LETTER}+)*")


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
