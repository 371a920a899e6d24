"""
Start-up's objects frozen out of the garbage collector's passes
(rpmiddleware.runtime.collector).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.runtime import collector
from rpmiddleware.runtime.collector import freezeStartup, freezeWhenRunning, importFrozen


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

    def test_importFrozen(self) -> None:
        """
        A library imported after start-up is frozen with it: its objects are
        in no later pass.  Imported already, it is just returned.
        """
        folder = self.mktemp()
        os.makedirs(folder)
        with open(os.path.join(folder, "latelibrary.py"), "w") as f:
            f.write("TABLE = [[n] for n in range(100)]\n")
        sys.path.insert(0, folder)
        self.addCleanup(sys.path.remove, folder)
        self.addCleanup(sys.modules.pop, "latelibrary", None)
        module = importFrozen("latelibrary")
        table = module.TABLE
        tracked = {id(o) for o in gc.get_objects()}
        self.assertNotIn(id(table), tracked)
        self.assertNotIn(id(table[0]), tracked)
        before = gc.get_freeze_count()
        self.assertIs(importFrozen("latelibrary"), module)
        self.assertEqual(gc.get_freeze_count(), before)

    def test_thawedAtExit(self) -> None:
        """
        What is frozen goes back to the collector when the interpreter exits
        (native libraries report objects still alive then), asked once
        however many times something is frozen.
        """
        registered: list[object] = []
        self.patch(collector.atexit, "register", registered.append)
        self.patch(collector, "_thawing", [])
        freezeStartup()
        freezeStartup()
        self.assertEqual(registered, [gc.unfreeze])
