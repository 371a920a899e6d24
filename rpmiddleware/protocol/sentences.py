"""
Where RPEngine's speech cuts a reply into sentences.

RPEngine synthesises its reply one sentence at a time, and sends each as one
audio segment (C{segmentSequence}): the speakable sentences of the generated
text, numbered from zero, each handed to speech once the text after it has
begun (C{crates/rp-engine-core/src/text.rs} C{sentence_blocks},
C{SpeechChunkerCore}).  RPEngine finds sentences with ICU4X (Unicode UAX
#29); the rules here approximate them (see L{sentenceBlocks}), close enough
for ordinary replies.  The simulator cuts its speech with them, and the
memory plugin finds which sentences of a reply a number of played samples
said.
"""

from __future__ import annotations

import re


def speakable(text: str) -> bool:
    """
    Whether C{text} has anything to say: a letter or digit (text.rs).
    """
    return any(character.isalnum() for character in text)


# Sentence boundaries, approximating ICU's (Unicode UAX #29) rules: a break
# after a paragraph separator; after CJK full stops and marks with any
# closing punctuation; after Latin terminators with closing punctuation
# when whitespace follows -- except after a full stop when the next letter
# is lowercase ("e.g. this") -- so "3.14" stays one sentence.
_PARAGRAPH = "\n\r\u0085\u2028\u2029"
_CLOSE = "\"'\u201d\u2019\u00bb)\\]}\u300d\u300f\u3011"
_FULL_WIDTH_TERMINATORS = "\u3002\uff01\uff1f\uff61"
_BOUNDARY = re.compile(
    rf"[{_PARAGRAPH}]"
    rf"|[{_FULL_WIDTH_TERMINATORS}]+[{_CLOSE}]*[ \t]*"
    rf"|(?P<latin>[.!?\u2026]+)[{_CLOSE}]*(?:[ \t]+|(?=[{_PARAGRAPH}])|\Z)"
)


def _sentenceEnds(source: str) -> list[int]:
    ends: list[int] = []
    for match in _BOUNDARY.finditer(source):
        latin = match.group("latin")
        if latin is not None and latin.endswith("."):
            following = next((c for c in source[match.end() :] if c.isalpha()), "")
            if following.islower():
                continue
        if match.end() < len(source) and match.end() not in ends:
            ends.append(match.end())
    ends.append(len(source))
    return ends


def sentenceBlocks(source: str, final: bool) -> list[tuple[str, int]]:
    """
    The speakable sentences of C{source} with the offset each ends at; the
    last one is left out unless C{final}, since more text may belong to it
    (text.rs sentence_blocks).
    """
    if not source.strip():
        return []
    blocks: list[tuple[str, int]] = []
    start = 0
    for end in _sentenceEnds(source):
        segment = source[start:end]
        if speakable(segment):
            blocks.append((segment, end))
        start = end
    if not final and blocks:
        blocks.pop()
    return blocks


__all__ = ["sentenceBlocks", "speakable"]
