"""
The simulated RPEngine's microphone: one voice capture at a time, its states
and levels, the recording echoed to RPEngine's mock game, its transcript,
and the reply it becomes (app.rs accept_capture, stop_capture, capture_*,
stt_completed).  The browser's side is L{rpmiddleware.testing.capture}.
"""

from __future__ import annotations

import base64
from typing import Any

from twisted.logger import Logger

from rpmiddleware.testing.capture import (
    ALREADY_ACTIVE_MESSAGE,
    CANCELLED_MESSAGE,
    CAPTURE_SAMPLE_RATE,
    NOT_ENABLED_MESSAGE,
    MicrophoneCapture,
    Recording,
)
from rpmiddleware.testing.replystream import PCM_CHUNK_BYTES, chunked
from rpmiddleware.testing.requestchecks import RequestError, pointer
from rpmiddleware.testing.simoptions import PlayerTake
from rpmiddleware.testing.simreplies import Replies
from rpmiddleware.testing.simrequests import SimCapture, SimReply

#: The message of the state RPEngine reports when a capture that heard
#: nothing listens again (app.rs stt_completed); the brief quotes it.
LISTENING_AGAIN = "No speech was recognized; listening again."

_log = Logger(namespace="rpmiddleware.testing.simcapture")


class Captures(Replies):
    """
    Replies, with the microphone (the browser's capture events,
    L{rpmiddleware.testing.capture.CaptureEvents}, come here).
    """

    #: The browser's capture left open by a failure it does not clean up
    #: after (L{MicrophoneCapture.leftOpen}); like the browser's, it
    #: outlives connections, and only L{disableMicrophone} ends it.
    _leftOpen: MicrophoneCapture | None = None

    def disableMicrophone(self) -> None:
        """
        The player turns the microphone off in RPEngine: new captures are
        refused with C{microphone_not_enabled}, and the browser throws away
        whatever capture it holds -- one left open, or the current one,
        which the core keeps waiting for a stop (src/app-host.ts
        C{microphoneDisable}; browser-voice-capture.ts C{dispose}; app.rs
        C{microphoneDisabled} only records the state).  A recording still
        being finished after a stop is cancelled by that, and its stop
        fails with "Voice capture was cancelled." (browser-voice-capture.ts
        C{cancel}).
        """
        self.options.microphoneEnabled = False
        self._leftOpen = None
        capture = self._capture
        if capture is not None and capture.microphone.dispose():
            self.captureFailed(capture.microphone, CANCELLED_MESSAGE)

    def enableMicrophone(self) -> None:
        """
        The player turns the microphone on again.
        """
        self.options.microphoneEnabled = True

    def _browserStartRefusal(self) -> str | None:
        """
        Why the browser refuses to start recording, or C{None}
        (src/browser-voice-capture.ts C{start}): its microphone is off, or
        it still holds a capture (L{_leftOpen}).  The host passes the
        refusal to the core as C{captureFailed} once the core's own
        messages for the start are out (src/app-host.ts C{startCapture},
        C{drain}).
        """
        if not self.options.microphoneEnabled:
            return NOT_ENABLED_MESSAGE
        if self._leftOpen is not None:
            return ALREADY_ACTIVE_MESSAGE
        return None

    def _nextTake(self) -> PlayerTake:
        if self._takes:
            return self._takes.popleft()
        return PlayerTake(speechSeconds=self.options.captureSpeechSeconds)

    def _acceptCapture(self, fields: dict[str, Any]) -> None:
        """
        app.rs accept_capture: C{reply.accepted} with the depth counting
        the capture, the microphone starts, capacity is published.
        """
        requestId: str = fields["requestId"]
        admitted = self._admit(fields, voice=True)
        if admitted is None:
            return
        resolvedHash, card = admitted
        microphone = MicrophoneCapture(
            requestId,
            self.clock,
            self,
            self._nextTake,
            fields.get("silenceBehavior") == "restart",
            self.options.captureLevelInterval,
        )
        self._capture = SimCapture(requestId, fields, card, microphone)
        self._emit(
            "reply.accepted",
            requestId=requestId,
            eventId=fields.get("eventId"),
            resolvedCardHash=resolvedHash,
            queueDepth=self.queueDepth,
        )
        refused = self._browserStartRefusal()
        if refused is None:
            microphone.start()
        self._publishCapacity()
        if refused is not None:
            self.captureFailed(microphone, refused)

    def _dropCapture(self) -> bool:
        """
        Forget the capture and throw its recording away.

        @return: whether the browser was still finishing the recording
            (see L{rpmiddleware.testing.capture.MicrophoneCapture.cancel}).
        """
        capture, self._capture = self._capture, None
        if capture is None:
            return False
        finishing = capture.microphone.cancel()
        if capture.timer is not None and capture.timer.active():
            capture.timer.cancel()
        return finishing

    def _currentCapture(self, microphone: MicrophoneCapture) -> SimCapture | None:
        capture = self._capture
        return capture if capture is not None and capture.microphone is microphone else None

    def _stopCapture(self, requestId: str) -> None:
        """
        app.rs stop_capture: only a capture that is still capturing stops;
        anything else is ignored.
        """
        capture = self._capture
        if capture is None or capture.requestId != requestId or capture.phase != "capturing":
            return
        capture.phase = "stopping"
        capture.microphone.stop()

    def captureState(
        self,
        capture: MicrophoneCapture,
        state: str,
        seconds: float,
        autoEndEnabled: bool,
        message: str | None,
    ) -> None:
        """
        app.rs capture_state: passed on; C{speech_ended} stops the capture.
        """
        if self._capture is None:
            return
        self._emit(
            "voice.capture.state",
            requestId=capture.requestId,
            state=state,
            seconds=seconds,
            autoEndEnabled=autoEndEnabled,
            message=message,
        )
        if state == "speech_ended":
            self._stopCapture(capture.requestId)

    def captureLevel(
        self, capture: MicrophoneCapture, seconds: float, peak: float, rms: float
    ) -> None:
        """
        app.rs capture_level.
        """
        if self._capture is not None:
            self._emit(
                "voice.capture.level",
                requestId=capture.requestId,
                seconds=seconds,
                peak=peak,
                rms=rms,
            )

    def captureFailed(self, capture: MicrophoneCapture, message: str) -> None:
        """
        app.rs capture_failed: the capture ends with C{request_failed}.
        """
        current = self._currentCapture(capture)
        source = str(current.fields.get("messageId", "")) if current is not None else ""
        if capture.leftOpen and self._leftOpen is None:
            _log.info(
                "Simulated browser keeps failed capture {requestId} open",
                requestId=capture.requestId,
                reason=message,
            )
            self._leftOpen = capture
        if current is not None:
            self._dropCapture()
        self._accepted.discard(capture.requestId)
        self._requestError(capture.requestId, source, RequestError("request_failed", message))
        self._publishCapacity()

    def captureCompleted(
        self, capture: MicrophoneCapture, recording: Recording, take: PlayerTake
    ) -> None:
        """
        app.rs capture_completed: the recording goes to speech recognition,
        echoed first to RPEngine's own mock game when it asks for it.
        """
        current = self._currentCapture(capture)
        if current is None:
            return
        if current.fields.get("integrationId") == "mock-game" and (
            pointer(current.fields, "debug", "echoCapturedAudio") is True
        ):
            self._echoRecording(current.requestId, recording)
        current.phase = "transcribing"
        transcript = take.transcript
        if transcript is None:
            transcript = f"(simulated transcript of {recording.speechSeconds:.2f} s of speech)"
        current.timer = self.clock.callLater(
            self.options.transcriptionSeconds, self._captureTranscribed, current, transcript
        )

    def _echoRecording(self, requestId: str, recording: Recording) -> None:
        """
        app.rs capture_completed: the recording as PCM16 in 32 KiB chunks.
        """
        pcm = recording.pcm()
        parts = chunked(pcm, PCM_CHUNK_BYTES)
        self._emit(
            "voice.capture.audio.start",
            requestId=requestId,
            format="pcm_s16le",
            sampleRate=CAPTURE_SAMPLE_RATE,
            channels=1,
        )
        for sequence, part in enumerate(parts):
            self._emit(
                "voice.capture.audio.chunk",
                requestId=requestId,
                sequence=sequence,
                data=base64.b64encode(part).decode("ascii"),
            )
        self._emit(
            "voice.capture.audio.completed",
            requestId=requestId,
            chunkCount=len(parts),
            totalBytes=len(pcm),
            durationSeconds=len(pcm) / 2 / CAPTURE_SAMPLE_RATE,
        )

    def _captureTranscribed(self, capture: SimCapture, text: str) -> None:
        """
        app.rs stt_completed for a capture: listen again, report the
        transcript, fail with C{empty_speech}, or queue the reply.
        """
        if self._capture is not capture:
            return
        text = text.strip()
        self._capture = None
        requestId = capture.requestId
        if not text and capture.fields.get("silenceBehavior") == "restart":
            capture.phase = "capturing"
            capture.timer = None
            self._capture = capture
            self._emit(
                "voice.capture.state",
                requestId=requestId,
                state="listening",
                seconds=0,
                autoEndEnabled=True,
                message=LISTENING_AGAIN,
            )
            refused = self._browserStartRefusal()
            if refused is None:
                capture.microphone.start()
            self._publishCapacity()
            if refused is not None:
                self.captureFailed(capture.microphone, refused)
            return
        if capture.fields.get("returnTranscript") is True:
            self._emit(
                "voice.capture.transcript",
                requestId=requestId,
                text=text,
                language=self.options.selectedLanguage,
                elapsedMs=round(self.options.transcriptionSeconds * 1000.0, 3),
            )
        if not text:
            self._accepted.discard(requestId)
            self._requestError(
                requestId,
                str(capture.fields.get("messageId", "")),
                RequestError("empty_speech", "no speech was recognised in the recording"),
            )
        else:
            fields = dict(capture.fields, type="reply.request", event={"text": text})
            self._queue.append(SimReply(requestId, fields, capture.card))
            self._startNextReply()
        self._publishCapacity()
