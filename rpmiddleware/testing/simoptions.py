"""
What a simulated RPEngine is like: its options and its default reply.

Kept apart from the engine so a benchmark or demo can build options without
pulling in the protocol machinery, and so the default reply, which tests
reproduce to check a stream, has one obvious home.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rpmiddleware.testing.replystream import Pacing

CLIENT_VERSION = "rpengine-simulator/3"


@dataclass
class SimulatorOptions:
    """
    How the simulated RPEngine behaves.  Mutable on purpose: a test may
    switch C{serviceStarted} or C{microphoneEnabled} mid-session.
    """

    #: Text pacing; C{None} streams as fast as the reactor allows.
    tokensPerSecond: float | None = None
    #: Pace audio chunks at playback speed instead of as fast as possible.
    audioRealtime: bool = False
    #: Requests (capturing, queued and active) one session holds at most.
    queueLimit: int = 4
    #: Replies generated at once; the rest wait in order.
    concurrency: int = 1
    microphoneEnabled: bool = True
    serviceStarted: bool = True
    #: The reply to a request (given its fields plus C{transcript} when it
    #: had speech); default L{defaultReplyText}.  If it raises, the request
    #: ends with C{request_failed}, as a failed generation would.
    replyText: Callable[[dict[str, Any]], str] | None = None
    #: Samples per C{reply.audio.chunk} (4410 is 100 ms at 44.1 kHz).
    chunkSamples: int = 4410
    #: Speech length per character of a sentence.
    secondsPerCharacter: float = 0.05
    #: How long simulated microphone speech lasts before the VAD ends it.
    captureSpeechSeconds: float = 1.0
    origin: str = "https://rpengine.gemtavern.com"
    clientVersion: str = CLIENT_VERSION
    #: Never acknowledge anything (to test the game side's retransmission).
    dropAcks: bool = False
    #: Drop the connection if no welcome arrives in time (the seed: five
    #: seconds); C{None} waits for ever.
    welcomeTimeout: float | None = 5.0

    def pacing(self) -> Pacing:
        return Pacing(
            tokensPerSecond=self.tokensPerSecond,
            audioRealtime=self.audioRealtime,
            chunkSamples=self.chunkSamples,
            secondsPerCharacter=self.secondsPerCharacter,
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
