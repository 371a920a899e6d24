"""
Server-side voice activity detection over the player's microphone.

The microphone track arrives as mono 16 kHz PCM16 (L{rpmiddleware.webrtc.
microphone}).  L{VoiceActivityDetector} cuts it into utterances:

  - every 20 ms frame is classified speech or not by a L{FrameClassifier}
    (by default the WebRTC project's GMM detector from C{webrtcvad-wheels}:
    a 200 kB wheel with nothing to download, deterministic, and cheap enough
    to run for every connected player);
  - speech starts after C{start_ms} of consecutive speech frames
    (C{SpeechStarted}; a cough shorter than that is ignored);
  - speech ends after C{hangover_ms} without speech (C{SpeechEnded}), so
    the pauses between words do not cut a sentence in two;
  - the utterance is the audio from C{pre_roll_ms} before the first speech
    frame to C{trail_ms} after the last one, at most C{max_seconds} (30 s,
    RPEngine's limit): an utterance that reaches it ends there, and speech
    that goes on starts a new one.

Positions are in samples of the 16 kHz stream since the detector started,
so a test can check boundaries exactly and a log can say where.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from rpmiddleware.config.settings import VadSettings

SAMPLE_RATE = 16000
BYTES_PER_SAMPLE = 2


class FrameClassifier(Protocol):
    def isSpeech(self, frame: bytes, sampleRate: int) -> bool:
        """
        Whether one frame of mono PCM16 holds speech.
        """


class WebRtcClassifier:
    """
    The WebRTC project's detector (C{webrtcvad}); C{aggressiveness} 0 (lets
    most through) to 3 (most eager to call a frame not speech).
    """

    def __init__(self, aggressiveness: int = 2) -> None:
        import webrtcvad

        self._vad = webrtcvad.Vad(aggressiveness)

    def isSpeech(self, frame: bytes, sampleRate: int) -> bool:
        return bool(self._vad.is_speech(frame, sampleRate))


@dataclass(frozen=True)
class SpeechStarted:
    #: Where the first speech frame begins.
    sample: int


@dataclass(frozen=True)
class SpeechEnded:
    #: Where the utterance ends (after the trailing C{trail_ms}).
    sample: int
    #: Where the utterance begins (the pre-roll before the first speech frame).
    startSample: int
    #: The utterance: mono PCM16 at 16 kHz.
    pcm: bytes
    #: C{True} when it ended because it reached C{max_seconds}.
    truncated: bool = False

    @property
    def seconds(self) -> float:
        return len(self.pcm) / (BYTES_PER_SAMPLE * SAMPLE_RATE)


VadEvent = SpeechStarted | SpeechEnded


class VoiceActivityDetector:
    """
    Feed it PCM in pieces of any size; it returns the events each piece
    completes.
    """

    def __init__(
        self, settings: VadSettings | None = None, classifier: FrameClassifier | None = None
    ) -> None:
        self.settings = settings or VadSettings()
        self.settings.check()
        self.classifier = classifier or WebRtcClassifier(self.settings.aggressiveness)
        s = self.settings
        self.frameSamples = SAMPLE_RATE * s.frame_ms // 1000
        self._frameBytes = self.frameSamples * BYTES_PER_SAMPLE
        self._startFrames = max(1, s.frames(s.start_ms))
        self._hangoverFrames = max(1, s.frames(s.hangover_ms))
        self._trailFrames = s.frames(s.trail_ms)
        self._maxFrames = int(s.max_seconds * 1000) // s.frame_ms
        # Frames kept while silent: the pre-roll plus a run that may turn out to be speech.
        self._idleKeep = s.frames(s.pre_roll_ms) + self._startFrames
        self._pending = b""
        #: Frames of the stream seen so far.
        self.frameIndex = 0
        self.speaking = False
        self._recent: deque[bytes] = deque(maxlen=self._idleKeep)
        self._run = 0  # consecutive speech frames while silent
        self._utterance: list[bytes] = []
        self._utteranceStart = 0  # frame index
        self._silence = 0  # consecutive non-speech frames while speaking

    def feed(self, pcm: bytes) -> list[VadEvent]:
        """
        Classify the whole frames C{pcm} completes; a remainder waits for
        the next piece.
        """
        data = self._pending + pcm
        whole = len(data) - len(data) % self._frameBytes
        self._pending = data[whole:]
        events: list[VadEvent] = []
        for offset in range(0, whole, self._frameBytes):
            frame = data[offset : offset + self._frameBytes]
            voiced = self.classifier.isSpeech(frame, SAMPLE_RATE)
            events.extend(self._frame(frame, voiced))
            self.frameIndex += 1
        return events

    def flush(self) -> list[VadEvent]:
        """
        The stream ended (the track stopped): end speech in progress now.
        """
        self._pending = b""
        if not self.speaking:
            return []
        return [self._end(self.frameIndex - self._silence + self._trailFrames, False)]

    def reset(self) -> None:
        """
        Forget any speech in progress without an event (the peer went away).
        """
        self.speaking = False
        self._utterance = []
        self._recent.clear()
        self._run = 0
        self._silence = 0

    def _frame(self, frame: bytes, voiced: bool) -> list[VadEvent]:
        if not self.speaking:
            self._recent.append(frame)
            self._run = self._run + 1 if voiced else 0
            if self._run < self._startFrames:
                return []
            # Speech: it began _run frames ago; keep the pre-roll before it.
            first = self.frameIndex - self._run + 1
            kept = list(self._recent)
            self._utteranceStart = self.frameIndex - len(kept) + 1
            self._utterance = kept
            self.speaking = True
            self._silence = 0
            self._run = 0
            self._recent.clear()
            return [SpeechStarted(first * self.frameSamples)]
        self._utterance.append(frame)
        self._silence = 0 if voiced else self._silence + 1
        if self._silence >= self._hangoverFrames:
            lastVoiced = self.frameIndex - self._silence + 1
            return [self._end(lastVoiced + self._trailFrames, False)]
        if len(self._utterance) >= self._maxFrames:
            return [self._end(self.frameIndex + 1, True)]
        return []

    def _end(self, endFrame: int, truncated: bool) -> SpeechEnded:
        """
        End the utterance at C{endFrame} (exclusive); frames after it go
        back to the silent state's history, where they may begin the next.
        """
        keep = max(0, min(len(self._utterance), endFrame - self._utteranceStart))
        spoken, rest = self._utterance[:keep], self._utterance[keep:]
        start = self._utteranceStart
        self.speaking = False
        self._utterance = []
        self._silence = 0
        self._run = 0
        self._recent.clear()
        self._recent.extend(rest)
        return SpeechEnded(
            sample=(start + keep) * self.frameSamples,
            startSample=start * self.frameSamples,
            pcm=b"".join(spoken),
            truncated=truncated,
        )
