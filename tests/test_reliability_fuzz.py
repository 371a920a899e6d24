"""
The engine endpoint under fuzzing, over a real loopback socket: a couple of
thousand random and mutated frames through the default plugin chain.  Every
frame gets its defined answer, the connection and the daemon live on, and
memory does not grow with the number of frames.  C{python -m bench stress}
runs the same with tens of thousands of frames.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from bench.fuzzing import fuzzEngine
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.testing.live import startMiddleware


class EngineFuzzTests(TestCase):
    timeout = 120

    def test_fuzzEngineEndpoint(self) -> Deferred[Any]:
        settings = Settings()
        settings.engine.dedup_window = 256
        live = startMiddleware(
            reactor, settings, middleware=Middleware.fromSettings(reactor, settings)
        )
        self.addCleanup(live.stop)

        async def run() -> None:
            report = await fuzzEngine(
                reactor, live, frames=2000, seed=7, sessions=2, maxString=64 * 1024
            )
            self.assertEqual(report.problems(), [], report.summary())
            self.assertEqual(report.frames, 2000)
            # The mix really exercised every path.
            for outcome in ("invalid", "duplicate", "delivered", "ack"):
                self.assertGreater(report.expected[outcome], 20, outcome)
            self.assertGreater(len(report.kinds), 25)
            self.assertEqual(report.sessions, 2)
            # Bounded state: the dedup window and the unacknowledged map.
            self.assertLessEqual(report.seenWindow, 256)
            self.assertLessEqual(report.unacked, 1)
            # Memory does not grow with frames: the second half adds little.
            self.assertLess(report.memoryGrowth, 2 * 1024 * 1024, report.summary())
            # The daemon still takes a new RPEngine.
            self.assertIsNotNone(live.listener.port)

        return Deferred.fromCoroutine(run())
