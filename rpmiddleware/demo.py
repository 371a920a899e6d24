"""
C{twistd rpmiddleware --demo}: a simulated RPEngine connected in-process and
one scripted turn, so a newcomer sees replies flow without RPEngine.
"""

from __future__ import annotations

import base64
from typing import Any

from twisted.application import service
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from rpmiddleware.api import ReplyStream
from rpmiddleware.envelope import Envelope
from rpmiddleware.messages import OUTPUT_SAMPLE_RATE, textOfDelta
from rpmiddleware.middleware import Middleware
from rpmiddleware.testing.kit import exampleCard

DEMO_CHARACTER = "mira"
DEMO_LINE = "Good evening! Any news from the road?"


class DemoService(service.Service):
    """
    Connects the simulator to our own listener and plays one turn.

    @ivar turn: the L{ReplyStream} of the scripted turn once it started.
    @ivar ready: fires with that stream's terminal envelope.
    """

    log = Logger()
    #: How the simulated RPEngine paces the reply: like a real one, so that a
    #: person watching the log sees it stream (tests make it faster).
    pacing: dict[str, Any] = {"tokensPerSecond": 25.0, "audioRealtime": True}
    port: int = 0

    def __init__(self, reactor: Any, middleware: Middleware, parent: service.MultiService) -> None:
        self.reactor = reactor
        self.middleware = middleware
        self.parentService = parent
        self.engine: Any = None
        self.turn: ReplyStream | None = None
        self.ready: Deferred[Envelope] = Deferred()
        self._sentence = ""
        self._segment: Any = None
        self._audioSeconds = 0.0
        self.setName("demo")

    def startService(self) -> None:
        super().startService()
        from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator

        listener: Any = self.parentService.getServiceNamed("listener")
        port = self.port = listener.port.getHost().port
        self.middleware.registerCharacter(DEMO_CHARACTER, exampleCard())
        options = SimulatorOptions(**self.pacing)
        self.log.info("demo: connecting a simulated RPEngine to port {port}", port=port)
        d = connectSimulator(self.reactor, port, options)
        d.addCallback(self._connected)
        d.addErrback(self._failed)

    def _connected(self, engine: Any) -> None:
        self.engine = engine
        self.log.info(
            "demo: simulated RPEngine connected (session {sessionId}); the player says: {line!r}",
            sessionId=engine.sessionId,
            line=DEMO_LINE,
        )
        turn = self.turn = self.middleware.requestReply(DEMO_CHARACTER, text=DEMO_LINE)
        turn.subscribe(self._show)
        turn.done.addBoth(self._finished)

    def _show(self, envelope: Envelope) -> None:
        """
        Log the reply as it streams: each finished sentence of text, each
        audio segment as it starts, and the protocol's milestones.
        """
        kind = envelope.type
        if kind == "reply.text.delta":
            self._sentence += textOfDelta(envelope.fields)
            if self._sentence.rstrip().endswith((".", "!", "?")):
                self.log.info("demo: Mira says {text!r}", text=self._sentence.strip())
                self._sentence = ""
        elif kind == "reply.audio.chunk":
            segment = envelope.get("segmentSequence")
            self._audioSeconds += (
                len(base64.b64decode(envelope.get("data", "")))
                / 2
                / float(envelope.get("sampleRate") or OUTPUT_SAMPLE_RATE)
            )
            if segment != self._segment:
                self._segment = segment
                self.log.info("demo: speech for sentence {segment} begins", segment=segment)
        elif kind == "reply.audio.completed":
            self.log.info("demo: speech complete, {seconds:.1f} s", seconds=self._audioSeconds)
        else:
            self.log.info("demo: {type}", type=kind)

    def _finished(self, result: Any) -> Any:
        if isinstance(result, Envelope):
            assert self.turn is not None
            self.log.info(
                "demo: the turn is complete. Mira said: {text!r}. rpmiddleware keeps serving "
                "clients at ws://127.0.0.1:{port}/client/socket",
                text=self.turn.text(),
                port=self.port,
            )
            self.ready.callback(result)
        else:
            self.log.failure("demo: the scripted turn failed", result)
            self.ready.errback(result)
        return None

    def _failed(self, failure: Any) -> None:
        self.log.failure("demo: could not connect the simulated RPEngine", failure)
        if not self.ready.called:
            self.ready.errback(failure)

    def stopService(self) -> Any:
        super().stopService()
        if self.engine is not None:
            self.engine.disconnect()
        return None
