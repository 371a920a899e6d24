"""
Reliability scenarios shared by the trial suite (small) and the stress run
(large): RPEngine dropped mid-turn again and again, and many clients
playing turns at once.  Each returns a report; the caller asserts.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater

from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.replystream import ReplyCancelled, ReplyFailed, ReplyStream
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import LiveMiddleware, TestClient, connectClient
from rpmiddleware.testing.simulator import SimulatedEngine, SimulatorOptions, connectSimulator

#: Where in a turn RPEngine goes away: before it read the request, after it
#: accepted it, mid-text, mid-audio.
CUTS = ("submitted", "reply.accepted", "reply.text.delta", "reply.audio.chunk")


async def until(reactor: Any, predicate: Any, seconds: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or 'a condition'}")
        await deferLater(reactor, 0.001, lambda: None)


class Attempt:
    """
    One request for a logical turn, and how it ended.
    """

    def __init__(self, turn: int, stream: ReplyStream) -> None:
        self.turn = turn
        self.stream = stream
        self.outcome: str | None = None
        self.code: str | None = None
        self.retryable = False
        self.retried = False
        stream.done.addCallbacks(self._completed, self._failed)

    def _completed(self, envelope: Envelope) -> None:
        self.outcome = "completed"

    def _failed(self, failure: Any) -> None:
        if failure.check(ReplyFailed):
            self.outcome, self.code = "error", failure.value.code
            self.retryable = failure.value.retryable
        elif failure.check(ReplyCancelled):
            self.outcome = "cancelled"
        else:
            self.outcome = f"unexpected {failure.value!r}"


@dataclass
class DropReport:
    rounds: int = 0
    engines: list[SimulatedEngine] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    cuts: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(str(a.outcome if a.code is None else a.code) for a in self.attempts)

    @property
    def processed(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for engine in self.engines:
            total.update(engine.processed)
        return total

    def problems(self) -> list[str]:
        found = []
        unfinished = [a for a in self.attempts if not a.stream.finished]
        if unfinished:
            found.append(f"{len(unfinished)} attempts never ended")
        if set(self.outcomes) - {"completed", "engine_disconnected"}:
            found.append(f"unexpected outcomes {self.outcomes}")
        done = sorted(a.turn for a in self.attempts if a.outcome == "completed")
        if done != list(range(self.rounds)):
            found.append("not every logical turn completed exactly once")
        processed = self.processed
        twice = [r for r, n in processed.items() if n > 1]
        if twice:
            found.append(f"processed twice: {twice[:5]}")
        for a in self.attempts:
            if a.outcome == "completed":
                times = processed[a.stream.requestId]
                if times != 1:
                    found.append(f"completed {a.stream.requestId} processed {times} times")
                if f"logical turn {a.turn:03d}" not in a.stream.text():
                    found.append(f"turn {a.turn} got someone else's reply")
        errors = [e for engine in self.engines for e in engine.protocolErrors]
        if errors:
            found.append(f"RPEngine saw protocol errors: {errors[:3]}")
        return found

    def summary(self) -> str:
        return (
            f"RPEngine dropped {self.rounds} times mid-turn ({dict(self.cuts)}) in "
            f"{self.seconds:.1f} s: {len(self.attempts)} attempts, outcomes "
            f"{dict(self.outcomes)}, {self.rounds} logical turns completed once each, "
            f"max times any requestId was processed: {max(self.processed.values(), default=0)}"
        )


async def engineDrops(
    reactor: Any, middleware: Middleware, live: LiveMiddleware, rounds: int, seed: int = 100
) -> DropReport:
    """
    C{rounds} rounds: RPEngine connects, the game asks for a new turn (and
    again, under a new requestId, for every turn that ended with the
    retryable engine_disconnected, as a client would), and RPEngine goes away
    at a random point of the new turn.  Then RPEngine comes back for good
    and everything left finishes.  The middleware needs a character "mira".
    """
    rng = random.Random(seed)
    report = DropReport(rounds=rounds)
    options = SimulatorOptions(tokensPerSecond=None, audioRealtime=False, queueLimit=8)
    started = time.perf_counter()

    def submit(turn: int) -> Attempt:
        stream = middleware.requestReply(
            "mira", text=f"logical turn {turn:03d}", meta={"client": f"c{turn % 7}"}
        )
        attempt = Attempt(turn, stream)
        report.attempts.append(attempt)
        return attempt

    def resending() -> set[str]:
        link = middleware.link
        held: set[str] = {str(e.requestId) for e in link.waiting if e.requestId}
        for plugin in middleware.chain.plugins:
            held.update(getattr(plugin, "held", lambda: [])())
        return held

    def toRetry() -> list[int]:
        retry = []
        for a in report.attempts:
            if a.code is not None and not a.retried:
                a.retried = True
                if a.code == "engine_disconnected" and a.retryable:
                    retry.append(a.turn)
        return retry

    async def connect() -> SimulatedEngine:
        engine = await connectSimulator(reactor, live.port, options)
        report.engines.append(engine)
        return engine

    retry: list[int] = []
    for turn in range(rounds):
        engine = await connect()
        for again in retry:
            submit(again)
        cut = rng.choice(CUTS)
        report.cuts[cut] += 1
        attempt = submit(turn)
        if cut == "submitted":
            engine.disconnect()
        else:

            def observe(envelope: Envelope, cut: str = cut, e: Any = engine) -> None:
                if envelope.type == cut and not e.closed.called:
                    e.disconnect()

            attempt.stream.subscribe(observe)
        await until(
            reactor,
            lambda e=engine, a=attempt: e.closed.called or a.stream.finished,
            what="the cut",
        )
        engine.disconnect()
        await engine.closed
        await until(reactor, lambda: not middleware.link.connected, what="the drop")
        await until(
            reactor,
            lambda: all(
                a.outcome for a in report.attempts if a.stream.requestId not in resending()
            ),
            what="the dropped turns to end",
        )
        retry = toRetry()
    final = await connect()
    while True:
        for again in retry:
            submit(again)
        await until(reactor, lambda: all(a.outcome for a in report.attempts), what="the rest")
        retry = toRetry()
        if not retry:
            break
    final.disconnect()
    await final.closed
    report.seconds = time.perf_counter() - started
    return report


@dataclass
class LoadReport:
    clients: int = 0
    turns: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    foreign: int = 0
    seconds: float = 0.0
    processedMax: int = 0
    completedUpstream: int = 0

    def problems(self) -> list[str]:
        found = []
        if self.outcomes != Counter({"reply-complete": self.clients * self.turns}):
            found.append(f"outcomes {dict(self.outcomes)}")
        if self.foreign:
            found.append(f"{self.foreign} replies went to the wrong client")
        if self.processedMax > 1:
            found.append("a turn was processed twice")
        if self.completedUpstream != self.clients * self.turns:
            found.append(f"RPEngine completed {self.completedUpstream} turns")
        return found

    def summary(self) -> str:
        return (
            f"{self.clients} clients x {self.turns} turns in {self.seconds:.1f} s: "
            f"{dict(self.outcomes)}; {sum(self.messages.values())} messages to clients "
            f"({dict(self.messages)})"
        )


async def clientLoad(
    reactor: Any,
    live: LiveMiddleware,
    engine: SimulatedEngine,
    clients: int,
    turns: int,
    modalities: list[str],
) -> LoadReport:
    """
    C{clients} clients at once, C{turns} turns each, against one simulated
    RPEngine: every turn must complete, with its own reply.
    """
    report = LoadReport(clients=clients, turns=turns)

    async def join() -> TestClient:
        client = connectClient(reactor, live.url("/client/socket"))
        await client.opened
        ready = await client.next()
        assert ready["type"] == "ready", ready
        client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
        client.send({"type": "configure", "output": {"modalities": modalities}})
        return client

    async def play(index: int, client: TestClient) -> None:
        for turn in range(turns):
            said = f"client {index} turn {turn}"
            client.send({"type": "text", "text": said})
            while True:
                message = await client.next()
                kind = message["type"]
                report.messages[kind] += 1
                if kind == "llm" and said not in message["text"]:
                    report.foreign += 1
                if kind in ("reply-complete", "tts-cancelled") or (
                    kind == "error" and message.get("turnId") is None
                ):
                    report.outcomes[kind] += 1
                    break

    joined = await gatherResults([Deferred.fromCoroutine(join()) for _ in range(clients)])
    started = time.perf_counter()
    try:
        await gatherResults([Deferred.fromCoroutine(play(i, c)) for i, c in enumerate(joined)])
    finally:
        report.seconds = time.perf_counter() - started
        for client in joined:
            client.drop()
    report.processedMax = max(engine.processed.values(), default=0)
    report.completedUpstream = len(engine.completed)
    return report
