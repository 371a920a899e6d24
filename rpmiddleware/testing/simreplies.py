"""
The simulated RPEngine's replies: accepted, queued, transcribed when they
carry a recording, generated and streamed, completed or failed (app.rs
accept_reply, start_next_reply, stt_completed, begin_gemma,
complete_if_ready, fail_active).
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.protocol.prompt import PromptTooLarge, assemble, promptRequest
from rpmiddleware.testing.replystream import ReplyStream
from rpmiddleware.testing.requestchecks import (
    STT_LANGUAGE_NAMES,
    RequestError,
    checkSpeechOutput,
    pointer,
    recordingSeconds,
    wantsAudio,
)
from rpmiddleware.testing.responsetext import ResponseProcessing
from rpmiddleware.testing.simcore import EngineCore
from rpmiddleware.testing.simoptions import defaultReplyText
from rpmiddleware.testing.simrequests import SimReply
from rpmiddleware.testing.simsummaries import isSummaryRequest, lossySummary


class Replies(EngineCore):
    """
    The session core, with replies.
    """

    def _acceptReply(self, fields: dict[str, Any]) -> None:
        """
        app.rs accept_reply.
        """
        requestId: str = fields["requestId"]
        admitted = self._admit(fields, voice=False)
        if admitted is None:
            return
        resolvedHash, card = admitted
        self._emit(
            "reply.accepted",
            requestId=requestId,
            eventId=fields.get("eventId"),
            resolvedCardHash=resolvedHash,
            queueDepth=self.queueDepth + 1,
        )
        self._queue.append(SimReply(requestId, fields, card))
        self._publishCapacity()
        self._startNextReply()

    def _startNextReply(self) -> None:
        """
        app.rs start_next_reply: the next queued reply becomes active, or
        fails at once for its language, voice or response processing.
        """
        if len(self._active) >= max(1, self.options.concurrency):
            return
        if not self._queue:
            self._publishCapacity()
            return
        reply = self._queue.popleft()
        fields = reply.fields
        try:
            processing = ResponseProcessing.parse(pointer(fields, "output", "responseProcessing"))
        except ValueError as e:
            processing = None
            failure: RequestError | None = RequestError("invalid_request", str(e))
        else:
            failure = None
        if failure is None:
            try:
                checkSpeechOutput(fields)
            except RequestError as e:
                failure = e
        if failure is not None:
            # RPEngine leaves such a requestId in its accepted set.
            self._requestError(reply.requestId, reply.sourceMessageId, failure)
            self._startNextReply()
            return
        self._active[reply.requestId] = reply
        self.processed[reply.requestId] += 1
        audio = pointer(fields, "event", "audio")
        if isinstance(audio, dict):
            if not self._transcribeRecording(reply, audio, processing):
                return
        else:
            self._beginGeneration(reply, None, processing)
        self._publishCapacity()

    def _transcribeRecording(
        self, reply: SimReply, audio: dict[str, Any], processing: ResponseProcessing | None
    ) -> bool:
        """
        A reply with C{event.audio} is transcribed first (app.rs
        start_next_reply, stt_completed).  C{False} when the model for its
        language is missing: RPEngine then publishes no second capacity
        update.
        """
        language = audio.get("language")
        language = language if isinstance(language, str) else self.options.selectedLanguage
        if language not in self.options.installedSttLanguages:
            name = STT_LANGUAGE_NAMES.get(language, "English")
            self._failActive(
                reply,
                RequestError(
                    "stt_model_not_installed", f"the {name} speech recognition model is missing"
                ),
            )
            return False
        try:
            seconds = recordingSeconds(audio)
        except RequestError as e:
            self._failActive(reply, e)
            return True
        transcript = self.options.audioTranscript
        if transcript is None:
            transcript = f"(simulated transcript of {seconds:.2f} s of audio)"
        reply.timers.append(
            self.clock.callLater(
                self.options.transcriptionSeconds,
                self._recordingTranscribed,
                reply,
                transcript,
                processing,
            )
        )
        return True

    def _recordingTranscribed(
        self, reply: SimReply, transcript: str, processing: ResponseProcessing | None
    ) -> None:
        if self._active.get(reply.requestId) is not reply:
            return
        self._beginGeneration(reply, transcript.strip(), processing)
        self._publishCapacity()

    def _beginGeneration(
        self, reply: SimReply, transcript: str | None, processing: ResponseProcessing | None
    ) -> None:
        """
        app.rs begin_gemma: the model is asked for a reply to the event's
        text and the transcript; with neither, the request fails.
        """
        reply.transcript = transcript
        said = pointer(reply.fields, "event", "text")
        said = said.strip() if isinstance(said, str) else ""
        if not said and not transcript:
            self._failActive(
                reply, RequestError("request_failed", "the request has no text and no speech")
            )
            return
        try:
            prompt = assemble(promptRequest(reply.fields, reply.card, transcript))
        except PromptTooLarge as e:
            self._failActive(reply, RequestError("prompt_too_large", str(e)))
            return
        except ValueError as e:
            self._failActive(reply, RequestError("request_failed", str(e)))
            return
        # What the model is given, for tests (app.rs begin_gemma, GemmaInvoke).
        self.invocations.append(prompt)
        request = dict(reply.fields)
        request["prompt"] = prompt
        if transcript:
            request["transcript"] = transcript
        try:
            if self.options.summaryDetails is not None and isSummaryRequest(request):
                text = lossySummary(
                    request, self.options.summaryDetails, self.options.detailPattern
                )
            else:
                text = (self.options.replyText or defaultReplyText)(request)
        except Exception as e:
            # A replyText that raises simulates a failed generation, which
            # RPEngine learns of after the model started.
            error = RequestError("request_failed", f"generation failed: {e}")
            reply.timers.append(self.clock.callLater(0, self._generationFailed, reply, error))
            return
        modalities = pointer(reply.fields, "output", "modalities")
        reply.stream = ReplyStream(
            reply.requestId,
            text,
            wantsAudio(reply.fields),
            self._emit,
            self.clock,
            self.options.pacing(),
            self._replyFinished,
            transcript,
            modalities=modalities if isinstance(modalities, list) else ["text"],
            processing=processing,
            onFailed=lambda stream, code, message: self._generationFailed(
                reply, RequestError(code, message)
            ),
            audioSegment=self._audioSegment if self.sendAudioSegment is not None else None,
        )
        self.spoken[reply.requestId] = reply.stream.spoken
        reply.stream.start()

    def _generationFailed(self, reply: SimReply, error: RequestError) -> None:
        if self._active.get(reply.requestId) is reply:
            self._failActive(reply, error)

    def _replyFinished(self, stream: ReplyStream) -> None:
        """
        The rest of app.rs complete_if_ready, after C{reply.completed}.
        """
        reply = self._active.pop(stream.requestId, None)
        if reply is None:
            return
        self._accepted.discard(reply.requestId)
        self.completed.append(reply.requestId)
        if stream.knownSpeech:
            self.knownSpeech[reply.requestId] = stream.knownSpeech
        self._publishCapacity()
        self._startNextReply()

    def _failActive(self, reply: SimReply, error: RequestError) -> None:
        """
        app.rs fail_active.
        """
        if self._active.pop(reply.requestId, None) is None:
            return
        self._stopReply(reply)
        self._accepted.discard(reply.requestId)
        self._requestError(reply.requestId, reply.sourceMessageId, error)
        self._publishCapacity()
        self._startNextReply()

    @staticmethod
    def _stopReply(reply: SimReply) -> None:
        if reply.stream is not None:
            reply.stream.stop()
        for timer in reply.timers:
            if timer.active():
                timer.cancel()
        reply.timers = []
