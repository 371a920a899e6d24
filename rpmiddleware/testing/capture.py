"""
A simulated browser microphone for C{voice.capture.start}.

In RPEngine the player speaks into the browser and a VAD (FireRedVAD) ends
the utterance by itself; the game may end it early with C{voice.capture.stop}
or throw it away with C{voice.capture.cancel}.  Here the "speech" is a fixed
length of simulated time with a few level readings, which is all a game or a
middleware plugin can observe of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from rpmiddleware.testing.replystream import Emit

#: How many C{voice.capture.level} messages one utterance produces.
LEVEL_READINGS = 4


def levelReading(index: int) -> float:
    """
    A deterministic, speech-like microphone level in 0..1.
    """
    return round(0.25 + 0.5 * abs(math.sin(1.3 * (index + 1))), 3)


class MicrophoneCapture:
    """
    One capture: C{listening}, then C{speaking} with level readings, then
    C{processing} when the simulated VAD (or L{stop}) ends the speech.

    @param onSpeech: called with the seconds of speech heard, once the state
        is C{processing}; not called after L{cancel}.
    """

    def __init__(
        self,
        requestId: str,
        emit: Emit,
        clock: IReactorTime,
        speechSeconds: float,
        onSpeech: Callable[[float], None],
    ) -> None:
        self.requestId = requestId
        self._emit = emit
        self._clock = clock
        self._speechSeconds = max(0.0, speechSeconds)
        self._onSpeech = onSpeech
        self._timers: list[IDelayedCall] = []
        self._speakingSince: float | None = None
        self.state = "idle"

    @property
    def capturing(self) -> bool:
        return self.state in ("listening", "speaking")

    def _later(self, delay: float, f: Callable[..., object], *args: object) -> None:
        self._timers = [t for t in self._timers if t.active()]
        self._timers.append(self._clock.callLater(delay, f, *args))

    def _setState(self, state: str) -> None:
        self.state = state
        self._emit("voice.capture.state", requestId=self.requestId, state=state)

    def start(self) -> None:
        self._setState("listening")
        self._later(0, self._speak)

    def _speak(self) -> None:
        self._speakingSince = self._clock.seconds()
        self._setState("speaking")
        for i in range(LEVEL_READINGS):
            self._later(self._speechSeconds * i / LEVEL_READINGS, self._level, i)
        self._later(self._speechSeconds, self._end)

    def _level(self, index: int) -> None:
        self._emit("voice.capture.level", requestId=self.requestId, level=levelReading(index))

    def _cancelTimers(self) -> None:
        for timer in self._timers:
            if timer.active():
                timer.cancel()
        self._timers = []

    def _end(self) -> None:
        self._cancelTimers()
        since = self._speakingSince
        heard = 0.0 if since is None else self._clock.seconds() - since
        self._setState("processing")
        self._onSpeech(heard)

    def stop(self) -> bool:
        """
        End the speech now (C{voice.capture.stop}); C{False} if it already
        ended.
        """
        if not self.capturing:
            return False
        self._end()
        return True

    def cancel(self, announce: bool = True) -> None:
        """
        Discard the capture; the microphone goes back to C{idle}.
        """
        self._cancelTimers()
        if announce and self.state != "idle":
            self._setState("idle")
        self.state = "idle"
