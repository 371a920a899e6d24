"""
The garbage collector in a long-running relay.

CPython's cyclic collector passes now and then over every object it tracks,
holding the reactor for the whole pass.  After start-up most of those are
the program itself (modules, classes, functions, the plugin chain), which
never become garbage; measured at 100 heavy voice streams (bench/load.py),
a full pass over the daemon's ~95,000 tracked objects held the reactor for
20-35 ms.  Freezing what start-up made (C{gc.freeze}) takes it out of every
later pass, so a pass costs what the live sessions and turns hold.
"""

from __future__ import annotations

import gc
from typing import Any


def freezeStartup() -> int:
    """
    Collect what start-up left behind, then move every object still alive
    into the collector's permanent generation; returns how many are frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def freezeWhenRunning(reactor: Any) -> None:
    """
    L{freezeStartup} once the reactor runs, when the listeners and the
    plugin chain are built.
    """
    reactor.callWhenRunning(freezeStartup)
