"""
Running WebRTC tests on the asyncio reactor.

aiortc needs an asyncio loop, so tests that drive real peer connections
need Twisted's asyncio reactor, and trial's default reactor (epoll) is
chosen once per process.  Rather than run the whole suite on asyncio, each
such test class derives from L{AsyncioTestCase} and has a twin made by
L{inChildProcess}:

  - on the asyncio reactor (a child, or C{trial --reactor=asyncio}) the
    class's tests run, and the twin skips;
  - on any other reactor the class skips, and the twin runs
    C{python -m twisted.trial --reactor=asyncio module.Class} in a child
    process, failing with the child's report if it fails.

Without the C{webrtc} extra both skip, saying so: it is optional.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from twisted.trial.unittest import SynchronousTestCase, TestCase

from rpmiddleware.webrtc.reactor import isAsyncioReactor, unavailableReason

#: The checkout: tests/support/webrtc.py is three levels below it.
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Seconds a child trial run may take before it is killed and failed.
CHILD_TIMEOUT = 240


def _running() -> object:
    from twisted.internet import reactor

    return reactor


def missingExtra() -> str | None:
    reason = unavailableReason()
    if reason is None:
        return None
    return f"the optional webrtc extra is not installed: {reason}"


def onAsyncio() -> bool:
    return isAsyncioReactor(_running())


class AsyncioTestCase(TestCase):
    """
    Tests that run only on the asyncio reactor (see the module docstring).
    """

    def setUp(self) -> None:
        missing = missingExtra()
        if missing is not None:
            self.skipTest(missing)
        if not onAsyncio():
            self.skipTest(
                "needs the asyncio reactor; the *InChild twin runs these in a child "
                "process with trial --reactor=asyncio"
            )

    @property
    def loop(self):  # type: ignore[no-untyped-def]
        from rpmiddleware.webrtc.reactor import eventLoop

        return eventLoop(_running())


def inChildProcess(module: str, name: str) -> type[SynchronousTestCase]:
    """
    The twin of C{module.name}: runs it in a child trial on the asyncio reactor.
    """

    class ChildTrial(SynchronousTestCase):
        def test_onAsyncioReactor(self) -> None:
            missing = missingExtra()
            if missing is not None:
                self.skipTest(missing)
            if onAsyncio():
                self.skipTest(f"already on the asyncio reactor: {name} runs here directly")
            target = f"{module}.{name}"
            with tempfile.TemporaryDirectory(prefix="webrtc-trial-") as temp:
                try:
                    result = subprocess.run(
                        [
                            sys.executable, "-m", "twisted.trial", "--reactor=asyncio",
                            f"--temp-directory={os.path.join(temp, '_trial_temp')}", target,
                        ],
                        cwd=TOP,
                        capture_output=True,
                        text=True,
                        timeout=CHILD_TIMEOUT,
                    )  # fmt: skip
                except subprocess.TimeoutExpired as e:
                    output = (e.stdout or b"")[-4000:]
                    self.fail(
                        f"{target} on the asyncio reactor took over {CHILD_TIMEOUT} s:\n{output!r}"
                    )
            report = (result.stdout + result.stderr)[-6000:]
            self.assertEqual(result.returncode, 0, f"{target} on the asyncio reactor:\n{report}")
            self.assertIn("PASSED", result.stdout, report)

    ChildTrial.__name__ = ChildTrial.__qualname__ = f"{name}InChild"
    ChildTrial.__module__ = module
    return ChildTrial
