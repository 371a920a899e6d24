"""
What the player heard of a reply that was cut off: the sentences its speech
said before the cut.

RPEngine speaks a reply one sentence at a time, each one audio segment
(C{segmentSequence}, in order), and sends each segment's chunks as soon as
the sentence is synthesised, long before the player hears them.  A cancel
may say how much of the speech the player was played
(L{rpmiddleware.protocol.meta.PLAYED}: samples at a rate, from its first
sample).  A segment counts as heard when all of it arrived (its last chunk,
L{endsSegment}) and the played samples reach its end; the reply is then
remembered up to the end of that many of its sentences, found in its text
with RPEngine's sentence rules (L{sentenceBlocks}), in order.

A sentence played only in part is not remembered at all: RPEngine tells no
word timings, and a voice's pace varies within a sentence, so where in it
the cut fell cannot be placed honestly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from rpmiddleware.audio.format import base64Bytes, endsSegment
from rpmiddleware.protocol.messages import OUTPUT_SAMPLE_RATE
from rpmiddleware.protocol.sentences import sentenceBlocks


def _rate(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


@dataclass
class Segment:
    """One sentence's speech as it passed toward the client."""

    #: Its length, in seconds (a sum of samples over their rates).
    seconds: Fraction = Fraction(0)
    #: Its last chunk passed.
    whole: bool = False


@dataclass
class Speech:
    """A reply's speech as it passed toward the client, segment by segment."""

    rate: int = OUTPUT_SAMPLE_RATE
    segments: dict[Any, Segment] = field(default_factory=dict)

    def started(self, fields: Mapping[str, Any]) -> None:
        """C{reply.audio.start}: the rate chunks come at, unless they say."""
        self.rate = _rate(fields.get("sampleRate")) or self.rate

    def chunk(self, fields: Mapping[str, Any]) -> None:
        """
        One C{reply.audio.chunk}: its samples (the C{samples} a converting
        plugin set, else its data's length) join its segment.
        """
        key = fields.get("segmentSequence")
        segment = self.segments.get(key)
        if segment is None:
            segment = self.segments[key] = Segment()
        rate = _rate(fields.get("sampleRate")) or self.rate
        samples = fields.get("samples")
        if type(samples) is not int or samples < 0:
            data = fields.get("data")
            samples = base64Bytes(data) // 2 if isinstance(data, str) else 0
        segment.seconds += Fraction(samples, rate)
        if endsSegment(fields):
            segment.whole = True

    def heardSegments(self, played: Any) -> int | None:
        """
        How many segments, from the first, the player heard whole, given
        L{meta.PLAYED}; C{None} when C{played} says nothing usable or no
        speech passed (the text rule applies then).
        """
        if not isinstance(played, Mapping) or not self.segments:
            return None
        samples, rate = played.get("samples"), _rate(played.get("sampleRate"))
        if type(samples) is not int or samples < 0 or rate is None:
            return None
        heard = Fraction(samples, rate)
        end = Fraction(0)
        count = 0
        for key in sorted(self.segments, key=_order):
            segment = self.segments[key]
            end += segment.seconds
            if not segment.whole or end > heard:
                break
            count += 1
        return count


def _order(key: Any) -> tuple[int, Any]:
    return (0, key) if type(key) is int else (1, str(key))


def heardText(text: str, final: bool, sentences: int) -> tuple[str, bool]:
    """
    C{text} as far as its first C{sentences} speakable sentences (the
    sentences RPEngine's speech made of it, in order), and whether that is
    all of it.  C{final}: C{text} is the reply's whole text (else the last
    sentence may still grow, and RPEngine has not spoken it yet).
    """
    blocks = sentenceBlocks(text, final)
    if sentences <= 0:
        return "", not text.strip()
    if sentences >= len(blocks):
        if final:
            return text, True
        end = blocks[-1][1] if blocks else 0
        return text[:end], False
    end = blocks[sentences - 1][1]
    return text[:end], not text[end:].strip()
