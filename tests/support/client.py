"""
Shared helpers for the client endpoint tests (no tests here): recordings made
with numpy, C{wave} and PyAV, and a rig of middleware, simulated RPEngine
and clients, in memory on a clock (L{MemoryClientCase}) or over real
loopback sockets (L{LiveClientCase}).
"""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Callable
from typing import Any

import numpy as np
from twisted.internet import reactor
from twisted.internet.defer import Deferred, fail, inlineCallbacks
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.client import Agent
from zope.interface import implementer

from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.client.capacity import CapacityMonitor
from rpmiddleware.client.endpoint import ClientEndpoint
from rpmiddleware.client.sessions import SessionStore
from rpmiddleware.client.settings import ClientSettings
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.clienterrors import AudioDecodeError
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import TestClient, connectClient, startMiddleware
from rpmiddleware.testing.memorynet import MemoryNetwork
from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator

#: Messages after which a turn has nothing more to say.
TURN_ENDS = ("reply-complete", "tts-cancelled")


def tone(rate: int, seconds: float, channels: int = 1, frequency: float = 440.0) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    mono = 0.3 * np.sin(2 * np.pi * frequency * t)
    if channels == 1:
        return mono
    return np.stack([mono * (1.0 - 0.2 * c) for c in range(channels)], axis=1)


def wavBytes(rate: int, seconds: float = 1.0, channels: int = 1, width: int = 2) -> bytes:
    samples = tone(rate, seconds, channels)
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        scale = float(2 ** (8 * width - 1) - 1)
        if width == 2:
            writer.writeframes((samples * scale).astype("<i2").tobytes())
        elif width == 4:
            writer.writeframes((samples * scale).astype("<i4").tobytes())
        else:
            raise ValueError(width)
    return out.getvalue()


def wavBase64(rate: int, seconds: float = 1.0, channels: int = 1, width: int = 2) -> str:
    return base64.b64encode(wavBytes(rate, seconds, channels, width)).decode("ascii")


def opusBytes(container: str, seconds: float = 1.0, channels: int = 1) -> bytes:
    """
    A tone encoded with libopus in WebM or Ogg, made here so no fixture files
    are needed.  Skips the test when this PyAV has no Opus encoder.
    """
    import av

    try:
        av.codec.Codec("libopus", "w")
    except Exception:
        raise SkipTest("this PyAV build has no libopus encoder, so no Opus fixture can be made")
    rate = 48000
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as sink:
        stream: Any = sink.add_stream("libopus", rate=rate)
        layout = "mono" if channels == 1 else "stereo"
        stream.layout = layout
        samples = tone(rate, seconds, channels).astype(np.float32)
        planar = samples[None, :] if channels == 1 else samples.T
        size = stream.codec_context.frame_size or 960
        for start in range(0, planar.shape[1], size):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(planar[:, start : start + size]), format="fltp", layout=layout
            )
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                sink.mux(packet)
        for packet in stream.encode(None):
            sink.mux(packet)
    return out.getvalue()


def opusBase64(container: str, seconds: float = 1.0, channels: int = 1) -> str:
    return base64.b64encode(opusBytes(container, seconds, channels)).decode("ascii")


def buildChain(services: PluginServices) -> list[Any]:
    """
    The plugins a client turn relies on, built from their factories so the
    tests do not depend on the configured defaults: capacity gate nearest the
    game, then audio resampling, then the card cache nearest RPEngine.
    """
    from rpmiddleware.builtin.audio_resample import audioResample
    from rpmiddleware.builtin.capacity_gate import capacityGate
    from rpmiddleware.builtin.card_cache import cardCache

    return [
        capacityGate.buildPlugin({"assume_after": 0.5}, services),
        audioResample.buildPlugin({}, services),
        cardCache.buildPlugin({}, services),
    ]


def clockedEndpoint(middleware: Middleware, settings: Settings, clock: Clock) -> ClientEndpoint:
    """
    A client endpoint on a L{Clock} whose audio never decodes: for tests
    that drive connections by hand, without sockets.
    """
    return ClientEndpoint(
        middleware=middleware,
        settings=settings.client,
        sessions=SessionStore(clock, settings.client),
        capacity=CapacityMonitor(middleware),
        clock=clock,
        decode=lambda data: fail(AudioDecodeError("INVALID_AUDIO_FORMAT", "no")),
    )


def whenLogged(case: TestCase, predicate: Callable[[dict[str, Any]], bool]) -> Deferred[Any]:
    """
    Fires with the first log event that satisfies C{predicate}.
    """
    d: Deferred[Any] = Deferred()

    @implementer(ILogObserver)
    def observer(event: dict[str, Any]) -> None:
        if not d.called and predicate(event):
            d.callback(event)

    globalLogPublisher.addObserver(observer)
    case.addCleanup(globalLogPublisher.removeObserver, observer)
    return d


class ClientUnderTest(TestClient):
    """
    A test client that remembers the C{ready} and first C{capacity} it got.
    """

    ready: dict[str, Any]
    capacity: dict[str, Any]


class LiveClientCase(TestCase):
    """
    A middleware with the client endpoint on a real loopback port, the
    plugin chain, and helpers to connect RPEngine and clients.

    Its tests are written with L{runOnNetwork}, so that
    L{MemoryClientCase} runs the same tests in memory.
    """

    timeout = 30

    def makeReactor(self) -> Any:
        """
        The reactor everything listens, connects and schedules on.
        """
        return reactor

    def runDeferred(self, d: Deferred[Any]) -> Deferred[Any]:
        """
        C{d}, for trial to wait on (the real reactor runs it).
        """
        return d

    def agent(self) -> Any:
        """
        An HTTP agent (for C{treq}'s C{agent=}) on this case's network.
        """
        return Agent(self.reactor)

    def setUp(self) -> None:
        self.reactor = self.makeReactor()
        self.settings = Settings()
        self.clientSettings = ClientSettings()
        self.configure(self.settings, self.clientSettings)
        self.settings.client = self.clientSettings
        threads: Any = self.reactor
        services = PluginServices(self.reactor, self.settings, CardHasher(threads), Timeline())
        middleware = Middleware(self.reactor, self.settings, buildChain(services), services)
        self.middleware = middleware
        self.startLive()
        self.engines: list[Any] = []

    def startLive(self) -> None:
        """
        Start C{self.middleware}'s listener (stopped at cleanup).
        """
        self.live = startMiddleware(self.reactor, self.settings, middleware=self.middleware)
        self.addCleanup(lambda: self.runDeferred(self.live.stop()))

    def configure(self, settings: Settings, client: ClientSettings) -> None:
        """
        Change the settings before the middleware starts.
        """

    @property
    def factory(self) -> Any:
        return self.live.listener.factories[b"/client/socket"]

    @inlineCallbacks
    def engine(self, **options: Any) -> Any:
        options.setdefault("tokensPerSecond", None)
        options.setdefault("audioRealtime", False)
        options.setdefault("captureSpeechSeconds", 0.0)
        engine = yield connectSimulator(self.reactor, self.live.port, SimulatorOptions(**options))
        self.engines.append(engine)
        self.addCleanup(lambda: self.runDeferred(self._closeEngine(engine)))
        return engine

    @inlineCallbacks
    def _closeEngine(self, engine: Any) -> Any:
        if not engine.closed.called:
            engine.disconnect()
        yield engine.closed

    @inlineCallbacks
    def client(self, origin: str | None = None, character: bool = True, ready: bool = True) -> Any:
        """
        A connected client, past C{ready} and the first C{capacity}, which
        has sent the example character (unless told not to).
        """
        client = ClientUnderTest(
            connectClient(self.reactor, self.live.url("/client/socket"), origin=origin).factory
        )
        self.addCleanup(lambda: self.runDeferred(self._closeClient(client)))
        yield client.opened
        if ready:
            client.ready = yield client.next()
            self.assertEqual(client.ready["type"], "ready")
            client.capacity = yield client.next()
            self.assertEqual(client.capacity["type"], "capacity")
        if character:
            client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
        return client

    @inlineCallbacks
    def _closeClient(self, client: TestClient) -> Any:
        if client.factory.peer is not None and not client.closed.called:
            client.drop()
        yield client.closed

    @inlineCallbacks
    def turn(self, client: TestClient, *ends: str) -> Any:
        """
        Every message up to and including the end of a turn (reply-complete,
        tts-cancelled, or one of C{ends}), skipping capacity updates.
        """
        ends = ends or TURN_ENDS
        seen: list[dict[str, Any]] = []
        while True:
            message = yield client.next()
            if message.get("type") == "capacity":
                continue
            seen.append(message)
            if message.get("type") in ends:
                return seen


class MemoryClientCase(LiveClientCase):
    """
    L{LiveClientCase} on a L{MemoryNetwork}: the same site, WebSocket
    framing, Autobahn peers and simulated RPEngine, with no socket and
    simulated time, so its tests are deterministic.
    """

    def makeReactor(self) -> Any:
        self.network = MemoryNetwork()
        return self.network.reactor

    def agent(self) -> Any:
        return self.network.agent()

    def runDeferred(self, d: Deferred[Any]) -> Deferred[Any]:
        """
        Run the network until C{d} has its result.
        """
        return self.network.run(d)


class OnRealSockets:
    """
    Put first in a L{MemoryClientCase}'s bases, runs its tests on real
    loopback sockets and the real reactor instead: for what is about the
    sockets themselves (kernel buffers, a peer that stops reading) or a
    service that works on the real reactor only.
    """

    def makeReactor(self) -> Any:
        return reactor

    def agent(self) -> Any:
        return Agent(reactor)

    def runDeferred(self, d: Deferred[Any]) -> Deferred[Any]:
        return d


def types(messages: list[dict[str, Any]]) -> list[str]:
    return [m["type"] for m in messages]


def pcmSamples(messages: list[dict[str, Any]]) -> int:
    """
    Samples in every tts-chunk of C{messages} (PCM16 mono).
    """
    return sum(len(base64.b64decode(m["data"])) // 2 for m in messages if m["type"] == "tts-chunk")


def whenRouted(
    middleware: Middleware,
    kind: str,
    requestId: str | None = None,
    where: Callable[[Any], bool] | None = None,
) -> Deferred[Any]:
    """
    Fires with the next envelope of type C{kind} (for C{requestId}, if
    given, and for which C{where} holds, if given) that reaches the game
    end of the chain: proof that RPEngine answered something, without
    timing anything.
    """
    d: Deferred[Any] = Deferred()

    def observer(envelope: Any) -> None:
        if d.called or envelope.type != kind:
            return
        if (requestId is None or envelope.requestId == requestId) and (
            where is None or where(envelope)
        ):
            stop()
            d.callback(envelope)

    stop = middleware.router.observe(observer)
    return d


def sendCapacityAndWait(middleware: Middleware, client: Any, sessionId: str) -> Deferred[Any]:
    """
    Send, as RPEngine, a valid capacity.update after what the test sent:
    it reaches the game once everything before it on the connection was
    read (frames are read in order), so nothing is polled.
    """
    d = whenRouted(middleware, "capacity.update")
    client.send(
        Envelope.build(
            "capacity.update", sessionId, acceptingRequests=True, queueDepth=0, queueLimit=2
        ).fields
    )
    return d


def requestsOf(engine: Any, kind: str = "reply.request") -> list[dict[str, Any]]:
    """
    The requests of C{kind} a simulated RPEngine received.
    """
    return [m for m in engine.receivedMessages if isinstance(m, dict) and m.get("type") == kind]


@inlineCallbacks
def nextMatching(client: TestClient, predicate: Callable[[dict[str, Any]], bool]) -> Any:
    """
    The next message that satisfies C{predicate}, skipping others.
    """
    while True:
        message = yield client.next()
        if isinstance(message, dict) and predicate(message):
            return message
