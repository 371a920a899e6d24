"""
One simulated reply, from generation to C{reply.completed}.

This is the part of RPEngine's state machine between C{begin_gemma} and
C{complete_if_ready} (C{crates/rp-engine-core/src/app.rs}): the model
streams tokens (C{gemma_delta}), each becoming a clean C{reply.text.delta};
sentences go to speech synthesis one at a time as soon as they are complete
(C{start_tts_if_needed}), and each synthesised sentence is sent at once as
C{reply.audio.start} (the first time) and 32 KiB C{reply.audio.chunk}s
(C{tts_completed}, C{take_reply_audio_transport} and src/socket-adapter.ts),
so audio interleaves with later text deltas.  When generation ends
(C{gemma_completed}) the text is completed, with C{extractedContent} when
buffered response processing was asked for, in which case nothing was
streamed before; once the last sentence is sent, C{reply.audio.completed}
and C{reply.completed} follow.

Every model token and every synthesised sentence is its own reactor step
(C{callLater}, with a delay of 0 when unpaced), so a C{request.cancel}
arriving mid-stream really interrupts it, as it would in the browser app.
"""

from __future__ import annotations

import base64
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from rpmiddleware.protocol.messages import PCM_CHUNK_BYTES
from rpmiddleware.testing.responsetext import (
    ChangedText,
    DisplayTextStream,
    ResponseProcessing,
    SpeechChunker,
    displayText,
    synthesisText,
)
from rpmiddleware.testing.simspeech import KnownSpeech, spokenWords
from rpmiddleware.testing.tones import (
    OUTPUT_FORMAT,
    OUTPUT_SAMPLE_RATE,
    sampleCount,
    segmentFrequency,
    sineTone,
)

#: RPEngine sends speech in chunks of 32 KiB of PCM16 (app.rs
#: PCM_CHUNK_BYTES, src/socket-adapter.ts sendAudioSegment).
PCM_CHUNK_SAMPLES = PCM_CHUNK_BYTES // 2

#: A token is a word with the whitespace that follows it.
_TOKEN = re.compile(r"\S+\s*")


class Emit(Protocol):
    def __call__(self, type: str, **fields: Any) -> object: ...


#: Where a synthesised phrase goes instead of C{reply.audio.start} and chunks
#: when RPEngine's host sends audio another way (its file mailbox:
#: C{src/app-host.ts} C{replyAudioTransport}, C{take_reply_audio_segment}).
AudioSegmentSink = Callable[[dict[str, Any]], object]


@dataclass(frozen=True)
class Pacing:
    """
    How fast a stream goes; see L{SimulatorOptions} for the meaning of each.
    """

    tokensPerSecond: float | None = None
    audioRealtime: bool = False
    chunkSamples: int = PCM_CHUNK_SAMPLES
    secondsPerCharacter: float = 0.05
    speech: str = "tones"


def tokenize(text: str) -> list[str]:
    """
    The model tokens of C{text}: joined again they give C{text} without
    leading whitespace.
    """
    return _TOKEN.findall(text)


def chunked(pcm: bytes, chunkBytes: int) -> list[bytes]:
    """
    PCM cut into chunks of C{chunkBytes}; none for no audio.
    """
    if chunkBytes <= 0:
        raise ValueError("chunk size must be positive")
    return [pcm[i : i + chunkBytes] for i in range(0, len(pcm), chunkBytes)]


class ReplyStream:
    """
    The output of one active request, after C{reply.accepted}.

    Pacing follows a logical timeline fixed when generation starts (token
    M{i} is due at start + (i+1)/tokensPerSecond; with C{audioRealtime} a
    sentence takes as long to synthesise as it plays), so a reactor running
    late, or a L{Clock} advanced in one big step, delivers the same messages
    with the same figures as a punctual one (text and audio may interleave
    differently).

    @param onFinished: called once, right after C{reply.completed} was
        sent; never after L{stop}.
    @param onFailed: called with an error code and message if the reply
        fails (as C{fail_active} would end it); never after L{stop}.
    @param modalities: echoed in C{reply.completed}.
    @param processing: buffered response processing, if asked for.
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
        *,
        modalities: list[Any] | None = None,
        processing: ResponseProcessing | None = None,
        onFailed: Callable[[ReplyStream, str, str], None] | None = None,
        audioSegment: AudioSegmentSink | None = None,
    ) -> None:
        self.requestId = requestId
        self.text = text
        self.wantAudio = wantAudio
        self.transcript = transcript
        self.modalities = (
            modalities if modalities is not None else (["text", "audio"] if wantAudio else ["text"])
        )
        self.processing = processing
        self._emit = emit
        self._clock = clock
        self._pacing = pacing
        self._onFinished = onFinished
        self._onFailed = onFailed
        self._audioSegment = audioSegment
        self._tokens = tokenize(text)
        self._timers: list[IDelayedCall] = []
        self._display = DisplayTextStream()
        self._chunker = SpeechChunker() if wantAudio else None
        self._pending: deque[tuple[int, str]] = deque()
        self._inflight: tuple[int, str] | None = None
        self._raw = ""
        self._clean = ""
        self._deltaSequence = 0
        self._startedAt = 0.0
        self.generationDone = False
        self.audioStarted = False
        self.stopped = False
        self.finished = False
        #: Figures of the speech sent so far (C{reply.audio.completed}'s).
        self.segments = 0
        self.chunks = 0
        self.audioBytes = 0
        self.audioSeconds = 0.0
        self.synthesisMs = 0.0
        #: Each sentence as speech synthesis was given it (app.rs hands the
        #: processed text to Supertonic): what the player hears, for tests.
        self.spoken: list[str] = []
        #: With C{speech="words"}: each segment's audio and where its words
        #: are (L{rpmiddleware.testing.simspeech}), in order.
        self.knownSpeech: list[KnownSpeech] = []

    def start(self) -> None:
        """
        Begin generating in the next reactor step, so the game's own
        messages queued in this one are handled first.
        """
        self._startedAt = self._clock.seconds()
        if self._tokens:
            self._at(self._tokenTime(0), self._token, 0)
        else:
            self._at(self._startedAt, self._generated)

    def stop(self) -> None:
        """
        Stop generating and synthesising; nothing more is sent.
        """
        self.stopped = True
        for timer in self._timers:
            if timer.active():
                timer.cancel()
        self._timers = []
        self._pending.clear()

    def _at(self, when: float, f: Callable[..., None], *args: Any) -> None:
        self._timers = [t for t in self._timers if t.active()]
        delay = max(0.0, when - self._clock.seconds())
        self._timers.append(self._clock.callLater(delay, f, when, *args))

    def _tokenTime(self, index: int) -> float:
        rate = self._pacing.tokensPerSecond
        return self._startedAt + ((index + 1) / rate if rate else 0.0)

    def _fail(self, code: str, message: str) -> None:
        self.stop()
        if self._onFailed is not None:
            self._onFailed(self, code, message)

    # Generation (app.rs gemma_delta, gemma_completed)

    def _token(self, now: float, index: int) -> None:
        token = self._tokens[index]
        self._raw += token
        if self.processing is None:
            clean = self._display.push(token)
            if clean:
                self._delta(clean)
            if self._chunker is not None:
                try:
                    self._pending.extend(self._chunker.update(self._raw, False))
                except ChangedText as e:
                    self._fail("request_failed", str(e))
                    return
        self._startSynthesis(now)
        if index + 1 < len(self._tokens):
            self._at(self._tokenTime(index + 1), self._token, index + 1)
        else:
            # The model reports completion after its last token.
            self._at(now, self._generated)

    def _delta(self, clean: str) -> None:
        self._emit(
            "reply.text.delta", requestId=self.requestId, sequence=self._deltaSequence, delta=clean
        )
        self._deltaSequence += 1
        self._clean += clean

    def _generated(self, now: float) -> None:
        if self.processing is None:
            tail = self._display.finish()
            if tail:
                self._delta(tail)
        generated = self._raw
        processed = self.processing.process(generated) if self.processing is not None else None
        textSource = processed.text if processed is not None else generated
        audioSource = processed.audio if processed is not None else generated
        if self._chunker is not None:
            try:
                self._pending.extend(self._chunker.update(audioSource, True))
            except ChangedText as e:
                self._fail("request_failed", str(e))
                return
        final = displayText(textSource).strip()
        if final:
            self._clean = final
        self.generationDone = True
        completed: dict[str, Any] = {
            "requestId": self.requestId,
            "text": self._clean,
            "tokenCount": len(self._tokens),
            "elapsedMs": self._ms(now - self._startedAt),
        }
        if processed is not None:
            completed["extractedContent"] = processed.extracted
        self._emit("reply.text.completed", **completed)
        self._startSynthesis(now)
        self._completeIfReady()

    # Speech (app.rs start_tts_if_needed, tts_completed)

    def _startSynthesis(self, now: float) -> None:
        """
        Hand the next complete sentence to speech synthesis, if none is
        being synthesised.  A sentence with nothing left to say once tags
        are dropped is skipped without a segment, as in RPEngine.
        """
        if self._chunker is None or self._inflight is not None or not self._pending:
            return
        segment, sentence = self._pending.popleft()
        spoken = synthesisText(sentence).strip()
        if not spoken:
            return
        self._inflight = (segment, spoken)
        self.spoken.append(spoken)
        seconds = self._speechSeconds(spoken)
        self._at(now + (seconds if self._pacing.audioRealtime else 0.0), self._synthesised, now)

    def _speechSeconds(self, spoken: str) -> float:
        return len(spoken) * self._pacing.secondsPerCharacter

    def _synthesised(self, now: float, began: float) -> None:
        assert self._inflight is not None
        segment, spoken = self._inflight
        self._inflight = None
        seconds = self._speechSeconds(spoken)
        if self._pacing.speech == "words":
            known = spokenWords(displayText(spoken).strip(), OUTPUT_SAMPLE_RATE)
            self.knownSpeech.append(known)
            pcm = known.pcm
            seconds = known.samples / OUTPUT_SAMPLE_RATE
        else:
            pcm = sineTone(segmentFrequency(segment), seconds)
        parts = chunked(pcm, self._pacing.chunkSamples * 2)
        firstSequence = self.chunks
        sendStart = not self.audioStarted
        self.audioStarted = True
        self.segments += 1
        self.chunks += len(parts)
        self.audioBytes += len(pcm)
        self.audioSeconds += sampleCount(seconds) / OUTPUT_SAMPLE_RATE
        self.synthesisMs += self._ms(now - began)
        # The next sentence starts synthesising before this one is sent.
        self._startSynthesis(now)
        if self._audioSegment is not None:
            # The whole phrase at once, as app.rs take_reply_audio_segment
            # hands it to a host that does not stream chunks.
            self._audioSegment(
                {
                    "requestId": self.requestId,
                    "sampleRate": OUTPUT_SAMPLE_RATE,
                    "channels": 1,
                    "segmentSequence": segment,
                    "spokenText": spoken,
                    "durationSeconds": sampleCount(seconds) / OUTPUT_SAMPLE_RATE,
                    "firstAudioSequence": firstSequence,
                    "sendStart": sendStart,
                    "pcm": pcm,
                    "byteLength": len(pcm),
                }
            )
            self._completeIfReady()
            return
        if sendStart:
            self._audioStart()
        for index, part in enumerate(parts):
            self._emit(
                "reply.audio.chunk",
                requestId=self.requestId,
                sequence=firstSequence + index,
                segmentSequence=segment,
                segmentChunkSequence=index,
                segmentChunkCount=len(parts),
                data=base64.b64encode(part).decode("ascii"),
            )
        self._completeIfReady()

    def _audioStart(self) -> None:
        self._emit(
            "reply.audio.start",
            requestId=self.requestId,
            format=OUTPUT_FORMAT,
            sampleRate=OUTPUT_SAMPLE_RATE,
            channels=1,
        )

    # The end (app.rs complete_if_ready)

    def _completeIfReady(self) -> None:
        if self.finished or self.stopped or not self.generationDone:
            return
        if self._chunker is not None and (self._inflight is not None or self._pending):
            return
        self.finished = True
        if self._chunker is not None:
            if not self.audioStarted:
                self._audioStart()
            self._emit(
                "reply.audio.completed",
                requestId=self.requestId,
                chunkCount=self.chunks,
                totalBytes=self.audioBytes,
                durationSeconds=self.audioSeconds,
                elapsedMs=self.synthesisMs,
                segmentCount=self.segments,
            )
        self._emit("reply.completed", requestId=self.requestId, modalities=self.modalities)
        self._onFinished(self)

    @staticmethod
    def _ms(seconds: float) -> float:
        return round(seconds * 1000.0, 3)
