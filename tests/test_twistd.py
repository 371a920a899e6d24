"""
The real command line, in a child process: C{twistd rpmiddleware --demo} on
the asyncio reactor, and the promise that importing us never installs one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from twisted.internet import protocol, reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase, TestCase

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class NoGlobalReactorTests(SynchronousTestCase):
    def test_importsInstallNoReactor(self) -> None:
        """
        No module of ours imports the global reactor at import time, so
        twistd --reactor (asyncio for WebRTC) can still choose one.
        """
        code = (
            "import sys, pkgutil, importlib, rpmiddleware, rpmiddleware.builtin\n"
            "for package in (rpmiddleware, rpmiddleware.builtin):\n"
            "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
            "        try:\n"
            "            importlib.import_module(info.name)\n"
            "        except ImportError as e:\n"
            "            # Modules of the optional webrtc extra need its packages.\n"
            "            if (e.name or '').split('.')[0] not in ('aiortc', 'webrtcvad'):\n"
            "                raise\n"
            "importlib.import_module('twisted.plugins.rpmiddleware_plugin')\n"
            "print('reactor' if 'twisted.internet.reactor' in sys.modules else 'clean')\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True, timeout=60
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "clean")


class WatchOutput(protocol.ProcessProtocol):
    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.output = b""
        self.seen: Deferred[bytes] = Deferred()
        self.ended: Deferred[None] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.output += data
        if self.marker in self.output and not self.seen.called:
            self.seen.callback(self.output)

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        if not self.seen.called:
            self.seen.errback(AssertionError(self.output.decode(errors="replace")[-3000:]))
        self.ended.callback(None)


class TwistdTests(TestCase):
    timeout = 60

    def test_demoOnAsyncioReactor(self) -> Deferred[None]:
        """
        C{twistd -n --reactor=asyncio rpmiddleware --demo} starts, connects the
        simulator, and logs the scripted reply through to the end.
        """
        watcher = WatchOutput(b"the turn is complete")
        args = [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile=", "--logfile=-", "--reactor=asyncio",
            "rpmiddleware", "--demo", "--port", "0",
        ]  # fmt: skip
        # In a folder of its own: the daemon makes its memory store at start-up.
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        process = reactor.spawnProcess(  # type: ignore[attr-defined]
            watcher, sys.executable, args, env=dict(os.environ), path=folder
        )

        def check(output: bytes) -> Deferred[None]:
            self.assertIn(b"AsyncioSelectorReactor", output)
            self.assertIn(b"demo: Mira says", output)
            self.assertIn(b"https://rpengine.gemtavern.com/#port=", output)
            self.assertNotIn(b"Traceback", output)
            process.signalProcess("TERM")
            return watcher.ended

        def stop(failure: Any) -> Any:
            if process.pid is not None:
                process.signalProcess("KILL")
            return watcher.ended.addCallback(lambda _: failure)

        return watcher.seen.addCallbacks(check, stop)
