"""
Prometheus metrics of one middleware, served at C{/metrics}.

Every number is gathered by watching the core's view
(L{rpmiddleware.core.view.CoreView}), never by asking each plugin: the chain
tells L{MiddlewareMetrics} about every envelope that leaves it (both
directions, as an L{IChainObserver}), the game end shows it every envelope
from RPEngine after the request's record is marked, the view tells it when
RPEngine comes and goes and what its last C{capacity.update} said, and the
audio-resample plugin
reports how long each conversion took through its C{timingObservers} hook
(any plugin providing L{ITimingSource} is heard the same way; any providing
L{IHeldWork} is counted in C{rpmiddleware_waiting_requests}).
Gauges (clients, queue) are read when scraped.

Each middleware has its own L{CollectorRegistry}, never the process-global
one, so tests and several middlewares in one process do not collide.
C{docs/metrics.md} lists every metric.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from twisted.web.resource import Resource
from twisted.web.server import Request
from zope.interface import implementer

from rpmiddleware.core.view import CoreView
from rpmiddleware.plugin.interfaces import IChainObserver, IMetricsSource, ITimingSource
from rpmiddleware.protocol.envelope import Direction, Envelope

#: Seconds from asking to the first text or audio: a local model answers in
#: a fraction of a second when idle and in tens of seconds when queued.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
#: Seconds one resampling step takes (a 100 ms chunk takes well under 1 ms).
RESAMPLE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
#: Requests whose first text / first audio was already observed, remembered at most.
SEEN_MEMORY = 4096
#: Distinct error codes given their own label; later ones count as C{other}.
MAX_ERROR_CODES = 64
_CODE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: Envelope types are the code's, not a peer's, but a label is capped anyway.
MAX_TYPE_LENGTH = 64


def _label(value: Any, fallback: str = "unknown") -> str:
    return value[:MAX_TYPE_LENGTH] if isinstance(value, str) and value else fallback


def transferBytes(transfer: Any) -> int:
    """
    Bytes of a card transfer as compact UTF-8 JSON (what it costs on the wire).
    """
    text = json.dumps(transfer, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


class _Gauges(Collector):
    """
    The gauges, read when Prometheus scrapes.
    """

    def __init__(self, metrics: MiddlewareMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        m = self._metrics
        core = m.middleware
        envelopes = CounterMetricFamily(
            "rpmiddleware_envelopes",
            "Envelopes that left the plugin chain, by direction, type and outcome "
            "(delivered to their end, or dropped by a plugin).",
            labels=["direction", "type", "outcome"],
        )
        for labels, count in m.envelopeCounts().items():
            envelopes.add_metric(list(labels), count)
        yield envelopes
        yield GaugeMetricFamily(
            "rpmiddleware_engine_connected",
            "1 while an RPEngine session is live, else 0.",
            value=1 if core.engineConnected else 0,
        )
        yield GaugeMetricFamily(
            "rpmiddleware_engine_not_reading",
            "1 while RPEngine is judged gone from the file mailbox (its tab stopped reading the "
            "folder while turns waited), until a session starts again; else 0.",
            value=1 if core.engineProblem else 0,
        )
        yield CounterMetricFamily(
            "rpmiddleware_engine_reader_lost",
            "Times RPEngine was judged gone from the file mailbox and its waiting turns ended.",
            value=core.engineReaderLost,
        )
        clients = GaugeMetricFamily(
            "rpmiddleware_active_clients",
            "Open WebSocket connections by endpoint.",
            labels=["endpoint"],
        )
        for path, factory in m.endpoints.items():
            connections = getattr(factory, "connections", None)
            if connections is not None:
                clients.add_metric([path.decode("ascii", "replace")], len(connections))
        yield clients
        yield GaugeMetricFamily(
            "rpmiddleware_engine_accepting_requests",
            "1 while RPEngine's last capacity.update accepted requests.",
            value=1 if core.capacity.acceptingRequests else 0,
        )
        yield GaugeMetricFamily(
            "rpmiddleware_queue_depth",
            "RPEngine's queue depth from its last capacity.update (0 without RPEngine).",
            value=core.capacity.queueDepth,
        )
        yield GaugeMetricFamily(
            "rpmiddleware_queue_limit",
            "RPEngine's queue limit from its last capacity.update.",
            value=core.capacity.queueLimit,
        )
        waiting = GaugeMetricFamily(
            "rpmiddleware_waiting_requests",
            "Requests held in the middleware: in a plugin that holds work (the capacity "
            "gate's local queue), or in the engine link while no RPEngine is connected.",
            labels=["where"],
        )
        held = core.waiting()
        waiting.add_metric(["engine_link"], held.forEngine)
        for name, count in held.held:
            # Named after the plugin: capacity-gate is "capacity_gate".
            waiting.add_metric([_label(name).replace("-", "_")], count)
        yield waiting
        for plugin in core.providers(IMetricsSource):
            yield from plugin.collectMetrics()


@implementer(IChainObserver)
class MiddlewareMetrics:
    """
    The metrics of one middleware.

    @param middleware: the core's view (a L{rpmiddleware.core.middleware.Middleware});
        its chain, game end and engine are watched for as long as it lives.
    @param endpoints: the WebSocket factories by path (for connection counts).
    @ivar registry: the L{CollectorRegistry} holding everything here.
    """

    name = "metrics"

    def __init__(
        self,
        middleware: CoreView,
        endpoints: Mapping[bytes, Any] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.middleware = middleware
        self.endpoints = dict(endpoints or {})
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.errors = Counter(
            "rpmiddleware_request_errors",
            "request.error envelopes that reached the game end, by code (RPEngine's or a "
            "plugin's).",
            ["code"],
            registry=r,
        )
        self.cardBytes = Counter(
            "rpmiddleware_card_transfer_bytes",
            "Bytes of character card transfers sent toward RPEngine, by mode.",
            ["mode"],
            registry=r,
        )
        self.cardTransfers = Counter(
            "rpmiddleware_card_transfers",
            "Character card transfers sent toward RPEngine, by mode.",
            ["mode"],
            registry=r,
        )
        self.firstText = Histogram(
            "rpmiddleware_time_to_first_text_seconds",
            "Seconds from a request being asked to its first reply.text.delta.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.firstAudio = Histogram(
            "rpmiddleware_time_to_first_audio_seconds",
            "Seconds from a request being asked to its first reply.audio.chunk.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.resample = Histogram(
            "rpmiddleware_resample_seconds",
            "Seconds one audio conversion of the audio-resample plugin took: a recording "
            "toward RPEngine, or a speech chunk toward the game.",
            ["direction"],
            buckets=RESAMPLE_BUCKETS,
            registry=r,
        )
        r.register(_Gauges(self))
        self._errorCodes: set[str] = set()
        self._seenText: OrderedDict[str, None] = OrderedDict()
        self._seenAudio: OrderedDict[str, None] = OrderedDict()
        self._unhooks: list[Callable[[], None]] = []
        #: Labelled children already looked up (their label values are bounded).
        #: Envelopes that left the chain, by (direction, type, outcome):
        #: counted in a dict and read when Prometheus scrapes, because a
        #: labelled Counter takes a lock on every increment and every speech
        #: chunk and text delta is counted.
        self._envelopeCounts: dict[tuple[Direction, str, str], int] = {}
        self._resampleHistograms: dict[str, Any] = {}
        self._watch()

    def _watch(self) -> None:
        middleware = self.middleware
        self._unhooks.append(middleware.observeChain(self))
        self._unhooks.append(
            middleware.observeEnvelopes(
                self._delivered, {"reply.text.delta", "reply.audio.chunk", "request.error"}
            )
        )
        for plugin in middleware.providers(ITimingSource):
            observers = plugin.timingObservers
            observers.append(self._resampled)
            self._unhooks.append(self._unhookTiming(observers))

    def _unhookTiming(self, observers: list[Any]) -> Callable[[], None]:
        def unhook() -> None:
            if self._resampled in observers:
                observers.remove(self._resampled)

        return unhook

    def stop(self) -> None:
        """
        Stop watching (the counters keep their values).
        """
        unhooks, self._unhooks = self._unhooks, []
        for unhook in unhooks:
            unhook()

    # IChainObserver

    def envelopeLeft(self, envelope: Envelope, direction: Direction, outcome: str) -> None:
        counts, key = self._envelopeCounts, (direction, envelope.type, outcome)
        counts[key] = counts.get(key, 0) + 1
        if direction is Direction.TO_ENGINE and outcome == "delivered":
            card = envelope.get("card")
            if isinstance(card, dict):
                self._cardSent(envelope, card)

    def envelopeCounts(self) -> dict[tuple[str, str, str], int]:
        """
        Envelopes that left the chain so far, by the labels of
        C{rpmiddleware_envelopes_total}: direction, type, outcome.
        """
        totals: dict[tuple[str, str, str], int] = {}
        for (direction, kind, outcome), count in list(self._envelopeCounts.items()):
            labels = (direction.value, _label(kind), outcome)
            totals[labels] = totals.get(labels, 0) + count
        return totals

    def _cardSent(self, envelope: Envelope, card: dict[str, Any]) -> None:
        mode = _label(card.get("mode"))
        size: Any = None
        requestId = envelope.requestId
        if requestId is not None:
            entry = self.middleware.turnRecord(requestId)
            if entry is not None and entry.details.get("cardMode") == card.get("mode"):
                size = entry.details.get("cardBytes")
        if type(size) is not int:
            size = transferBytes(card)
        self.cardTransfers.labels(mode).inc()
        self.cardBytes.labels(mode).inc(size)

    # The game end.

    def _delivered(self, envelope: Envelope) -> None:
        kind = envelope.type
        if kind == "reply.text.delta":
            self._first(envelope, self._seenText, "firstText", self.firstText)
        elif kind == "reply.audio.chunk":
            self._first(envelope, self._seenAudio, "firstAudio", self.firstAudio)
        elif kind == "request.error":
            self.errors.labels(self._code(envelope.get("code"))).inc()

    def _first(
        self, envelope: Envelope, seen: OrderedDict[str, None], mark: str, histogram: Histogram
    ) -> None:
        requestId = envelope.requestId
        if requestId is None or requestId in seen:
            return
        seen[requestId] = None
        while len(seen) > SEEN_MEMORY:
            seen.popitem(last=False)
        entry = self.middleware.turnRecord(requestId)
        if entry is None or entry.submitted is None:
            return
        when = getattr(entry, mark)
        if when is not None:
            histogram.observe(max(0.0, when - entry.submitted))

    def _code(self, code: Any) -> str:
        if not isinstance(code, str) or not _CODE.match(code):
            return "other"
        if code not in self._errorCodes:
            if len(self._errorCodes) >= MAX_ERROR_CODES:
                return "other"
            self._errorCodes.add(code)
        return code

    def _resampled(self, direction: str, seconds: float) -> None:
        histogram = self._resampleHistograms.get(direction)
        if histogram is None:
            histogram = self._resampleHistograms[direction] = self.resample.labels(direction)
        histogram.observe(seconds)

    # Exposition.

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsResource(Resource):
    """
    C{GET /metrics}: the Prometheus text format.
    """

    isLeaf = True

    def __init__(self, metrics: MiddlewareMetrics) -> None:
        super().__init__()
        self.metrics = metrics

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        return self.metrics.exposition()

    def render_HEAD(self, request: Request) -> bytes:
        return self.render_GET(request)
