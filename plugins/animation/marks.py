"""
speech-marks: tells a game when each sentence, word and mouth shape of a
character's line is spoken, before the audio that speaks it.

A game asks for the kinds it wants (C{configure {"speechMarks": ["sentence",
"word", "viseme"]}} or a turn's C{options}); the client endpoint puts them on
the request's meta.  For such a request this plugin:

  1. follows the line's display text as it streams (C{reply.text.delta},
     C{reply.text.completed}) and, as each sentence becomes whole, prepares
     it for alignment on a worker thread (L{alignment.prepare}: the text's
     phonemes, long before its audio);
  2. holds each speech segment's chunks (RPEngine sends a sentence's chunks
     together once it is synthesised) until the last one is here, finds the
     sentence the segment says (L{matching}), aligns its words and visemes
     on the audio on the worker thread (L{alignment.align}), and then sends
     the marks (a L{speechmarks.MARKS_ENVELOPE} toward the game, which the
     client's turn writes as C{speech-marks}) and releases the chunks, in
     order: a sentence's marks always reach the client before its first
     C{tts-chunk}.  Everything of the request that came after a held chunk
     waits behind it, so the line's envelopes keep their order;
  3. drops what it holds of a request the game cancels.

Times are in milliseconds from the line's first audio sample, counted in
the samples the client gets: the plugin sits further from the game than
audio-resample, so it aligns RPEngine's own 44.1 kHz speech whatever the
client's rate, and counts each segment as audio-resample converts it to
the request's C{outputSampleRate}, exactly; offsets are code points of
the line's display text.  A request that asked for nothing costs one dict
lookup per envelope; no thread pool starts until a request asks for words
or visemes.  See docs/animation.md.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.builtin.animation.kinds import ALIGNED, SENTENCE, VISEME, WORD, requested
from rpmiddleware.builtin.animation.matching import LineText, Match, Sentence
from rpmiddleware.builtin.animation.workers import Prepare, SoonestFirst, Workers
from rpmiddleware.plugin import (
    OUTPUT_SAMPLE_RATE,
    TERMINAL,
    ChainPlugin,
    Envelope,
    IChainContext,
    IPluginServices,
    PluginFactory,
    base64Bytes,
    decodeBase64,
    endsSegment,
    exactLength,
    meta,
    rejectUnknownSettings,
    speechmarks,
    textOfDelta,
)

if TYPE_CHECKING:
    from rpmiddleware.builtin.animation.alignment import Alignment

T = TypeVar("T")
#: Worker threads for alignment (CPU work; numpy releases the GIL).
DEFAULT_THREADS = 2
#: About how long RPEngine's voice takes to say a character: orders the
#: sentences waiting to be prepared by when their audio may come.
SECONDS_PER_CHAR = 0.067
#: Run C{work} off the reactor; its result on the reactor's thread.
Runner = Callable[[Callable[[], Any]], "Deferred[Any]"]
_OPENING = ("reply.request", "voice.capture.start")


@dataclass(eq=False)
class _Segment:
    """One speech segment of a line, held until its marks are sent."""

    #: Its first sample, counted from the line's first, at the client's rate.
    first: int
    #: Its samples as they came, and at the client's rate.
    samples: int = 0
    out: int = 0
    pcm: list[bytes] = field(default_factory=list)
    #: The marks, once made; C{None} while collecting or aligning.
    marks: list[dict[str, Any]] | None = None
    sent: bool = False
    #: What it says, when the transport told (RPEngine's file mailbox).
    spoken: str | None = None


_Held = tuple[Deferred[Any], Envelope, "_Segment | None", "_Line"]


@dataclass(eq=False)
class _Turn:
    """
    A game's turn: its request and, in a scene, the requests of the lines
    that follow it (whose meta names the turn).  What is held of any of its
    lines is held in one queue, so that a later line's text never overtakes
    an earlier line's held audio.
    """

    key: str
    #: Everything held, in order: (its Deferred, the envelope, the segment
    #: it is a chunk of, its line).
    held: deque[_Held] = field(default_factory=deque)
    lines: int = 0


@dataclass(eq=False)
class _Line:
    """One request of a game that asked for marks."""

    requestId: str
    kinds: frozenset[str]
    language: str
    speaker: dict[str, Any] | None
    turn: _Turn
    #: The request named its speaker (a scene's line, meta SPEAKER).
    scene: bool = False
    text: LineText = field(default_factory=LineText)
    #: The rate the client gets the speech at (the request's meta
    #: outputSampleRate, which audio-resample converts to); 0: as it comes.
    rate: int = 0
    #: The rate the speech comes at (RPEngine's 44.1 kHz).
    inRate: int = OUTPUT_SAMPLE_RATE
    #: Samples, at the client's rate, of the segments before the one collecting.
    samples: int = 0
    collecting: _Segment | None = None
    #: Sentence index -> the work preparing it.
    prepared: dict[int, Prepare] = field(default_factory=dict)
    cancelled: bool = False

    @property
    def outRate(self) -> int:
        return self.rate or self.inRate


class SpeechMarks(ChainPlugin):
    name = "speech-marks"
    log = Logger()

    def __init__(
        self,
        reactor: Any,
        threads: int = DEFAULT_THREADS,
        run: Runner | None = None,
        aligner: Any = None,
    ) -> None:
        """
        @param run: runs work off the reactor (tests); else a thread pool.
        @param aligner: what has C{prepare} and C{align} (tests); else the
            alignment module, imported when first needed.
        """
        self._run = run
        self._aligner = aligner
        self._workers = Workers(reactor, threads)
        self._lines: dict[str, _Line] = {}
        self._turns: dict[str, _Turn] = {}
        self._context: IChainContext | None = None
        self._ordered = SoonestFirst()

    # Toward RPEngine: who asked, and cancels.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope:
        kind = envelope.type
        if kind in _OPENING:
            kinds = requested(envelope.meta)
            if kinds and envelope.requestId is not None:
                key = envelope.meta.get(meta.TURN) or envelope.requestId
                turn = self._turns.get(key)
                if turn is None:
                    turn = self._turns[key] = _Turn(key)
                turn.lines += 1
                self._lines[envelope.requestId] = _Line(
                    envelope.requestId,
                    kinds,
                    _language(envelope),
                    _speaker(envelope),
                    turn,
                    isinstance(envelope.meta.get(meta.SPEAKER), dict),
                    rate=_rate(envelope.meta.get("outputSampleRate")),
                )
        elif kind in ("request.cancel", "voice.capture.cancel"):
            line = self._lines.get(envelope.requestId or "")
            if line is not None:
                self._drop(line)
        return envelope

    # Toward the game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        line = self._lines.get(envelope.requestId or "")
        if line is None:
            return envelope
        self._context = context
        kind = envelope.type
        if kind in TERMINAL:
            if line.turn.held and not line.cancelled:
                return self._hold(line, envelope, None)
            self._ended(line)
            return envelope
        if line.cancelled:
            return envelope
        if kind == "reply.text.delta":
            line.text.add(textOfDelta(envelope.fields))
            self._prepareReady(line)
        elif kind == "reply.text.completed":
            line.text.complete(envelope.get("text"))
            self._prepareReady(line)
        elif kind == "reply.audio.chunk":
            return self._chunk(line, envelope)
        elif kind == "reply.audio.start":
            line.inRate = _rate(envelope.get("sampleRate")) or line.inRate
        if line.turn.held:
            return self._hold(line, envelope, None)
        return envelope

    def _hold(self, line: _Line, envelope: Envelope, segment: _Segment | None) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        line.turn.held.append((d, envelope, segment, line))
        return d

    def _ended(self, line: _Line) -> None:
        """The line's request ended and nothing of it is held: forget it."""
        if self._lines.pop(line.requestId, None) is None:
            return
        turn = line.turn
        turn.lines -= 1
        if turn.lines <= 0 and not turn.held:
            self._turns.pop(turn.key, None)

    def _chunk(self, line: _Line, envelope: Envelope) -> Any:
        fields = envelope.fields
        line.inRate = _rate(fields.get("sampleRate")) or line.inRate
        segment = line.collecting
        if segment is None:
            segment = line.collecting = _Segment(line.samples)
            spoken = envelope.meta.get(meta.SPOKEN_TEXT)
            if isinstance(spoken, str):
                segment.spoken = spoken
        data = fields.get("data")
        if line.kinds & ALIGNED:
            pcm = _pcm(data)
            segment.pcm.append(pcm)
            segment.samples += len(pcm) // 2
        else:
            segment.samples += base64Bytes(data) // 2 if isinstance(data, str) else 0
        d = self._hold(line, envelope, segment)
        if endsSegment(fields):
            line.collecting = None
            # What the client gets of it: audio-resample (and the client
            # endpoint without it) converts each segment to exactly this.
            segment.out = exactLength(segment.samples, line.inRate, line.outRate)
            line.samples += segment.out
            self._segmentWhole(line, segment)
        if d.called:
            # Released at once (sentence marks only, nothing before it): go on
            # now rather than through the Deferred.
            return envelope
        return d

    # Making the marks.

    def _segmentWhole(self, line: _Line, segment: _Segment) -> None:
        rate = line.inRate
        seconds = segment.samples / rate
        match = line.text.matchSegment(seconds, segment.spoken)
        if not match.matched:
            self.log.info(
                "speech-marks: a segment of {requestId} was not matched to its text: {why}",
                requestId=line.requestId,
                why=match.reason,
            )
        if not match.matched or not line.kinds & ALIGNED or match.sentence is None:
            segment.pcm = []
            segment.marks = _sentenceMarks(line, segment, match)
            self._release(line.turn)
            return
        alignment = self._alignment()
        sentence = match.sentence
        pcm = b"".join(segment.pcm)
        segment.pcm = []
        d = self._prepared(line, sentence)
        d.addCallback(
            lambda prepared: self._submit(alignment.align, prepared, pcm, rate, urgent=True)
        )

        def aligned(result: Alignment) -> None:
            segment.marks = _sentenceMarks(line, segment, match) + _alignedMarks(
                line, segment, sentence, result
            )

        def failed(failure: Failure) -> None:
            self.log.failure(
                "speech-marks: aligning a sentence of {requestId} failed",
                failure,
                requestId=line.requestId,
            )
            segment.marks = _sentenceMarks(line, segment, match)

        d.addCallbacks(aligned, failed)
        d.addCallback(lambda _: self._release(line.turn))

    def _prepareReady(self, line: _Line) -> None:
        if not line.kinds & ALIGNED:
            return
        alignment = self._alignment()
        for sentence in line.text.readySentences():
            known = line.prepared.get(sentence.index)
            if known is None or known.text != sentence.text:
                job = Prepare(sentence.text, alignment.prepare, line.language)
                # Soonest needed first: the speech before the sentence (about
                # SECONDS_PER_CHAR a character) from when its text came.
                due = time.monotonic() + sentence.start * SECONDS_PER_CHAR
                self._ordered.push(due, job)
                self._submit(self._ordered.runNext).addCallback(Prepare.finished)
                line.prepared[sentence.index] = job

    def _prepared(self, line: _Line, sentence: Sentence) -> Deferred[Any]:
        """
        The sentence prepared: the result of the work started when its text
        was whole, or, when that work has not begun yet (other lines' text
        before it), the work done now with the alignment's own threads (the
        queued work then does nothing).
        """
        alignment = self._alignment()
        job = line.prepared.pop(sentence.index, None)
        if job is not None and job.text == sentence.text and job.started:
            result: Deferred[Any] = Deferred()

            def passOn(value: Any) -> Any:
                result.callback(value)
                return value

            job.result.addBoth(passOn)
            return result
        if job is not None:
            job.wanted = False
        return self._submit(alignment.prepare, sentence.text, line.language, urgent=True)

    def _release(self, turn: _Turn) -> None:
        """
        Send on, in order, everything held of the turn up to the first
        segment whose marks are not made yet; a segment's marks go first.
        """
        held = turn.held
        while held:
            d, envelope, segment, line = held[0]
            if segment is not None:
                if segment.marks is None:
                    return
                if not segment.sent:
                    segment.sent = True
                    self._send(line, segment.marks)
            held.popleft()
            if envelope.type in TERMINAL:
                self._ended(line)
            d.callback(envelope)
        if turn.lines <= 0:
            self._turns.pop(turn.key, None)

    def _send(self, line: _Line, marks: list[dict[str, Any]]) -> None:
        context = self._context or getattr(self, "context", None)
        if not marks or context is None:
            return
        message = Envelope.build(
            speechmarks.MARKS_ENVELOPE,
            requestId=line.requestId,
            sampleRate=line.outRate,
            marks=marks,
        )
        if line.speaker is not None:
            message["speaker"] = line.speaker
        if line.scene:
            # A scene's line: the client's turn tells its lines by this.
            message.meta[meta.SPEAKER] = line.speaker
        context.sendToGame(message)

    def _drop(self, line: _Line) -> None:
        """The game cancelled the request: what is held of it goes nowhere."""
        line.cancelled = True
        line.collecting = None
        turn = line.turn
        dropped = [entry for entry in turn.held if entry[3] is line]
        turn.held = deque(entry for entry in turn.held if entry[3] is not line)
        for d, _, _, _ in dropped:
            d.callback(None)
        self._release(turn)

    def _alignment(self) -> Any:
        if self._aligner is None:
            # numpy and the alignment: loaded by the first request that asks
            # for words or visemes, never at start-up.
            from rpmiddleware.builtin.animation import alignment

            self._aligner = alignment
        return self._aligner

    # The worker threads.

    def _submit(self, work: Callable[..., T], *args: Any, urgent: bool = False) -> Deferred[T]:
        """
        Run C{work} on a worker thread.  C{urgent} work (aligning a segment
        whose audio is held) has threads of its own, so that it never waits
        behind the text-only work (preparing sentences) of other lines.
        """
        if self._run is not None:
            return self._run(lambda: work(*args))
        return self._workers.submit(work, *args, urgent=urgent)

    @property
    def started(self) -> bool:
        """Whether the worker threads were started (someone asked for words or visemes)."""
        return self._workers.started

    def close(self) -> None:
        self._workers.close()

    # Hooks.

    def engineSessionEnded(self, session: Any, context: IChainContext) -> None:
        for line in list(self._lines.values()):
            self._drop(line)
        self._lines.clear()
        self._turns.clear()

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        # The request's own ending (a cancel) drops what is held; nothing
        # more to keep per client.
        pass


def _ms(sample: float, rate: int) -> int:
    return round(sample * 1000 / rate)


def _rate(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def _sentenceMarks(line: _Line, segment: _Segment, match: Match) -> list[dict[str, Any]]:
    if match.matched and SENTENCE not in line.kinds:
        return []
    rate = line.outRate
    mark: dict[str, Any] = {"time": _ms(segment.first, rate), "type": SENTENCE}
    sentence = match.sentence
    if sentence is not None and match.matched:
        mark.update(start=sentence.start, end=sentence.end, value=sentence.text)
    mark.update(sample=segment.first, samples=segment.out, matched=match.matched)
    return [mark]


def _alignedMarks(
    line: _Line, segment: _Segment, sentence: Sentence, result: Alignment
) -> list[dict[str, Any]]:
    rate = line.outRate
    marks: list[dict[str, Any]] = []
    kinds = ((WORD, result.words), (VISEME, result.visemes))
    timed = [
        (t.start, order, kind, t)
        for order, (kind, ts) in enumerate(kinds)
        for t in ts
        if kind in line.kinds
    ]
    timed.sort(key=lambda item: (item[0], item[1]))
    for _, _, kind, t in timed:
        mark: dict[str, Any] = {
            "time": round((segment.first / rate + t.start) * 1000),
            "type": kind,
            "start": sentence.start + t.textStart,
            "end": sentence.start + t.textEnd,
            "value": t.value,
            "duration": round((t.end - t.start) * 1000),
        }
        if kind == VISEME:
            mark["mouth"] = round(t.mouth, 3)
        marks.append(mark)
    return marks


def _pcm(data: Any) -> bytes:
    if not isinstance(data, str):
        return b""
    try:
        return decodeBase64(data)
    except ValueError:
        return b""


def _language(envelope: Envelope) -> str:
    output = envelope.get("output")
    language = output.get("language") if isinstance(output, Mapping) else None
    return language if isinstance(language, str) else "en"


def _speaker(envelope: Envelope) -> dict[str, Any] | None:
    speaker = envelope.meta.get(meta.SPEAKER)
    if isinstance(speaker, dict):
        return speaker
    characterId = envelope.get("characterId")
    return {"characterId": characterId} if isinstance(characterId, str) else None


def build(settings: Mapping[str, Any], services: IPluginServices) -> SpeechMarks:
    rejectUnknownSettings(SpeechMarks.name, settings, {"threads"})
    threads = settings.get("threads", DEFAULT_THREADS)
    if type(threads) is not int or not 1 <= threads <= 16:
        raise ValueError("threads must be a whole number from 1 to 16")
    return SpeechMarks(services.reactor, threads)


speechMarks = PluginFactory(
    SpeechMarks,
    "Tells games when each sentence, word and mouth shape of a line is spoken.",
    build,
)
