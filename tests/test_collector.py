"""
Start-up's objects frozen out of the garbage collector's passes
(rpmiddleware.collector).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.collector import freezeStartup, freezeWhenRunning


class Reactor:
    def __init__(self) -> None:
        self.calls: list[Callable[[], Any]] = []

    def callWhenRunning(self, f: Callable[[], Any]) -> None:
        self.calls.append(f)


class CollectorTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.addCleanup(gc.unfreeze)

    def test_freezeStartup(self) -> None:
        """
        Everything alive is frozen, and a later full pass no longer counts it.
        """
        frozen = freezeStartup()
        self.assertEqual(frozen, gc.get_freeze_count())
        self.assertGreater(frozen, 1000)
        self.assertLess(len(gc.get_objects()), frozen)

    def test_whenRunning(self) -> None:
        """
        The freeze waits for the reactor to run.
        """
        reactor = Reactor()
        freezeWhenRunning(reactor)
        self.assertEqual(reactor.calls, [freezeStartup])
