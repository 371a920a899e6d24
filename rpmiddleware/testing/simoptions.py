"""
What a simulated RPEngine is like: its options, the player at its
microphone, and its default reply.

Kept apart from the engine so a benchmark or demo can build options without
pulling in the protocol machinery, and so the default reply, which tests
reproduce to check a stream, has one obvious home.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rpmiddleware.protocol.messages import ENGINE_QUEUE_LIMIT
from rpmiddleware.testing.replystream import PCM_CHUNK_SAMPLES, Pacing

#: RPEngine's package version at the commit the simulator follows
#: (cfc6695): the host passes it to the core at start-up and the core says
#: it in C{hello.clientVersion} (src/app-version.ts C{APP_VERSION}, which
#: vite.config.ts fills from package.json; app.rs C{transport_opened}).
CLIENT_VERSION = "1.3.0"
#: RPEngine's fixed queue limit (app.rs QUEUE_LIMIT).
QUEUE_LIMIT = ENGINE_QUEUE_LIMIT


@dataclass(frozen=True)
class PlayerTake:
    """
    What the simulated player does in one listening window of a voice
    capture (a capture that restarts after silence has several windows).

    RPEngine's voice activity detection (FireRedVAD, policy in
    crates/rp-engine-core/src/worker.rs and vad.rs) reports C{speech_started}
    after 0.2 s of speech, C{speech_ended} after 0.1 s of silence once at
    least 0.25 s of speech was heard, and gives up with "no speech" when no
    speech started within 8 s; the simulated windows follow those numbers.
    """

    #: Seconds of silence before the player starts to speak.
    silenceSeconds: float = 0.3
    #: Seconds the player speaks; C{None} (or under 0.2) is never detected.
    speechSeconds: float | None = 1.0
    #: What speech recognition makes of it: C{None} for the default
    #: simulated transcript, C{""} for nothing recognised.
    transcript: str | None = None
    #: How loud the player's voice is in the recording (peak, full scale
    #: 1.0).  RPEngine's browser refuses a recording whose peak is under
    #: 0.01 and RMS under 0.003 as inaudible, whatever the detector heard.
    loudness: float = 0.2
    #: Seconds of audio the browser's recorder hands over when the window
    #: stops; C{None} for as long as the window took on the clock.  Set it
    #: to simulate a recorder that lost audio (RPEngine refuses a length
    #: off the wall-clock time by more than max(0.5 s, 20%)) or, with 0,
    #: one that recorded nothing.
    recordedSeconds: float | None = None


@dataclass
class SimulatorOptions:
    """
    How the simulated RPEngine behaves.  Mutable on purpose: a test may
    switch C{serviceStarted} or C{microphoneEnabled} mid-session.
    """

    #: Text pacing; C{None} streams as fast as the reactor allows.
    tokensPerSecond: float | None = None
    #: Synthesise each sentence in as long as it plays (instead of at once).
    audioRealtime: bool = False
    #: Requests (capturing, queued and active) one engine holds at most;
    #: RPEngine's is fixed at 20.
    queueLimit: int = QUEUE_LIMIT
    #: Replies generated at once; RPEngine runs one at a time (more is a
    #: simulator extension for load tests).
    concurrency: int = 1
    microphoneEnabled: bool = True
    #: RPEngine's service is started and its models are loaded; if not,
    #: requests are refused with C{service_not_started}.
    serviceStarted: bool = True
    #: The reply to a request (given its fields plus C{transcript} when it
    #: had speech); default L{defaultReplyText}.  If it raises, the request
    #: ends with C{request_failed}, as a failed generation would.
    replyText: Callable[[dict[str, Any]], str] | None = None
    #: Samples per C{reply.audio.chunk}: RPEngine's 32 KiB of PCM16.
    chunkSamples: int = PCM_CHUNK_SAMPLES
    #: Speech length per character of a sentence.
    secondsPerCharacter: float = 0.05
    #: What speech sounds like: C{"tones"}, one sine tone per sentence
    #: (its pitch names the segment); C{"words"}, one voiced burst per word
    #: with silence between, whose times each reply stream keeps
    #: (L{rpmiddleware.testing.simspeech}), to check speech marks against.
    speech: str = "tones"
    #: How long the simulated player speaks into the microphone when
    #: C{captureTakes} does not say (the default L{PlayerTake}'s length).
    captureSpeechSeconds: float = 1.0
    #: The player's takes, in order, one per listening window across every
    #: capture of this engine; when they run out, a default take of
    #: C{captureSpeechSeconds} is used.
    captureTakes: Sequence[PlayerTake] | None = None
    #: Seconds between C{voice.capture.level} reports (the browser's 0.1).
    captureLevelInterval: float = 0.1
    #: How long speech recognition takes, of a capture or of C{event.audio}.
    transcriptionSeconds: float = 0.0
    #: What recognition makes of every C{event.audio}: C{None} for a
    #: simulated transcript naming its length, C{""} for nothing recognised.
    audioTranscript: str | None = None
    #: The language chosen in RPEngine: what captures are transcribed in
    #: and the default of C{event.audio.language}.
    selectedLanguage: str = "en"
    #: Languages whose speech-recognition model is installed; a recording
    #: in another language fails with C{stt_model_not_installed}.
    installedSttLanguages: Sequence[str] = ("en",)
    origin: str = "https://rpengine.gemtavern.com"
    clientVersion: str = CLIENT_VERSION
    #: Drop the connection if no welcome arrives in time (RPEngine: five
    #: seconds); C{None} waits for ever.
    welcomeTimeout: float | None = 5.0
    #: Summaries as lossy as a small model's: the memory plugin's summary
    #: requests are answered with only the newest this many details
    #: (L{rpmiddleware.testing.simsummaries}); C{None} answers them like any
    #: request (C{replyText}).
    summaryDetails: int | None = None
    #: What a detail is, for C{summaryDetails}: a regular expression a
    #: sentence matches.
    detailPattern: str = r"(?i)\bremember this\b"

    def pacing(self) -> Pacing:
        return Pacing(
            tokensPerSecond=self.tokensPerSecond,
            audioRealtime=self.audioRealtime,
            chunkSamples=self.chunkSamples,
            secondsPerCharacter=self.secondsPerCharacter,
            speech=self.speech,
        )


def defaultReplyText(request: dict[str, Any]) -> str:
    """
    A deterministic reply of two or three sentences that quotes what the
    player said (or the transcript of what they spoke), so tests can check
    the reply belongs to the turn.
    """
    event = request.get("event")
    said = event.get("text") if isinstance(event, dict) else None
    if not isinstance(said, str) or not said.strip():
        said = request.get("transcript") or "something"
    heard = " ".join(str(said).split())
    if len(heard) > 80:
        heard = heard[:77] + "..."
    player = request.get("player")
    name = player.get("displayName") if isinstance(player, dict) else None
    sentences = [
        f'You said "{heard.rstrip(".!?")}", {name or "traveller"}.',
        "That is worth thinking about.",
    ]
    if heard.endswith("?"):
        sentences.append("Let me answer as best I can!")
    return " ".join(sentences)
