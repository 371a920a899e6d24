"""
The Prometheus metrics of a middleware, driven without sockets and with a
Clock; and C{/metrics} as a twisted.web resource.
"""

from __future__ import annotations

import base64
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.console.metrics import MetricsResource, MiddlewareMetrics, transferBytes
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.engine.session import EngineSession
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import exampleCard
from tests.support.engine import FakeWriter


class FakeTimer:
    """
    A clock for the timeline, moved by hand.
    """

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """
    A middleware with the audio-resample, capacity-gate and card-cache
    plugins on a Clock, its metrics, and an RPEngine session by hand.
    """

    def __init__(self, endpoints: dict[bytes, Any] | None = None) -> None:
        from rpmiddleware.builtin.audio_resample import audioResample
        from rpmiddleware.builtin.capacity_gate import capacityGate
        from rpmiddleware.builtin.card_cache import cardCache

        self.clock = Clock()
        self.timer = FakeTimer()
        settings = Settings()
        services = PluginServices(self.clock, settings, CardHasher(None), Timeline(now=self.timer))
        plugins = [
            audioResample.buildPlugin({}, services),
            capacityGate.buildPlugin({"assume_after": 0.5}, services),
            cardCache.buildPlugin({}, services),
        ]
        self.middleware = Middleware(self.clock, settings, plugins, services)
        self.middleware.registerCharacter("mira", exampleCard())
        self.metrics = MiddlewareMetrics(self.middleware, endpoints)
        self.writer = FakeWriter()
        self.engine: EngineSession | None = None

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def number(self, name: str, **labels: str) -> float:
        """
        A sample that must exist.
        """
        value = self.value(name, **labels)
        assert value is not None, (name, labels)
        return value

    def connect(self) -> EngineSession:
        session = self.middleware.newEngineSession(self.writer, "peer")
        session.received(Envelope.build("hello").fields)
        self.engine = session
        self.says("capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=4)
        return session

    def says(self, type: str, **fields: Any) -> None:
        assert self.engine is not None
        self.engine.received(Envelope.build(type, self.engine.sessionId, **fields).fields)

    def ask(self, **meta: Any) -> str:
        stream = self.middleware.requestReply("mira", text="Hello?", meta=meta)
        stream.done.addErrback(lambda f: None)
        return stream.requestId


def pcm(samples: int) -> str:
    return base64.b64encode(b"\x00\x10" * samples).decode("ascii")


class EnvelopeTests(SynchronousTestCase):
    def test_byDirectionTypeAndOutcome(self) -> None:
        rig = Rig()
        rig.connect()
        requestId = rig.ask()
        rig.says("reply.accepted", requestId=requestId)
        rig.says("reply.text.delta", requestId=requestId, sequence=0, delta="Hi")
        rig.says("reply.text.delta", requestId=requestId, sequence=1, delta=" there")
        self.assertEqual(
            rig.value(
                "rpmiddleware_envelopes_total",
                direction="to_engine",
                type="reply.request",
                outcome="delivered",
            ),
            1.0,
        )
        self.assertEqual(
            rig.value(
                "rpmiddleware_envelopes_total",
                direction="to_game",
                type="reply.text.delta",
                outcome="delivered",
            ),
            2.0,
        )
        self.assertEqual(
            rig.value(
                "rpmiddleware_envelopes_total",
                direction="to_game",
                type="capacity.update",
                outcome="delivered",
            ),
            1.0,
        )

    def test_dropped(self) -> None:
        """
        A request the capacity gate holds is counted as dropped there (it
        is sent again later, and then counted as delivered).
        """
        rig = Rig()
        rig.ask()
        self.assertEqual(
            rig.value(
                "rpmiddleware_envelopes_total",
                direction="to_engine",
                type="reply.request",
                outcome="dropped",
            ),
            1.0,
        )


class LatencyTests(SynchronousTestCase):
    def test_firstTextAndAudio(self) -> None:
        """
        Seconds from asking to the first text and the first audio of each
        request, each observed once.
        """
        rig = Rig()
        rig.connect()
        requestId = rig.ask()
        rig.timer.now += 0.3
        rig.says("reply.accepted", requestId=requestId)
        rig.timer.now += 0.2
        rig.says("reply.text.delta", requestId=requestId, sequence=0, delta="Hi")
        rig.timer.now += 1.0
        rig.says("reply.text.delta", requestId=requestId, sequence=1, delta=" you")
        rig.says("reply.audio.start", requestId=requestId, sampleRate=44100)
        rig.says(
            "reply.audio.chunk", requestId=requestId, sequence=0, segmentSequence=0, data=pcm(441)
        )
        rig.timer.now += 1.0
        rig.says(
            "reply.audio.chunk", requestId=requestId, sequence=1, segmentSequence=0, data=pcm(441)
        )
        self.assertEqual(rig.value("rpmiddleware_time_to_first_text_seconds_count"), 1.0)
        self.assertAlmostEqual(rig.value("rpmiddleware_time_to_first_text_seconds_sum"), 0.5)
        self.assertEqual(rig.value("rpmiddleware_time_to_first_text_seconds_bucket", le="0.5"), 1.0)
        self.assertEqual(
            rig.value("rpmiddleware_time_to_first_text_seconds_bucket", le="0.25"), 0.0
        )
        self.assertEqual(rig.value("rpmiddleware_time_to_first_audio_seconds_count"), 1.0)
        self.assertAlmostEqual(rig.value("rpmiddleware_time_to_first_audio_seconds_sum"), 1.5)


class ErrorTests(SynchronousTestCase):
    def test_byCode(self) -> None:
        rig = Rig()
        rig.connect()
        for code in ("request_failed", "request_failed", "service_not_started"):
            requestId = rig.ask()
            rig.says("request.error", requestId=requestId, code=code, message="no")
        self.assertEqual(rig.value("rpmiddleware_request_errors_total", code="request_failed"), 2.0)
        self.assertEqual(
            rig.value("rpmiddleware_request_errors_total", code="service_not_started"), 1.0
        )

    def test_oddCodesAreOther(self) -> None:
        """
        Error codes come from RPEngine: a strange one, or too many distinct
        ones, do not make new series without bound.
        """
        rig = Rig()
        rig.connect()
        for n in range(70):
            rig.says("request.error", requestId=f"x{n}", code=f"code_{n}")
        rig.says("request.error", requestId="y", code="spaces are odd")
        total = sum(
            s.value
            for m in rig.metrics.registry.collect()
            if m.name == "rpmiddleware_request_errors"
            for s in m.samples
            if s.name.endswith("_total")
        )
        self.assertEqual(total, 71.0)
        self.assertEqual(rig.value("rpmiddleware_request_errors_total", code="other"), 7.0)


class CardTests(SynchronousTestCase):
    def test_bytesByMode(self) -> None:
        """
        The first request sends the card as a snapshot, the next one by
        reference; each transfer's bytes are counted under its mode.
        """
        rig = Rig()
        rig.connect()
        first = rig.ask()
        sent = [m for m in rig.writer.sent if m.get("requestId") == first][0]
        snapshot = sent["card"]
        rig.says("ack", sourceMessageId=sent["messageId"])
        rig.says("reply.accepted", requestId=first)
        rig.says("reply.completed", requestId=first)
        second = rig.ask()
        reference = [m for m in rig.writer.sent if m.get("requestId") == second][0]["card"]
        self.assertEqual((snapshot["mode"], reference["mode"]), ("snapshot", "reference"))
        self.assertEqual(rig.value("rpmiddleware_card_transfers_total", mode="snapshot"), 1.0)
        self.assertEqual(rig.value("rpmiddleware_card_transfers_total", mode="reference"), 1.0)
        self.assertEqual(
            rig.value("rpmiddleware_card_transfer_bytes_total", mode="snapshot"),
            float(transferBytes(snapshot)),
        )
        self.assertEqual(
            rig.value("rpmiddleware_card_transfer_bytes_total", mode="reference"),
            float(transferBytes(reference)),
        )


class ResampleTests(SynchronousTestCase):
    def test_outputConversion(self) -> None:
        """
        Each conversion's time, read on the reactor's clock, is observed:
        here each chunk's decoding takes 10 ms of the Clock.
        """
        from rpmiddleware.audio import pcm as pcmlib

        rig = Rig()
        rig.connect()
        decode = pcmlib.decodePcm

        def slowDecode(*args: Any) -> Any:
            rig.clock.advance(0.01)
            return decode(*args)

        self.patch(pcmlib, "decodePcm", slowDecode)
        requestId = rig.ask(outputSampleRate=16000)
        rig.says("reply.audio.start", requestId=requestId, sampleRate=44100)
        for n in range(3):
            rig.says(
                "reply.audio.chunk",
                requestId=requestId,
                sequence=n,
                segmentSequence=0,
                data=pcm(4410),
            )
        self.assertEqual(rig.value("rpmiddleware_resample_seconds_count", direction="to_game"), 3.0)
        self.assertAlmostEqual(
            rig.number("rpmiddleware_resample_seconds_sum", direction="to_game"), 0.03
        )

    def test_stop(self) -> None:
        """
        Stopped metrics watch nothing more (and keep what they counted).
        """
        rig = Rig()
        rig.connect()
        rig.metrics.stop()
        requestId = rig.ask(outputSampleRate=16000)
        rig.says("reply.audio.start", requestId=requestId, sampleRate=44100)
        rig.says(
            "reply.audio.chunk", requestId=requestId, sequence=0, segmentSequence=0, data=pcm(441)
        )
        self.assertIsNone(rig.value("rpmiddleware_resample_seconds_count", direction="to_game"))
        self.assertIsNone(
            rig.value(
                "rpmiddleware_envelopes_total",
                direction="to_engine",
                type="reply.request",
                outcome="delivered",
            )
        )


class GaugeTests(SynchronousTestCase):
    def test_engineAndQueue(self) -> None:
        rig = Rig()
        self.assertEqual(rig.value("rpmiddleware_engine_connected"), 0.0)
        rig.ask()
        self.assertEqual(
            rig.number("rpmiddleware_waiting_requests", where="capacity_gate")
            + rig.number("rpmiddleware_waiting_requests", where="engine_link"),
            1.0,
        )
        session = rig.connect()
        rig.says("capacity.update", acceptingRequests=False, queueDepth=3, queueLimit=4)
        self.assertEqual(rig.value("rpmiddleware_engine_connected"), 1.0)
        self.assertEqual(rig.value("rpmiddleware_queue_depth"), 3.0)
        self.assertEqual(rig.value("rpmiddleware_queue_limit"), 4.0)
        self.assertEqual(rig.value("rpmiddleware_engine_accepting_requests"), 0.0)
        session.connectionLost()
        self.assertEqual(rig.value("rpmiddleware_engine_connected"), 0.0)
        self.assertEqual(rig.value("rpmiddleware_queue_depth"), 0.0)

    def test_activeClients(self) -> None:
        class Factory:
            connections = {object(), object()}

        rig = Rig({b"/client/socket": Factory(), b"/rp-engine/socket": object()})
        self.assertEqual(rig.value("rpmiddleware_active_clients", endpoint="/client/socket"), 2.0)
        self.assertIsNone(rig.value("rpmiddleware_active_clients", endpoint="/rp-engine/socket"))


class RegistryTests(SynchronousTestCase):
    def test_oneRegistryEach(self) -> None:
        """
        Two middlewares in one process have their own registries: neither
        collides with the other, nor with the process-global one.
        """
        first, second = Rig(), Rig()
        self.assertIsNot(first.metrics.registry, second.metrics.registry)
        first.connect()
        first.ask()
        self.assertEqual(first.value("rpmiddleware_engine_connected"), 1.0)
        self.assertEqual(second.value("rpmiddleware_engine_connected"), 0.0)
        from prometheus_client import REGISTRY

        self.assertIsNone(REGISTRY.get_sample_value("rpmiddleware_engine_connected"))

    def test_givenRegistry(self) -> None:
        registry = CollectorRegistry()
        rig = Rig()
        metrics = MiddlewareMetrics(rig.middleware, registry=registry)
        self.assertIs(metrics.registry, registry)
        self.assertEqual(registry.get_sample_value("rpmiddleware_engine_connected"), 0.0)


class ResourceTests(SynchronousTestCase):
    def test_exposition(self) -> None:
        rig = Rig()
        rig.connect()
        request = DummyRequest([b""])
        body = MetricsResource(rig.metrics).render_GET(request)  # type: ignore[arg-type]
        [contentType] = request.responseHeaders.getRawHeaders(b"content-type") or [b""]
        self.assertTrue(contentType.startswith(b"text/plain"))
        text = body.decode("utf-8")
        self.assertIn("# TYPE rpmiddleware_envelopes_total counter", text)
        self.assertIn("# TYPE rpmiddleware_time_to_first_text_seconds histogram", text)
        self.assertIn("rpmiddleware_engine_connected 1.0", text)
