"""
One turn of one client: RPEngine's reply stream, told in the client's words.

    reply.accepted            -> (the accept timeout stops; the stall rule
                                 starts once RPEngine works on it)
    reply.text.delta          -> llm-chunk {content, done: false}
    reply.text.completed      -> llm-chunk {content: "", done: true},
                                 llm {text, extractedContent?}
    reply.audio.start         -> tts-start            (streaming)
    reply.audio.chunk         -> tts-chunk {format: "pcm", sampleRate, data}
    reply.audio.completed     -> [tts {format: "wav"} when not streaming], tts-complete
    reply.completed           -> reply-complete {text, modalities, stats, ...}
    reply.cancelled           -> tts-cancelled {reason, engineReason}
    request.error             -> error (mapped), and tts-cancelled if the reply had begun
    voice.capture.state       -> voice-state; speech-start (speech_started),
                                 speech-end (speech_ended)
    voice.capture.level       -> voice-level {level, peak, rms, seconds}
    voice.capture.transcript  -> transcript {text, isFinal: true}

The field names are RPEngine's (C{crates/rp-engine-core/src/app.rs}:
C{gemma_completed} builds reply.text.completed, C{complete_if_ready}
reply.audio.completed and reply.completed, C{capture_state},
C{capture_level} and C{stt_completed} the voice.capture reports,
C{cancel_request} reply.cancelled).

A turn may hold several lines, each by one character (a scene's: the
addressed character's answer, then another's reaction).  Every envelope of a
line carries its speaker in C{meta["speaker"]} (L{rpmiddleware.protocol.meta.SPEAKER}:
C{characterId}, C{name}, C{voice}), and each message of that line says it as
C{speaker}: C{llm-chunk}, C{llm}, C{tts-start}, C{tts-chunk}, C{tts} and C{tts-complete}, each line
with its own C{tts-start} and C{tts-complete}; C{reply-complete} lists the
C{lines}.  A turn without speakers is told exactly as before.

A turn cancelled here (the client's C{cancel}, a barge-in, a client that does
not read) says C{tts-cancelled} at once and is silent from then on: whatever
RPEngine had already sent for it is dropped, so nothing of it can be mistaken
for the next turn.  Every message carries the turn's C{turnId}.

A plugin's fields (C{x-...}, L{rpmiddleware.plugin.clientext.pluginFields}) on an
envelope reach every message sent for that envelope, and are never counted
among RPEngine's statistics (C{docs/client-protocol.md}, I{Unknown and extra
fields}).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from rpmiddleware.audio.format import encodeBase64
from rpmiddleware.client.messages import turnMessage
from rpmiddleware.client.tts import SpeechOutput, SpeechTooLong
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.core.view import EngineQueueView
from rpmiddleware.plugin.clientext import isPluginField, pluginFields
from rpmiddleware.protocol.clienterrors import (
    LLM_TIMEOUT,
    TTS_ERROR,
    engineErrorMessage,
    errorMessage,
)
from rpmiddleware.protocol.envelope import ENVELOPE_FIELDS, Envelope
from rpmiddleware.protocol.feelings import CLIENT_TYPE as FEELING_CLIENT_TYPE
from rpmiddleware.protocol.feelings import FEELING_ENVELOPE, FEELING_FIELDS
from rpmiddleware.protocol.messages import textOfDelta
from rpmiddleware.protocol.meta import PLAYED, PLAYED_LINE, SPEAKER
from rpmiddleware.protocol.speechmarks import CLIENT_TYPE as MARKS_CLIENT_TYPE
from rpmiddleware.protocol.speechmarks import MARKS_ENVELOPE

#: What a turn is about: typed text, a recording, or the RPEngine microphone.
TEXT, AUDIO, VOICE = "text", "audio", "voice"

#: voice.capture.state values that the seed's speech messages stand for
#: (RPEngine's browser capture reports listening, speech_started and
#: speech_ended: src/browser-voice-capture.ts).
SPEECH_STATES = {"speech_started": "speech-start", "speech_ended": "speech-end"}

_HEAD = frozenset({*ENVELOPE_FIELDS, "requestId"})
#: What RPEngine sends of the reply it is working on (one at a time, so a
#: new speaker here is the next line; a later line's reply.accepted may come
#: while this one is still spoken).
_LINE_TYPES = frozenset(
    {
        "reply.text.delta",
        "reply.text.completed",
        "reply.audio.start",
        "reply.audio.chunk",
        "reply.audio.completed",
        MARKS_ENVELOPE,
    }
)
#: The messages of one line, which say its speaker in a scene.
_LINE_MESSAGES = frozenset({"llm-chunk", "llm", "tts-start", "tts-complete"})
#: reply.text.completed fields that are the reply, not its statistics.
_TEXT_CONTENT = frozenset({"text", "extractedContent"})


class Send(Protocol):
    def __call__(self, message: dict[str, Any], audio: bool = False) -> bool:
        """
        Send a message to the client; C{False} if it was held back (audio to
        a client that is not reading).
        """


def _stats(fields: Mapping[str, Any], content: frozenset[str] = frozenset()) -> dict[str, Any]:
    """
    RPEngine's statistics on a completed stream as it sent them: every field
    but the envelope's own, the requestId and the C{content} fields (so a
    figure a later RPEngine adds is passed on too); never a plugin's fields.
    """
    return {
        k: v
        for k, v in fields.items()
        if k not in _HEAD and k not in content and not isPluginField(k)
    }


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Turn:
    """
    @ivar outcome: C{None} while running, then C{"completed"},
        C{"cancelled"} or C{"failed"}.
    @ivar replyText: the character's words so far.
    @ivar transcript: the player's words: typed, or as RPEngine heard them.
    @ivar capturing: (voice turns) RPEngine's microphone is open for this
        turn: listening or hearing the player, so C{voice.capture.stop}
        still ends the speech.
    @ivar capturePhase: (voice turns) RPEngine still holds its one
        microphone capture for this turn: from the start until the words are
        transcribed or the reply begins.  A second capture then would be
        refused (voice_capture_active).
    @ivar extractedContent: what RPEngine's response processing captured
        (rule id -> strings), when the turn asked for it.
    """

    log = Logger()

    def __init__(
        self,
        kind: str,
        stream: ReplyStream,
        send: Send,
        speech: SpeechOutput | None,
        clock: IReactorTime,
        acceptTimeout: float,
        onEnded: Callable[[Turn], None],
        playerText: str | None = None,
        stallTimeout: float = 0.0,
        queue: EngineQueueView | None = None,
    ) -> None:
        self.kind = kind
        self.stream = stream
        self.id = stream.requestId
        self._send = send
        self.speech = speech
        self._clock = clock
        self._acceptTimeout = acceptTimeout
        self._onEnded = onEnded
        self.transcript = playerText
        self.accepted = False
        self.capturing = kind == VOICE
        self.capturePhase = kind == VOICE
        #: speech-start was said, and whether speech-end followed it.
        self._speechStarted = False
        self._speechEnded = False
        self.ttsStarted = False
        self.silenced = False
        self.outcome: str | None = None
        self._pieces: list[str] = []
        self._fullText: str | None = None
        self.extractedContent: dict[str, Any] | None = None
        self._textStats: dict[str, Any] | None = None
        self._audioStats: dict[str, Any] | None = None
        self._timer: IDelayedCall | None = None
        #: The stall rule: RPEngine's active request silent this long ends.
        self._stallTimeout = stallTimeout
        self._queue = queue
        self._stallTimer: IDelayedCall | None = None
        self._stallWatched = False
        #: The speaker of the line being told, and the lines told before it.
        self._speaker: dict[str, Any] | None = None
        self._lines: list[dict[str, Any]] = []

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    @property
    def replyText(self) -> str:
        return self._fullText if self._fullText is not None else "".join(self._pieces)

    @property
    def lines(self) -> list[dict[str, Any]]:
        """
        Each line of the turn with its speaker (a scene's), or none for a
        turn whose envelopes named no speaker.
        """
        if self._speaker is None:
            return []
        return [*self._lines, {"speaker": self._speaker, "text": self.replyText}]

    def start(self) -> None:
        """
        Echo typed text, then follow the stream (which may already hold
        envelopes, even its end, if the request was answered at once).
        """
        if self.kind == TEXT and self.transcript is not None:
            self._say("transcript", text=self.transcript, isFinal=True)
        if self._acceptTimeout > 0:
            self._timer = self._clock.callLater(self._acceptTimeout, self._notAccepted)
        # The stream's outcome is told through its envelopes; its Deferred is
        # consumed so that a failed turn is not reported as an unhandled error.
        self.stream.done.addErrback(lambda failure: None)
        self.stream.subscribe(self._received)

    def cancel(self, reason: str | None = None, played: Mapping[str, Any] | None = None) -> None:
        """
        Stop this turn: C{tts-cancelled} now, C{request.cancel} (or
        C{voice.capture.cancel}) upstream, and silence.  The cancel tells
        the plugins how much of the reply's speech the player was played
        (L{PLAYED}): what the client reported (C{played}, as
        L{rpmiddleware.client.messages.played} reads it), else what the
        speech output knows it played (the WebRTC track), else nothing.
        """
        if self.ended or self.silenced:
            return
        # Read before tts-cancelled silences the speech track.
        heard = self._played(played)
        self.silenced = True
        self.capturing = self.capturePhase = False
        self._stopTimer()
        self._stopStall()
        fields = {"reason": reason} if reason else {}
        self._say("tts-cancelled", **fields)
        self.log.info(
            "client turn {turnId} cancelled: {reason}",
            turnId=self.id,
            reason=reason or "the client asked",
        )
        self.stream.cancel({PLAYED: heard} if heard is not None else None)

    def playedAfterEnd(self, reported: Mapping[str, Any] | None) -> dict[str, int] | None:
        """
        How much of this turn's speech the player was played, for a turn
        that completed upstream while its speech still played and was then
        cut off (L{rpmiddleware.plugin.clientext.TURN_PLAYED}): as
        L{_played} (for a scene's turn of several lines, with the line that
        was playing, L{PLAYED_LINE}, when it is known), for a completed
        turn, else C{None}.
        """
        if self.outcome != "completed":
            return None
        return self._played(reported)

    def _played(self, reported: Mapping[str, Any] | None) -> dict[str, int] | None:
        """
        L{PLAYED} for this turn's cancel: C{{samples, sampleRate}} of the
        line's speech the player was played, and C{line} (L{PLAYED_LINE}),
        which of the turn's spoken lines, when the client said it or the
        speech output knows it (the WebRTC track); or C{None} when there is
        no speech or nobody knows.  A report in milliseconds is counted down
        to whole samples, so it never claims more than was played.
        """
        speech = self.speech
        if speech is None:
            return None
        if reported is not None:
            rate = speech.rate
            if "samples" in reported:
                amount = {"samples": int(reported["samples"]), "sampleRate": rate}
            else:
                amount = {"samples": int(reported["ms"] * rate // 1000), "sampleRate": rate}
            if PLAYED_LINE in reported:
                amount[PLAYED_LINE] = int(reported[PLAYED_LINE])
            return amount
        return speech.played()

    # The stream.

    def _received(self, envelope: Envelope) -> None:
        extra = pluginFields(envelope.fields)
        if not extra:
            self._follow(envelope)
            return
        # A plugin's fields go on every message sent for this envelope.
        send = self._send

        def withExtra(message: dict[str, Any], audio: bool = False) -> bool:
            return send({**message, **extra}, audio)

        self._send = withExtra
        try:
            self._follow(envelope)
        finally:
            self._send = send

    def _follow(self, envelope: Envelope) -> None:
        kind = envelope.type
        fields = envelope.fields
        if kind in ("reply.completed", "reply.cancelled", "request.error"):
            self._terminal(kind, fields)
            return
        if self.silenced or self.ended:
            return
        speaker = envelope.meta.get(SPEAKER) if kind in _LINE_TYPES else None
        if isinstance(speaker, dict) and speaker != self._speaker:
            self._nextLine(speaker)
        handler = self._HANDLERS.get(kind)
        if handler is not None:
            handler(self, fields)
        if self.accepted and not (self.silenced or self.ended):
            self._heard()

    def _nextLine(self, speaker: dict[str, Any]) -> None:
        """
        A line by another speaker begins: the one before it is told.
        """
        if self._speaker is not None:
            self._lines.append({"speaker": self._speaker, "text": self.replyText})
        self._speaker = speaker
        self._pieces = []
        self._fullText = None
        self.ttsStarted = False

    # The stall rule.

    def _heard(self) -> None:
        """
        RPEngine said something of this accepted turn: if it is RPEngine's
        active request, the stall timer starts again; a queued one waits its
        turn untimed, and is timed from when it becomes active.
        """
        if self._stallTimeout <= 0 or self._queue is None:
            return
        if self._queue.isActive(self.id):
            self._armStall()
        elif not self._stallWatched:
            self._stallWatched = True
            self._queue.whenActive(self.id, self._becameActive)

    def _becameActive(self) -> None:
        self._stallWatched = False
        if not (self.ended or self.silenced):
            self._armStall()

    def _armStall(self) -> None:
        if self._stallTimer is not None and self._stallTimer.active():
            self._stallTimer.reset(self._stallTimeout)
            return
        self._stallTimer = self._clock.callLater(self._stallTimeout, self._stalled)

    def _stalled(self) -> None:
        self._stallTimer = None
        self.log.warn(
            "client turn {turnId}: RPEngine, working on it, sent nothing for {seconds:g} s; "
            "cancelling it",
            turnId=self.id,
            seconds=self._stallTimeout,
        )
        self._fail(
            LLM_TIMEOUT,
            f"RPEngine started this turn but sent nothing more for {self._stallTimeout:g} s "
            "(its model or its tab may have stopped); it was cancelled, ask again",
            retryable=True,
        )

    def _accepted(self, fields: Mapping[str, Any]) -> None:
        self.accepted = True
        self._stopTimer()

    def _replying(self) -> None:
        """
        The reply has begun: a capture's microphone part is over.
        """
        self.accepted = True
        self._stopTimer()
        self.capturing = self.capturePhase = False

    def _delta(self, fields: Mapping[str, Any]) -> None:
        self._replying()
        piece = textOfDelta(fields)
        self._pieces.append(piece)
        self._say("llm-chunk", content=piece, done=False)

    def _textCompleted(self, fields: Mapping[str, Any]) -> None:
        """
        The whole text (with response processing, the only text: RPEngine
        sends no deltas then), and what the rules extracted.
        """
        self._replying()
        text = fields.get("text")
        self._fullText = text if isinstance(text, str) else "".join(self._pieces)
        self._textStats = _stats(fields, _TEXT_CONTENT)
        extracted = fields.get("extractedContent")
        if isinstance(extracted, dict):
            self.extractedContent = extracted
        self._say("llm-chunk", content="", done=True)
        self._say("llm", text=self._fullText, **self._extracted())

    def _extracted(self) -> dict[str, Any]:
        if self.extractedContent is None:
            return {}
        return {"extractedContent": self.extractedContent}

    def _audioStart(self, fields: Mapping[str, Any]) -> None:
        self._replying()
        if self.speech is None:
            return
        self.speech.started(fields)
        if self.speech.streaming:
            self._ttsStart()

    def _ttsStart(self) -> None:
        if not self.ttsStarted:
            self.ttsStarted = True
            self._say("tts-start")

    def _audioChunk(self, fields: Mapping[str, Any]) -> None:
        speech = self.speech
        if speech is None:
            return
        try:
            pieces = speech.chunk(fields)
        except SpeechTooLong as e:
            self._fail(TTS_ERROR, str(e))
            return
        except ValueError as e:
            self.log.warn(
                "skipped a speech chunk of turn {turnId}: {why}", turnId=self.id, why=str(e)
            )
            return
        self._sendSpeech(pieces)

    def _sendSpeech(self, pieces: list[str]) -> None:
        speech = self.speech
        assert speech is not None
        for piece in pieces:
            self._ttsStart()
            chunk = turnMessage(
                "tts-chunk", self.id, format="pcm", sampleRate=speech.rate, data=piece
            )
            if self._speaker is not None:
                chunk["speaker"] = self._speaker
            if not self._send(chunk, audio=True):
                self.cancel("the client is not reading its messages fast enough")
                return

    def _audioCompleted(self, fields: Mapping[str, Any]) -> None:
        self._audioStats = _stats(fields)
        speech = self.speech
        if speech is None:
            return
        self._sendSpeech(speech.finish())
        if self.silenced:
            return
        if not speech.streaming:
            wav = turnMessage(
                "tts",
                self.id,
                format="wav",
                sampleRate=speech.rate,
                data=encodeBase64(speech.wav()),
                **self._spoken(),
            )
            if not self._send(wav, audio=True):
                self.cancel("the client is not reading its messages fast enough")
                return
        self._say("tts-complete")

    def _captureState(self, fields: Mapping[str, Any]) -> None:
        """
        RPEngine's capture state: C{listening} (again, after a silent
        recording with silenceBehavior "restart"), C{speech_started},
        C{speech_ended} (RPEngine then stops the capture itself and
        transcribes).
        """
        state = str(fields.get("state"))
        self.accepted = True
        self._stopTimer()
        extra: dict[str, Any] = {}
        if _number(fields.get("seconds")):
            extra["seconds"] = fields["seconds"]
        if isinstance(fields.get("autoEndEnabled"), bool):
            extra["autoEndEnabled"] = fields["autoEndEnabled"]
        if isinstance(fields.get("message"), str):
            extra["message"] = fields["message"]
        self._say("voice-state", state=state, **extra)
        if state == "speech_started":
            self._speechStarted, self._speechEnded = True, False
            self._say(SPEECH_STATES[state])
        elif state == "speech_ended":
            self.capturing = False
            self._endSpeech()
        if state in ("listening", "speech_started"):
            self.capturing = self.capturePhase = True
        if state == "listening":
            self._speechStarted = self._speechEnded = False

    def _endSpeech(self) -> None:
        if not self._speechEnded:
            self._speechEnded = True
            self._say(SPEECH_STATES["speech_ended"])

    def stopCapture(self) -> bool:
        """
        The client's C{voice-capture stop}: whether voice.capture.stop
        should go to RPEngine (only while its microphone is open).  Speech
        the client was told had started is said to end now: RPEngine reports
        no C{speech_ended} for a capture the game stopped.
        """
        if not self.capturing or self.silenced or self.ended:
            return False
        self.capturing = False
        if self._speechStarted:
            self._endSpeech()
        return True

    def _captureLevel(self, fields: Mapping[str, Any]) -> None:
        """
        The microphone's level: RPEngine's C{peak} and C{rms} (0..1) and the
        capture's C{seconds}, plus C{level} for clients that know one
        number: the peak (falling back to rms), which spans the meter on
        ordinary speech where rms stays near its bottom.
        """
        extra = {
            name: fields[name] for name in ("peak", "rms", "seconds") if _number(fields.get(name))
        }
        level = extra.get("peak", extra.get("rms", fields.get("level")))
        if not _number(level):
            return
        self._say("voice-level", level=level, **extra)

    def _captureTranscript(self, fields: Mapping[str, Any]) -> None:
        """
        What RPEngine heard (the middleware asks for it with
        C{returnTranscript: true}).  An empty one is not passed on: it is
        followed by C{request.error} empty_speech, or with silenceBehavior
        "restart" by C{listening} again.
        """
        self.capturing = False
        text = fields.get("text")
        if not isinstance(text, str) or not text.strip():
            return
        self.capturePhase = False
        self.transcript = text
        extra = {"language": fields["language"]} if isinstance(fields.get("language"), str) else {}
        self._say("transcript", text=text, isFinal=True, **extra)

    def _speechMarks(self, fields: Mapping[str, Any]) -> None:
        """
        A line's speech marks, from the speech-marks plugin
        (L{rpmiddleware.protocol.speechmarks}): told before the audio they
        describe (the plugin holds that audio until they are sent), with the
        line's speaker (a scene's, else the character the plugin named).
        """
        marks = fields.get("marks")
        if not isinstance(marks, list) or self.speech is None:
            return
        speaker = self._speaker if self._speaker is not None else fields.get("speaker")
        self._send(
            turnMessage(
                MARKS_CLIENT_TYPE,
                self.id,
                speaker=speaker,
                sampleRate=fields.get("sampleRate"),
                marks=self._shownMarks(marks),
            )
        )

    def _shownMarks(self, marks: list[Any]) -> list[Any]:
        """
        The marks with each sentence's and word's C{value} as this client
        was shown it: the line's text at the mark's offsets (the C{llm} text,
        which a plugin nearer the game, moderation, may have masked), so a
        mark never shows a word the text did not.
        """
        shown = self.replyText.lstrip()
        result = []
        for mark in marks:
            if isinstance(mark, dict) and mark.get("type") in ("sentence", "word"):
                start, end = mark.get("start"), mark.get("end")
                if type(start) is int and type(end) is int and 0 <= start <= end <= len(shown):
                    mark = {**mark, "value": shown[start:end]}
                elif "value" in mark:
                    mark = {k: v for k, v in mark.items() if k != "value"}
            result.append(mark)
        return result

    def _feeling(self, fields: Mapping[str, Any]) -> None:
        """
        One sentence's feeling, from the feelings plugin
        (L{rpmiddleware.protocol.feelings}), sent before that sentence's
        audio; with the speaker the plugin named (in a scene, the line's,
        which may not have begun here yet).
        """
        told = {k: fields[k] for k in FEELING_FIELDS if k in fields}
        self._send(turnMessage(FEELING_CLIENT_TYPE, self.id, **told))

    _HANDLERS: dict[str, Callable[[Turn, Mapping[str, Any]], None]] = {
        MARKS_ENVELOPE: _speechMarks,
        FEELING_ENVELOPE: _feeling,
        "reply.accepted": _accepted,
        "reply.text.delta": _delta,
        "reply.text.completed": _textCompleted,
        "reply.audio.start": _audioStart,
        "reply.audio.chunk": _audioChunk,
        "reply.audio.completed": _audioCompleted,
        "voice.capture.state": _captureState,
        "voice.capture.level": _captureLevel,
        "voice.capture.transcript": _captureTranscript,
    }

    def _terminal(self, kind: str, fields: Mapping[str, Any]) -> None:
        if self.ended:
            return
        if not self.silenced:
            if kind == "reply.completed":
                self._complete(fields)
            elif kind == "reply.cancelled":
                self._cancelledUpstream(fields)
            else:
                self._send(engineErrorMessage(dict(fields), self.id))
                if self.accepted or self.ttsStarted or fields.get("code") == "engine_disconnected":
                    self._say("tts-cancelled")
        self._end(
            {"reply.completed": "completed", "reply.cancelled": "cancelled"}.get(kind, "failed")
        )

    def _cancelledUpstream(self, fields: Mapping[str, Any]) -> None:
        """
        RPEngine (or a plugin) cancelled a turn the client did not: its
        reason (C{requested_by_game}, C{not_active}, C{connection_lost}) as
        C{engineReason}, and a sentence as C{reason}.
        """
        engineReason = fields.get("reason")
        if isinstance(engineReason, str) and engineReason:
            self._say(
                "tts-cancelled",
                reason=f"RPEngine cancelled this turn ({engineReason})",
                engineReason=engineReason,
            )
        else:
            self._say("tts-cancelled", reason="RPEngine cancelled this turn")

    def _complete(self, fields: Mapping[str, Any]) -> None:
        text, lines = self.replyText, self.lines
        if lines:
            text = "\n".join(line["text"] for line in lines if line["text"])
        message = turnMessage("reply-complete", self.id, text=text, **self._extracted())
        if lines:
            message["lines"] = lines
        modalities = fields.get("modalities")
        if isinstance(modalities, list):
            message["modalities"] = modalities
        stats: dict[str, Any] = {}
        if self._textStats is not None:
            stats["text"] = self._textStats
        if self._audioStats is not None:
            stats["audio"] = self._audioStats
        message["stats"] = stats
        if self.speech is not None and self.speech.samples:
            message["speech"] = {"sampleRate": self.speech.rate, "samples": self.speech.samples}
        self._send(message)

    def _end(self, outcome: str) -> None:
        self.outcome = outcome
        self.capturing = self.capturePhase = False
        self._stopTimer()
        self._stopStall()
        self._onEnded(self)

    # Failures found here.

    def _fail(self, code: str, message: str, retryable: bool = False) -> None:
        """
        End the turn for a reason of our own: the error, then cancel it.
        """
        if self.ended or self.silenced:
            return
        self._send(errorMessage(code, message, retryable, turnId=self.id))
        self.cancel(message)

    def _notAccepted(self) -> None:
        self._timer = None
        self._fail(
            LLM_TIMEOUT,
            f"RPEngine did not take this turn within {self._acceptTimeout:g} s "
            "(it is not connected, or busy); it was cancelled, ask again",
            retryable=True,
        )

    def _stopTimer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _stopStall(self) -> None:
        if self._stallTimer is not None and self._stallTimer.active():
            self._stallTimer.cancel()
        self._stallTimer = None

    def _spoken(self) -> dict[str, Any]:
        return {"speaker": self._speaker} if self._speaker is not None else {}

    def _say(self, kind: str, **fields: Any) -> None:
        if kind in _LINE_MESSAGES and self._speaker is not None:
            fields["speaker"] = self._speaker
        self._send(turnMessage(kind, self.id, **fields))
