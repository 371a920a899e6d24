"""
Which text each of RPEngine's speech segments speaks.

Over the WebSocket, RPEngine never says what a segment says: each
C{reply.audio.chunk} names its C{segmentSequence} only.  Its speech cuts the
generated text into sentences (C{sentenceBlocks}, Unicode's sentence rules)
and speaks each speakable one as one segment, in order; the text a client is
shown is the same text with every C{<tag>} dropped.  So segment I{k} is the
I{k}-th sentence of the display text, as long as dropping the tags changed
no sentence boundary, and every segment is checked against its length in
seconds before it is believed (L{plausible}).

Tags do change boundaries in one common way: after a full stop, a tag
(C{"rich. <laugh> You"}) reads as lowercase letters, and Unicode's rules do
not break before a lowercase word, so RPEngine speaks one sentence where the
display text (C{"rich.  You"}) shows two.  The removed tag leaves two
spaces; L{LineText} reads them as the tag they were (L{_hinted}).

A segment that does not fit is not matched (L{Match.matched} false), and
neither is any segment after it in that line: once the count is lost, a
later segment could be given the wrong sentence, and wrong words are worse
than none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rpmiddleware.plugin import sentenceBlocks

#: Seconds of speech per character of display text that a sentence may take:
#: RPEngine's voices speak about 15 characters a second (0.067 s each); a
#: segment outside these bounds is not that sentence.  The constant terms
#: allow for a short sentence's pauses and an expression tag (a laugh) that
#: takes time but no characters.
MIN_SECONDS_PER_CHAR = 0.02
MAX_SECONDS_PER_CHAR = 0.3
SLACK_SECONDS = 0.75

# A full stop, closing punctuation, a space and another space: where a tag
# was dropped from the display text ("rich. <laugh> you" shows as
# "rich.  you"), and where RPEngine saw no sentence boundary.
_DROPPED_TAG = re.compile(r"(\.[\"'\u201d\u2019)\]]*[ \t])[ \t]")


def _hinted(text: str) -> str:
    """
    C{text} with the second space after a full stop replaced by a lowercase
    letter (the same length, so offsets hold): the dropped tag's letters,
    for the sentence rules.
    """
    return _DROPPED_TAG.sub(lambda match: match.group(1) + "x", text)


@dataclass(frozen=True)
class Sentence:
    """One sentence of a line's display text."""

    #: Its index among the line's speakable sentences (its segment, if matched).
    index: int
    #: Code-point offsets of its text (without surrounding whitespace) in the
    #: line's display text, as the client's C{llm} message has it.
    start: int
    end: int
    text: str


def sentencesOf(text: str, final: bool) -> list[Sentence]:
    """
    The speakable sentences of the display text C{text} as RPEngine's speech
    cuts it (the last left out unless C{final}: it may still grow).
    Offsets are into C{text} with its leading whitespace removed, since the
    client's C{llm} text is trimmed.
    """
    lead = len(text) - len(text.lstrip())
    sentences: list[Sentence] = []
    start = 0
    for _piece, end in sentenceBlocks(_hinted(text), final):
        begin = start
        start = end
        raw = text[begin:end]
        inner = raw.strip()
        first = begin + (len(raw) - len(raw.lstrip()))
        sentences.append(Sentence(len(sentences), first - lead, first - lead + len(inner), inner))
    return sentences


def plausible(seconds: float, characters: int) -> bool:
    """
    Whether C{seconds} of speech can say C{characters} characters.
    """
    low = MIN_SECONDS_PER_CHAR * characters - SLACK_SECONDS
    high = MAX_SECONDS_PER_CHAR * characters + SLACK_SECONDS
    return characters > 0 and low <= seconds <= high


@dataclass(frozen=True)
class Match:
    """What a segment was found to say."""

    sentence: Sentence | None
    matched: bool
    #: Why not, when not matched (for the log and the mark).
    reason: str = ""


class LineText:
    """
    One line's display text as it streams (C{reply.text.delta}, or only
    C{reply.text.completed} with response processing), and which of its
    sentences each segment said.
    """

    def __init__(self) -> None:
        self.text = ""
        self.final = False
        #: The next sentence a segment should say.
        self._next = 0
        self._lost: str | None = None

    def add(self, delta: str) -> None:
        if not self.final:
            self.text += delta

    def complete(self, text: str | None) -> None:
        """
        The line's whole display text: RPEngine's C{reply.text.completed}
        (trimmed; the deltas' text is kept when they say the same).
        """
        if isinstance(text, str) and text.strip() != self.text.strip():
            self.text = text
        self.final = True

    def readySentences(self) -> list[Sentence]:
        """The sentences known whole so far (to prepare before their audio)."""
        return sentencesOf(self.text, self.final)

    def matchSegment(self, seconds: float, spokenText: str | None = None) -> Match:
        """
        The sentence the next segment, C{seconds} long, says.  A segment
        comes only once its sentence is whole (RPEngine speaks a sentence
        when the text after it has begun), so the text so far is read as
        final.  C{spokenText}: the segment's text, when the transport says it
        (RPEngine's file mailbox does); the segment is then found by its
        words, wherever the count stands.
        """
        if spokenText is not None:
            return self._matchSpoken(seconds, spokenText)
        index = self._next
        self._next += 1
        if self._lost is not None:
            return Match(None, False, self._lost)
        sentences = sentencesOf(self.text, True)
        if index >= len(sentences):
            return self._lose(f"segment {index} has no sentence in the text shown")
        sentence = sentences[index]
        if not plausible(seconds, len(sentence.text)):
            return self._lose(
                f"segment {index} lasts {seconds:.2f} s, implausible for "
                f"{len(sentence.text)} characters"
            )
        return Match(sentence, True)

    def _matchSpoken(self, seconds: float, spokenText: str) -> Match:
        words = _words(spokenText)
        if not words:
            # A tag spoken alone (a laugh): no text shown says it.
            return Match(None, False, "the segment says no words (an expression tag alone)")
        for sentence in sentencesOf(self.text, True)[self._next :]:
            if _words(sentence.text) == words:
                self._next = sentence.index + 1
                self._lost = None
                return Match(sentence, True)
        self._next += 1
        return Match(None, False, f"no sentence shown says {spokenText[:60]!r}")

    def _lose(self, reason: str) -> Match:
        self._lost = reason
        return Match(None, False, reason)


_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


def _words(text: str) -> str:
    """C{text} without tags, its whitespace runs made one space."""
    return _SPACE.sub(" ", _TAG.sub(" ", text)).strip()


__all__ = ["LineText", "Match", "Sentence", "plausible", "sentencesOf"]
