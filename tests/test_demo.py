"""
C{twistd rpmiddleware --demo}: the simulator connects in-process and a
scripted turn streams to completion.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from rpmiddleware.demo import DemoService
from rpmiddleware.tap import Options, makeService
from rpmiddleware.testing.kit import captureLogEvents


def startFastDemo(testCase: TestCase) -> tuple[Any, list[dict[str, Any]]]:
    """
    Start C{twistd rpmiddleware --demo --port 0} in-process with the simulated
    RPEngine at full speed; return the demo service and the log events.
    """
    events = captureLogEvents(testCase)
    testCase.patch(DemoService, "pacing", {"tokensPerSecond": None, "audioRealtime": False})
    options = Options()
    options.parseOptions(["--demo", "--port", "0"])
    top = makeService(options, reactor)
    top.privilegedStartService()
    top.startService()
    testCase.addCleanup(top.stopService)
    return top.getServiceNamed("demo"), events  # type: ignore[attr-defined]


class DemoTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def test_demoPlaysATurn(self) -> Any:
        demo, events = startFastDemo(self)
        completed = yield demo.ready
        self.assertEqual(completed.type, "reply.completed")
        self.assertTrue(demo.turn.text().strip())
        types = [e.type for e in demo.turn.envelopes]
        self.assertEqual(types[0], "reply.accepted")
        self.assertIn("reply.text.delta", types)
        self.assertIn("reply.audio.chunk", types)
        self.assertEqual(types[-1], "reply.completed")
        said = [e for e in events if e.get("log_format", "").startswith("demo: Mira says")]
        self.assertTrue(said, "the reply is logged as it streams")
        url = f"https://rpengine.gemtavern.com/#port={demo.port}"
        link = [e for e in events if e.get("link") == url]
        self.assertEqual(len(link), 1, "the connect link with the real port is logged")
