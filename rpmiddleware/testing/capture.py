"""
A simulated browser microphone for C{voice.capture.start}.

In RPEngine the player speaks into the browser (src/browser-voice-capture.ts)
and a voice activity detector (FireRedVAD, its policy in
crates/rp-engine-core/src/worker.rs VadWorkerPolicyCore and vad.rs
VadStateCore) reports C{listening}, C{speech_started} and C{speech_ended};
the microphone worklet (public/microphone-worklet.js) reports levels every
0.1 s.  RPEngine's core (app.rs C{capture_state}) stops the capture itself on
C{speech_ended}; the game may stop it earlier with C{voice.capture.stop} or
throw it away with C{voice.capture.cancel}.  With no speech within 8 s the
browser either fails the capture or, with C{silenceBehavior: "restart"},
starts listening again; a capture held for 30 s stops recording and waits.

Here the player follows a script of L{PlayerTake}s (silence, then speech of
some length and loudness, how much audio the recorder really hands over,
then what recognition will make of it), on simulated time: the reactor's
clock is the browser's wall clock.  This class is the browser's side: it
reports what happened to the engine through L{CaptureEvents}, which sends
what RPEngine's core would.

When a capture stops, the browser checks the recording before the core
ever sees it (src/browser-voice-capture.ts C{BrowserVoiceCapture.finalize},
followed by L{refusal}): nothing recorded, a length that does not match
the time the capture took, or nothing audible each fail the capture with
the browser's own message, which the host hands to the core as
C{captureFailed} (src/app-host.ts C{execute}, C{captureStop}) and the core
sends as C{request.error request_failed}, not retryable (app.rs
C{capture_failed}).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from rpmiddleware.protocol.messages import INPUT_SAMPLE_RATE
from rpmiddleware.testing.simoptions import PlayerTake
from rpmiddleware.testing.tones import sampleCount

#: FireRedVAD's timing (vad.rs VadStateCore defaults, worker.rs).
SPEECH_START_SECONDS = 0.2
MINIMUM_SPEECH_SECONDS = 0.25
SILENCE_END_SECONDS = 0.1
NO_SPEECH_SECONDS = 8.0
#: The browser stops recording after this long (browser-voice-capture.ts).
MAX_CAPTURE_SECONDS = 30.0
#: Captured audio is 16 kHz mono (browser-voice-capture.ts).
CAPTURE_SAMPLE_RATE = INPUT_SAMPLE_RATE

#: A recording is inaudible when its peak is under this and its RMS under
#: L{SILENCE_RMS} (browser-voice-capture.ts, both must hold).
SILENCE_PEAK = 0.01
SILENCE_RMS = 0.003
#: A recording whose length is off the capture's wall-clock time by more
#: than the larger of these (seconds; share of the wall-clock time) is
#: incomplete (browser-voice-capture.ts finalize).
LENGTH_TOLERANCE_SECONDS = 0.5
LENGTH_TOLERANCE_SHARE = 0.2
#: How loud the simulated player speaks (peak, full scale 1.0) unless a
#: take says otherwise; well above L{SILENCE_PEAK}.
SPEAKING_LOUDNESS = 0.2

# The messages the browser fails a capture with.  They reach the game
# verbatim as request.error's message, so they are RPEngine's exact wire
# strings (src/browser-voice-capture.ts receiveVad, finalize, cancel).
NO_SPEECH_MESSAGE = "No speech was detected within 8 seconds."
NO_AUDIO_MESSAGE = "No microphone audio was captured."
INCOMPLETE_RECORDING_MESSAGE = "The browser produced an incomplete recording. Please try again."
INAUDIBLE_MESSAGE = "No audible microphone input was detected."
CANCELLED_MESSAGE = "Voice capture was cancelled."
ALREADY_ACTIVE_MESSAGE = "A voice capture is already active."
NOT_ENABLED_MESSAGE = "Enable microphone in GameLink before starting a voice message."
NO_MATCHING_MESSAGE = "No matching voice capture is active."

# voice.capture.state messages: their meaning is RPEngine's, the words ours.
STILL_LISTENING_MESSAGE = "Nothing heard yet; listening on."
LIMIT_MESSAGE = "The 30-second recording limit was reached; stop or cancel the capture."

_log = Logger(namespace="rpmiddleware.testing.capture")


class CaptureEvents(Protocol):
    """
    What the browser tells RPEngine's core about a capture (the host events
    C{captureState}, C{captureLevel}, C{captureFailed} and
    C{captureCompleted} of src/app-host.ts).
    """

    def captureState(
        self,
        capture: MicrophoneCapture,
        state: str,
        seconds: float,
        autoEndEnabled: bool,
        message: str | None,
    ) -> None: ...

    def captureLevel(
        self, capture: MicrophoneCapture, seconds: float, peak: float, rms: float
    ) -> None: ...

    def captureFailed(self, capture: MicrophoneCapture, message: str) -> None: ...

    def captureCompleted(
        self, capture: MicrophoneCapture, recording: Recording, take: PlayerTake
    ) -> None: ...


@dataclass(frozen=True)
class Recording:
    """
    What a stopped window recorded: C{seconds} of audio in which the player
    spoke for C{speechSeconds} from C{speechStart} on, at C{loudness} (peak,
    full scale 1.0), over a capture that took C{wallSeconds} on the clock
    (C{None}: exactly as long as the audio).
    """

    seconds: float
    speechStart: float
    speechSeconds: float
    loudness: float = SPEAKING_LOUDNESS
    wallSeconds: float | None = None

    def samples(self) -> np.ndarray:
        """
        The recording as 16 kHz mono float samples, as the browser decodes
        it: silence, a voice-band tone while the player spoke, silence.
        """
        total = sampleCount(self.seconds, CAPTURE_SAMPLE_RATE)
        wave = np.zeros(total, dtype=np.float64)
        begin = min(total, sampleCount(self.speechStart, CAPTURE_SAMPLE_RATE))
        end = min(total, begin + sampleCount(self.speechSeconds, CAPTURE_SAMPLE_RATE))
        t = np.arange(end - begin, dtype=np.float64) / CAPTURE_SAMPLE_RATE
        wave[begin:end] = self.loudness * np.sin(2.0 * math.pi * 180.0 * t)
        return wave

    def pcm(self) -> bytes:
        """
        The recording as 16 kHz mono PCM16 (a tone while the player spoke).
        """
        clipped = np.clip(self.samples(), -1.0, 1.0)
        return (clipped * 32767.0).astype("<i2").tobytes()


def peakAndRms(samples: np.ndarray) -> tuple[float, float]:
    """
    A recording's peak and RMS (core/audio.rs analyse_audio: 0 and 0 for
    no samples).
    """
    if not len(samples):
        return 0.0, 0.0
    return float(np.max(np.abs(samples))), float(np.sqrt(np.mean(np.square(samples))))


def recordedNothing(recording: Recording) -> bool:
    """
    The recorder delivered no audio at all: the browser's empty recording,
    which it refuses before it lets go of the capture (see
    L{MicrophoneCapture.leftOpen}).
    """
    return recording.seconds <= 0


def refusal(recording: Recording) -> str | None:
    """
    Why the browser refuses a finished recording, or C{None} if it hands
    it to the core (src/browser-voice-capture.ts
    C{BrowserVoiceCapture.finalize}), checked in the browser's order so a
    recording that fails twice gets the browser's first message:

      1. nothing recorded at all (the simulated recorder delivering no
         audio is the browser's empty recording);
      2. a length off the wall-clock time (capped at 30 s) by more than
         max(0.5 s, 20% of it): audio was lost or padded;
      3. peak under 0.01 and RMS under 0.003: nothing audible, such as a
         capture stopped before the player spoke.
    """
    if recordedNothing(recording):
        return NO_AUDIO_MESSAGE
    samples = recording.samples()
    wall = recording.wallSeconds if recording.wallSeconds is not None else recording.seconds
    wall = min(MAX_CAPTURE_SECONDS, wall)
    audio = len(samples) / CAPTURE_SAMPLE_RATE
    allowed = max(LENGTH_TOLERANCE_SECONDS, wall * LENGTH_TOLERANCE_SHARE)
    if abs(wall - audio) > allowed:
        return INCOMPLETE_RECORDING_MESSAGE
    if not len(samples):
        return NO_AUDIO_MESSAGE
    peak, rms = peakAndRms(samples)
    if peak < SILENCE_PEAK and rms < SILENCE_RMS:
        return INAUDIBLE_MESSAGE
    return None


def level(index: int, speaking: bool) -> tuple[float, float]:
    """
    A deterministic microphone level (peak, rms): speech-like while the
    player speaks, room noise otherwise.
    """
    if not speaking:
        return 0.004, 0.001
    peak = round(0.25 + 0.5 * abs(math.sin(1.3 * (index + 1))), 4)
    return peak, round(peak * 0.3, 4)


def _seconds(value: float) -> float:
    return round(value, 3)


class MicrophoneCapture:
    """
    One capture, in one or more listening windows.

    @param nextTake: gives the player's take for each new window.
    @param restartOnSilence: C{silenceBehavior} is C{"restart"}.
    """

    def __init__(
        self,
        requestId: str,
        clock: IReactorTime,
        events: CaptureEvents,
        nextTake: Callable[[], PlayerTake],
        restartOnSilence: bool,
        levelInterval: float = 0.1,
    ) -> None:
        self.requestId = requestId
        self._clock = clock
        self._events = events
        self._nextTake = nextTake
        self.restartOnSilence = restartOnSilence
        self._levelInterval = levelInterval if levelInterval > 0 else 0.1
        self._timers: list[IDelayedCall] = []
        self.take = PlayerTake()
        self._windowStart = 0.0
        self._now: float | None = None
        #: C{idle}, C{recording}, C{held} (at the 30 s limit), C{stopping},
        #: C{failed}, C{disposed} (the player turned the microphone off).
        self.state = "idle"
        self.windows = 0
        #: The capture failed in a way the browser does not clean up after:
        #: no speech within 8 s (silenceBehavior "error") or an empty
        #: recording.  RPEngine's browser keeps such a capture as its active
        #: one -- only a cancel of that very capture or the microphone being
        #: turned off ends it, and the core, which has forgotten it, asks
        #: for neither -- so every later capture fails to start
        #: (src/browser-voice-capture.ts receiveVad and finalize leave
        #: C{active} set; C{start} refuses while it is).
        self.leftOpen = False

    @property
    def recording(self) -> bool:
        return self.state in ("recording", "held")

    # Timeline of one window, relative to its start

    def _speechStart(self) -> float | None:
        """
        When the detector reports speech, or C{None} if it never does.
        """
        speech = self.take.speechSeconds
        if speech is None or speech < SPEECH_START_SECONDS:
            return None
        started = max(0.0, self.take.silenceSeconds) + SPEECH_START_SECONDS
        return started if started < NO_SPEECH_SECONDS else None

    def _speaking(self, at: float) -> bool:
        speech = self.take.speechSeconds or 0.0
        begin = max(0.0, self.take.silenceSeconds)
        return begin <= at < begin + speech

    def _heard(self, until: float) -> float:
        """
        Seconds of speech recorded by C{until} (window time).
        """
        speech = self.take.speechSeconds or 0.0
        begin = max(0.0, self.take.silenceSeconds)
        return max(0.0, min(until, begin + speech, MAX_CAPTURE_SECONDS) - begin)

    def _at(self, offset: float, f: Callable[..., None], *args: object) -> None:
        # Rounded, so events of the same moment keep the order they were
        # scheduled in.
        when = round(self._windowStart + offset, 6)
        self._timers = [t for t in self._timers if t.active()]
        delay = max(0.0, when - self._clock.seconds())
        self._timers.append(self._clock.callLater(delay, self._happen, when, f, *args))

    def _happen(self, when: float, f: Callable[..., None], *args: object) -> None:
        """
        Run a window event at its own time: what it causes (a stop on
        C{speech_ended}) happens then too, however late the clock is.
        """
        self._now = when
        try:
            f(*args)
        finally:
            self._now = None

    def _time(self) -> float:
        return self._clock.seconds() if self._now is None else self._now

    def _cancelTimers(self) -> None:
        for timer in self._timers:
            if timer.active():
                timer.cancel()
        self._timers = []

    # Life

    def start(self) -> None:
        """
        Start a listening window (app.rs C{CaptureStart}); the detector
        reports C{listening} in the next reactor step (worker.rs start).

        The whole window is scheduled now, on times from its start, so a
        L{Clock} advanced in one big step still delivers levels and states
        in the order they happen.
        """
        self._cancelTimers()
        self.take = self._nextTake()
        self.windows += 1
        self.state = "recording"
        self._windowStart = self._time()
        self._at(0.0, self._report, "listening", 0.0, True, None)
        events: list[tuple[float, Callable[..., None], tuple[object, ...]]] = []
        started = self._speechStart()
        if started is None:
            events.append((NO_SPEECH_SECONDS, self._noSpeech, ()))
        else:
            events.append((started, self._report, ("speech_started", started, True, None)))
            assert self.take.speechSeconds is not None
            quiet = (
                max(0.0, self.take.silenceSeconds) + self.take.speechSeconds + SILENCE_END_SECONDS
            )
            if quiet > MAX_CAPTURE_SECONDS:
                events.append((MAX_CAPTURE_SECONDS, self._limit, ()))
            elif self.take.speechSeconds + 1e-9 >= MINIMUM_SPEECH_SECONDS:
                events.append((quiet, self._report, ("speech_ended", quiet, True, None)))
            else:
                # Too short to count: the detector listens again (vad.rs),
                # and with no speech detected any more the 8 s rule applies.
                events.append((quiet, self._report, ("listening", quiet, True, None)))
                events.append((max(quiet, NO_SPEECH_SECONDS), self._noSpeech, ()))
        # Levels until the window's last event, each before a state of the
        # same moment.
        end = events[-1][0]
        index = 1
        while index * self._levelInterval <= end + 1e-9:
            self._at(index * self._levelInterval, self._level, index)
            index += 1
        for offset, f, args in events:
            self._at(offset, f, *args)

    def _report(self, state: str, seconds: float, autoEnd: bool, message: str | None) -> None:
        self._events.captureState(self, state, _seconds(seconds), autoEnd, message)

    def _level(self, index: int) -> None:
        if self.state != "recording":
            return
        at = index * self._levelInterval
        peak, rms = level(index, self._speaking(at - self._levelInterval / 2))
        self._events.captureLevel(self, _seconds(at), peak, rms)

    def _noSpeech(self) -> None:
        if self.state != "recording":
            return
        if not self.restartOnSilence:
            self.state = "failed"
            self.leftOpen = True
            self._cancelTimers()
            self._events.captureFailed(self, NO_SPEECH_MESSAGE)
            return
        # The browser discards the silent window and listens again
        # (browser-voice-capture.ts restartSilentCapture).
        self._events.captureState(self, "listening", 0.0, True, STILL_LISTENING_MESSAGE)
        self.start()

    def _limit(self) -> None:
        if self.state != "recording":
            return
        self._cancelTimers()
        self.state = "held"
        self._events.captureState(self, "listening", MAX_CAPTURE_SECONDS, False, LIMIT_MESSAGE)

    def stop(self) -> None:
        """
        Stop recording (app.rs C{CaptureStop}) and hand the recording over
        in the next reactor step: C{captureCompleted}, or C{captureFailed}
        with the browser's message for a recording it refuses (L{refusal}).

        The wall-clock time is taken now, as the browser takes it when the
        stop begins; the audio is as long unless the take says the
        recorder delivered something else (L{PlayerTake.recordedSeconds}).
        """
        if self.state == "disposed":
            # The browser has no capture any more: its stop is refused
            # (browser-voice-capture.ts stop), in the next step.
            self._timers.append(
                self._clock.callLater(0, self._events.captureFailed, self, NO_MATCHING_MESSAGE)
            )
            return
        if not self.recording:
            return
        elapsed = max(0.0, min(self._time() - self._windowStart, MAX_CAPTURE_SECONDS))
        delivered = self.take.recordedSeconds
        seconds = elapsed if delivered is None else max(0.0, delivered)
        heard = self._heard(min(elapsed, seconds))
        begin = max(0.0, min(elapsed, self.take.silenceSeconds))
        recording = Recording(seconds, begin, heard, self.take.loudness, elapsed)
        self._cancelTimers()
        self.state = "stopping"
        self._timers.append(self._clock.callLater(0, self._finalized, recording))

    def _finalized(self, recording: Recording) -> None:
        self.state = "idle"
        self.leftOpen = recordedNothing(recording)
        refused = refusal(recording)
        if refused is None:
            self._events.captureCompleted(self, recording, self.take)
            return
        _log.info(
            "Simulated browser refused capture {requestId}: {reason}",
            requestId=self.requestId,
            reason=refused,
            audioSeconds=recording.seconds,
            wallSeconds=recording.wallSeconds,
        )
        self._events.captureFailed(self, refused)

    def cancel(self) -> bool:
        """
        Throw the capture away (app.rs C{CaptureCancel}); nothing more is
        reported.

        @return: whether the recording was still being finished (stopped,
            not yet handed over).  The browser then rejects the unfinished
            stop with L{CANCELLED_MESSAGE}, which reaches the core as a
            C{captureFailed} of its own (browser-voice-capture.ts C{cancel};
            app-host.ts C{captureStop}); the engine sends it.
        """
        finishing = self.state == "stopping"
        self._cancelTimers()
        self.state = "idle"
        return finishing

    def dispose(self) -> bool:
        """
        The player turned the microphone off: the browser drops its
        recording without telling the core (src/app-host.ts
        C{microphoneDisable}, browser-voice-capture.ts C{dispose}), so a
        later stop of this capture is refused with L{NO_MATCHING_MESSAGE}.

        @return: whether the recording was still being finished, as for
            L{cancel}: dispose cancels it, and the unfinished stop fails.
        """
        finishing = self.state == "stopping"
        self._cancelTimers()
        self.state = "disposed"
        return finishing
