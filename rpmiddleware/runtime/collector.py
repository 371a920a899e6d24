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

import atexit
import gc
import importlib
import sys
from types import ModuleType
from typing import Any


def freezeStartup() -> int:
    """
    Collect what start-up left behind, then move every object still alive
    into the collector's permanent generation; returns how many are frozen.
    """
    gc.collect()
    gc.freeze()
    _thawAtExit()
    return gc.get_freeze_count()


_thawing: list[bool] = []


def _thawAtExit() -> None:
    """
    Hand the frozen objects back to the collector when the interpreter
    exits, so that its last collection frees them like any others: native
    libraries check at exit that their objects were freed (soxr's bindings
    print a "leaked instance" report for each one still alive).
    """
    if not _thawing:
        _thawing.append(True)
        atexit.register(gc.unfreeze)


def importFrozen(name: str) -> ModuleType:
    """
    Import a library that start-up left out (numpy and soxr, aiortc: most
    daemons never need them) and freeze it as start-up's are: imported
    later, its thousands of module-level objects would otherwise join every
    full pass (numpy's made one take 24 ms at 200 heavy streams, against 4
    ms without it).  What else is alive at that moment is frozen too, once:
    the few objects of the session that asked.
    """
    module = sys.modules.get(name)
    if module is not None:
        return module
    # Raises ImportError for a module marked missing (None) as for any other.
    module = importlib.import_module(name)
    freezeStartup()
    return module


def freezeWhenRunning(reactor: Any) -> None:
    """
    L{freezeStartup} once the reactor runs, when the listeners and the
    plugin chain are built.
    """
    reactor.callWhenRunning(freezeStartup)
