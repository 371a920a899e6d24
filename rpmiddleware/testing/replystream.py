"""
One simulated reply: text deltas, sentence audio and the terminal messages.

RPEngine streams text and speech concurrently: a sentence is synthesised as
soon as its text is complete, so audio chunks interleave with later text
deltas and may start before C{reply.text.completed}.  Every message is its own
reactor step (C{callLater}, with a delay of 0 when unpaced) so a
C{request.cancel} arriving mid-stream really interrupts it, as it would with
the browser app.
"""

from __future__ import annotations

import base64
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from rpmiddleware.testing.tones import (
    OUTPUT_FORMAT,
    OUTPUT_SAMPLE_RATE,
    segmentFrequency,
    sineTone,
    splitSamples,
)

#: A token is a word with the whitespace that follows it.
_TOKEN = re.compile(r"\S+\s*")
#: A token that ends a sentence: terminal punctuation, maybe closing quotes.
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*$")


class Emit(Protocol):
    def __call__(self, type: str, **fields: Any) -> object: ...


@dataclass(frozen=True)
class Pacing:
    """
    How fast a stream goes; see L{SimulatorOptions} for the meaning of each.
    """

    tokensPerSecond: float | None = None
    audioRealtime: bool = False
    chunkSamples: int = 4410
    secondsPerCharacter: float = 0.05


def tokenize(text: str) -> list[str]:
    """
    The deltas of C{text}: joined again they give C{text} without leading
    whitespace.
    """
    return _TOKEN.findall(text)


def endsSentence(token: str) -> bool:
    return _SENTENCE_END.search(token.rstrip()) is not None


class ReplyStream:
    """
    The output of one accepted request, from C{reply.accepted} to
    C{reply.completed}.

    Pacing follows a logical timeline fixed when the reply is accepted
    (token M{i} is due at start + (i+1)/tokensPerSecond; a chunk is due when
    its sentence is complete and, in real time, when the previous chunk has
    played), so a reactor running late, or a L{Clock} advanced in one big
    step, delivers the same messages and statistics as a punctual one.

    @param onFinished: called once, after C{reply.completed} was sent; never
        after L{stop}.
    """

    def __init__(
        self,
        requestId: str,
        text: str,
        wantAudio: bool,
        emit: Emit,
        clock: IReactorTime,
        pacing: Pacing,
        onFinished: Callable[[ReplyStream], None],
        transcript: str | None = None,
    ) -> None:
        self.requestId = requestId
        self.text = text.strip()
        self.wantAudio = wantAudio
        self.transcript = transcript
        self._emit = emit
        self._clock = clock
        self._pacing = pacing
        self._onFinished = onFinished
        self._tokens = tokenize(self.text)
        self._nextToken = 0
        self._sentenceStart = 0
        self._offset = 0
        self._textTimer: IDelayedCall | None = None
        self._audioTimer: IDelayedCall | None = None
        self._endTimer: IDelayedCall | None = None
        #: Sentences waiting to be sent: (segment, chunks, logical ready time).
        self._pending: deque[tuple[int, deque[bytes], float]] = deque()
        self._chunkInSegment = 0
        self._startedAt = 0.0
        self._textEndAt = 0.0
        self._audioCursor = 0.0
        self._audioAt = 0.0
        self._firstSentenceAt: float | None = None
        self.textDone = False
        self.audioDone = not wantAudio
        self.audioStarted = False
        self.stopped = False
        self.finished = False
        self.segments = 0
        self.chunks = 0
        self.audioBytes = 0
        self.audioSamples = 0

    def start(self) -> None:
        """
        Begin in the next reactor step, so the game's own messages queued in
        this one are handled first.
        """
        self._startedAt = self._clock.seconds()
        self._textTimer = self._clock.callLater(0, self._accept)

    def stop(self) -> None:
        """
        Stop generating; nothing more is sent for this request.
        """
        self.stopped = True
        for timer in (self._textTimer, self._audioTimer, self._endTimer):
            if timer is not None and timer.active():
                timer.cancel()
        self._textTimer = self._audioTimer = self._endTimer = None
        self._pending.clear()

    def _at(self, when: float, f: Callable[[], None]) -> IDelayedCall:
        return self._clock.callLater(max(0.0, when - self._clock.seconds()), f)

    def _tokenTime(self, index: int) -> float:
        rate = self._pacing.tokensPerSecond
        return self._startedAt + ((index + 1) / rate if rate else 0.0)

    def _accept(self) -> None:
        self._audioCursor = self._startedAt
        fields: dict[str, Any] = {"requestId": self.requestId}
        if self.transcript is not None:
            fields["transcript"] = self.transcript
        self._emit("reply.accepted", **fields)
        self._scheduleText()

    # Text

    def _scheduleText(self) -> None:
        due = self._tokenTime(self._nextToken) if self._tokens else self._startedAt
        self._textTimer = self._at(due, self._textStep)

    def _textStep(self) -> None:
        self._textTimer = None
        if self._nextToken < len(self._tokens):
            index = self._nextToken
            token = self._tokens[index]
            self._nextToken += 1
            self._offset += len(token)
            self._textEndAt = self._tokenTime(index)
            self._emit("reply.text.delta", requestId=self.requestId, sequence=index, text=token)
            if self.wantAudio and endsSentence(token):
                self._sentenceReady(self._offset, self._textEndAt)
        else:
            self._textEndAt = self._startedAt
        if self._nextToken < len(self._tokens):
            self._scheduleText()
            return
        if self.wantAudio and self.text[self._sentenceStart :].strip():
            # Speak a last sentence that lacks terminal punctuation, too.
            self._sentenceReady(len(self.text), self._textEndAt)
        self.textDone = True
        self._emit(
            "reply.text.completed",
            requestId=self.requestId,
            text=self.text,
            stats={"tokens": len(self._tokens), "durationMs": self._ms(self._textEndAt)},
        )
        self._audioMaybeDone()
        self._maybeFinish()

    # Audio

    def _sentenceReady(self, end: int, readyAt: float) -> None:
        sentence = self.text[self._sentenceStart : end].strip()
        self._sentenceStart = end
        if self._firstSentenceAt is None:
            self._firstSentenceAt = readyAt
        segment = self.segments
        self.segments += 1
        pcm = sineTone(segmentFrequency(segment), len(sentence) * self._pacing.secondsPerCharacter)
        chunks = deque(splitSamples(pcm, self._pacing.chunkSamples))
        self._pending.append((segment, chunks, readyAt))
        if self._audioTimer is None:
            self._scheduleAudio()

    def _scheduleAudio(self) -> None:
        self._audioAt = max(self._audioCursor, self._pending[0][2])
        self._audioTimer = self._at(self._audioAt, self._audioStep)

    def _audioStep(self) -> None:
        self._audioTimer = None
        if not self.audioStarted:
            self.audioStarted = True
            self._emit(
                "reply.audio.start",
                requestId=self.requestId,
                format=OUTPUT_FORMAT,
                sampleRate=OUTPUT_SAMPLE_RATE,
                channels=1,
            )
        segment, chunks, _ = self._pending[0]
        data = chunks.popleft()
        final = not chunks
        samples = len(data) // 2
        self._emit(
            "reply.audio.chunk",
            requestId=self.requestId,
            sequence=self.chunks,
            segmentSequence=segment,
            chunkSequence=self._chunkInSegment,
            final=final,
            data=base64.b64encode(data).decode("ascii"),
            samples=samples,
        )
        self.chunks += 1
        self.audioBytes += len(data)
        self.audioSamples += samples
        self._chunkInSegment += 1
        if final:
            self._pending.popleft()
            self._chunkInSegment = 0
        playback = samples / OUTPUT_SAMPLE_RATE if self._pacing.audioRealtime else 0.0
        self._audioCursor = self._audioAt + playback
        if self._pending:
            self._scheduleAudio()
        else:
            self._audioMaybeDone()
            self._maybeFinish()

    def _audioMaybeDone(self) -> None:
        if self.audioDone or not self.textDone or self._pending or self._audioTimer is not None:
            return
        self.audioDone = True
        firstSentence = self._firstSentenceAt if self._firstSentenceAt is not None else 0.0
        self._emit(
            "reply.audio.completed",
            requestId=self.requestId,
            segments=self.segments,
            chunks=self.chunks,
            bytes=self.audioBytes,
            durationMs=self.audioSamples * 1000.0 / OUTPUT_SAMPLE_RATE,
            synthesisMs=round(max(0.0, self._audioAt - firstSentence) * 1000.0, 3),
        )

    # The end

    def _maybeFinish(self) -> None:
        if self.textDone and self.audioDone and self._endTimer is None and not self.finished:
            self._endTimer = self._clock.callLater(0, self._finish)

    def _finish(self) -> None:
        self._endTimer = None
        self.finished = True
        end = max(self._textEndAt, self._audioCursor if self.wantAudio else self._textEndAt)
        stats: dict[str, Any] = {"tokens": len(self._tokens), "durationMs": self._ms(end)}
        if self.wantAudio:
            stats.update(
                audioSegments=self.segments,
                audioChunks=self.chunks,
                audioBytes=self.audioBytes,
                audioDurationMs=self.audioSamples * 1000.0 / OUTPUT_SAMPLE_RATE,
            )
        self._emit("reply.completed", requestId=self.requestId, stats=stats)
        self._onFinished(self)

    def _ms(self, until: float) -> float:
        """
        Milliseconds from acceptance to a point on the logical timeline.
        """
        return round((until - self._startedAt) * 1000.0, 3)
