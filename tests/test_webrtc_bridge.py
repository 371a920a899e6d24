"""
asyncio <-> Twisted: results and failures cross both ways, and failures
nobody waits for are logged instead of lost.

Runs on the asyncio reactor (in a child process from the default suite).
"""

from __future__ import annotations

import asyncio
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import globalLogPublisher

from tests.support.webrtc import AsyncioTestCase, inChildProcess


class Boom(Exception):
    pass


class BridgeTests(AsyncioTestCase):
    timeout = 20

    def setUp(self) -> None:
        super().setUp()
        self.logged = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)

    def failuresLogged(self) -> list[dict[str, Any]]:
        return [e for e in self.logged if e.get("log_failure") is not None]

    def test_coroutineResult(self) -> Deferred[Any]:
        from rpmiddleware.webrtc.bridge import deferredFromCoroutine

        async def work() -> int:
            await asyncio.sleep(0)
            return 7

        d = deferredFromCoroutine(work(), self.loop)
        return d.addCallback(self.assertEqual, 7)

    def test_coroutineFailure(self) -> Deferred[Any]:
        from rpmiddleware.webrtc.bridge import deferredFromCoroutine

        async def work() -> None:
            raise Boom()

        d = deferredFromCoroutine(work(), self.loop)
        return self.assertFailure(d, Boom)

    def test_cancelCancelsTask(self) -> Deferred[Any]:
        from rpmiddleware.webrtc.bridge import deferredFromCoroutine

        started = asyncio.Event()

        async def forever() -> None:
            started.set()
            await asyncio.sleep(3600)

        d = deferredFromCoroutine(forever(), self.loop)

        async def cancelLater() -> None:
            await started.wait()
            d.cancel()

        asyncio.ensure_future(cancelLater())
        return self.assertFailure(d, asyncio.CancelledError)

    def test_awaitDeferred(self) -> Deferred[Any]:
        from rpmiddleware.webrtc.bridge import awaitable, deferredFromCoroutine

        async def work() -> str:
            first = await awaitable(succeed("a"), self.loop)
            later: Deferred[str] = Deferred()
            self.loop.call_soon(later.callback, "b")
            return first + await awaitable(later, self.loop)

        return deferredFromCoroutine(work(), self.loop).addCallback(self.assertEqual, "ab")

    def test_spawnLogsFailure(self) -> Deferred[Any]:
        from rpmiddleware.webrtc.bridge import spawn

        async def work() -> None:
            raise Boom("nobody awaits me")

        d = spawn(work(), self.loop, "a background job")

        def check(result: None) -> None:
            self.assertIsNone(result)
            [event] = self.failuresLogged()
            self.assertEqual(event["what"], "a background job")
            self.assertEqual(len(self.flushLoggedErrors(Boom)), 1)

        return d.addCallback(check)

    def test_guardedCallback(self) -> Deferred[Any]:
        """
        An exception raised by a callback an aiortc emitter calls is logged
        and not raised into the emitter; so is a coroutine's, later.
        """
        from rpmiddleware.webrtc.bridge import guarded

        def bad() -> None:
            raise Boom("sync")

        async def badLater() -> None:
            raise Boom("async")

        guarded(bad, "a handler")()
        guarded(badLater, "an async handler")()

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        def check(_: object) -> None:
            self.assertEqual(
                sorted(e["what"] for e in self.failuresLogged()), ["a handler", "an async handler"]
            )
            self.assertEqual(len(self.flushLoggedErrors(Boom)), 2)

        return Deferred.fromFuture(asyncio.ensure_future(settle())).addCallback(check)


BridgeTestsInChild = inChildProcess(__name__, "BridgeTests")
