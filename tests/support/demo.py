"""
The demo (C{twistd rpmiddleware --demo}) started in-process with the
simulated RPEngine at full speed.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from rpmiddleware.tap import Options, makeService
from rpmiddleware.testing.demo import DemoService


def startFastDemo(testCase: TestCase) -> tuple[Any, EventLoggingObserver]:
    """
    Start C{twistd rpmiddleware --demo --port 0} in-process with the simulated
    RPEngine at full speed; return the demo service and the log events.
    """
    events = EventLoggingObserver.createWithCleanup(testCase, globalLogPublisher)
    testCase.patch(DemoService, "pacing", {"tokensPerSecond": None, "audioRealtime": False})
    options = Options()
    options.parseOptions(["--demo", "--port", "0"])
    top = makeService(options, reactor)
    top.privilegedStartService()
    top.startService()
    testCase.addCleanup(top.stopService)
    return top.getServiceNamed("demo"), events  # type: ignore[attr-defined]
