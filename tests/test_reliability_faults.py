"""
Faults on the engine side, over real loopback sockets with the default
plugin chain: RPEngine dropped mid-turn a hundred times in a row and
reconnected each time, and work sent while its connection is closing.  No
turn is lost and none is processed twice; the ids are checked on the
RPEngine side, in the simulators' own books.  C{python -m bench stress}
runs the drops for many more rounds.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from bench.scenarios import CUTS, Attempt, engineDrops
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import LiveMiddleware, startMiddleware
from rpmiddleware.testing.simulator import SimulatedEngine, SimulatorOptions, connectSimulator


def engineGone(middleware: Middleware) -> Deferred[None]:
    """
    Fires once no RPEngine session is live (at once if none is), as the
    middleware tells its observers; bounded by the test's timeout.
    """
    gone: Deferred[None] = Deferred()
    if not middleware.engineConnected:
        gone.callback(None)
        return gone

    def changed(session: object) -> None:
        if session is None and not gone.called:
            stop()
            gone.callback(None)

    stop = middleware.observeEngine(changed)
    return gone


class EngineDropTests(TestCase):
    timeout = 120

    def setUp(self) -> None:
        settings = Settings()
        self.middleware = Middleware.fromSettings(reactor, settings)
        self.middleware.registerCharacter("mira", exampleCard())
        self.live: LiveMiddleware = startMiddleware(reactor, settings, middleware=self.middleware)
        self.addCleanup(self.live.stop)

    def test_droppedMidTurnHundredTimes(self) -> Deferred[None]:
        """
        A hundred rounds: RPEngine connects, the game asks for a new turn
        (and again for every turn that ended with the retryable
        engine_disconnected, as a client would, under a new requestId), and
        RPEngine goes away at a random point of the new turn.  Every attempt
        ends with a terminal message; every logical turn completes exactly
        once in the end, with its own reply; no requestId is processed twice
        across all the RPEngine sessions.
        """

        async def run() -> None:
            report = await engineDrops(reactor, self.middleware, self.live, rounds=100)
            self.assertEqual(report.problems(), [], report.summary())
            self.assertEqual(len(report.engines), 101)
            self.assertTrue(all(report.cuts[c] > 10 for c in CUTS), report.cuts)
            self.assertEqual(set(report.outcomes), {"completed", "engine_disconnected"})
            # The faults really bit: many turns were cut after RPEngine took them.
            self.assertGreater(report.outcomes["engine_disconnected"], 30)
            self.assertEqual(self.middleware.link.openRequests(), [])

        return Deferred.fromCoroutine(run())

    async def connect(self) -> SimulatedEngine:
        engine = await connectSimulator(
            reactor, self.live.port, SimulatorOptions(tokensPerSecond=None, audioRealtime=False)
        )
        self.addCleanup(engine.disconnect)
        return engine

    def test_sentWhileClosing(self) -> Deferred[None]:
        """
        A request that reaches the engine link while the RPEngine connection
        is in its closing handshake is not lost: it goes out again in the
        next session and completes there, processed once.
        """

        async def run() -> None:
            first = await self.connect()
            session = self.middleware.link.session
            assert session is not None
            session.close(4001, "going away")
            attempt = Attempt(0, self.middleware.requestReply("mira", text="hello"))
            await first.closed
            await engineGone(self.middleware)
            self.assertIsNone(attempt.outcome)
            second = await self.connect()
            await attempt.stream.done
            self.assertEqual(attempt.outcome, "completed")
            self.assertEqual(first.processed[attempt.stream.requestId], 0)
            self.assertEqual(second.processed[attempt.stream.requestId], 1)

        return Deferred.fromCoroutine(run())
