"""
Choosing the reactor for WebRTC, and reporting it unavailable cleanly.

A reactor is chosen once per process, so each case runs in a fresh child
interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from twisted.trial.unittest import SynchronousTestCase

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Makes aiortc unimportable in a child, as if the extra were not installed.
WITHOUT_EXTRA = "import sys; sys.modules['aiortc'] = None\n"


def child(code: str) -> str:
    """
    Run C{code} in a fresh interpreter; its stdout, stripped.
    """
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=TOP, capture_output=True, text=True, timeout=60
    )
    if result.returncode:
        raise AssertionError(result.stderr[-3000:])
    return result.stdout.strip()


class ReactorChoiceTests(SynchronousTestCase):
    def test_installsAsyncioWhenNoneInstalled(self) -> None:
        out = child(
            "from rpmiddleware.webrtc.reactor import preferAsyncioReactor\n"
            "print(preferAsyncioReactor())\n"
            "from twisted.internet import reactor\n"
            "print(type(reactor).__name__)\n"
        )
        self.assertEqual(out.splitlines(), ["None", "AsyncioSelectorReactor"])

    def test_keepsAsyncioAlreadyInstalled(self) -> None:
        out = child(
            "from twisted.internet import asyncioreactor; asyncioreactor.install()\n"
            "from rpmiddleware.webrtc.reactor import preferAsyncioReactor\n"
            "print(preferAsyncioReactor())\n"
        )
        self.assertEqual(out, "None")

    def test_otherReactorExplained(self) -> None:
        """
        With another reactor installed there is no crash, only a sentence
        naming it and the command line that works; availability() gives the
        same sentence (what the client's error quotes).
        """
        out = child(
            "from twisted.internet import pollreactor; pollreactor.install()\n"
            "from twisted.internet import reactor\n"
            "from rpmiddleware.webrtc.reactor import availability, preferAsyncioReactor\n"
            "message = preferAsyncioReactor()\n"
            "print(message)\n"
            "print(availability(reactor) == message)\n"
        )
        message, same = out.splitlines()
        self.assertIn("PollReactor", message)
        self.assertIn("twistd --reactor=asyncio rpmiddleware", message)
        self.assertEqual(same, "True")

    def test_withoutTheExtra(self) -> None:
        """
        Without aiortc: a sentence with the pip command, no reactor is
        installed by the daemon's choice, and the modules that need no
        aiortc still import.
        """
        out = child(
            WITHOUT_EXTRA + "from rpmiddleware.config.settings import Settings\n"
            "from rpmiddleware.webrtc import bridge, endpoint, vad\n"
            "from rpmiddleware.webrtc.reactor import chooseDaemonReactor, unavailableReason\n"
            "print(unavailableReason())\n"
            "print(chooseDaemonReactor(Settings()) == unavailableReason())\n"
            "print('twisted.internet.reactor' in sys.modules)\n"
        )
        reason, same, installed = out.splitlines()
        self.assertIn("aiortc", reason)
        self.assertIn('pip install "rpmiddleware[webrtc]"', reason)
        self.assertEqual((same, installed), ("True", "False"))

    def test_disabledInConfiguration(self) -> None:
        out = child(
            "import sys\n"
            "from rpmiddleware.config.settings import Settings\n"
            "from rpmiddleware.webrtc.reactor import chooseDaemonReactor\n"
            "settings = Settings()\n"
            "settings.webrtc.enabled = False\n"
            "print(chooseDaemonReactor(settings))\n"
            "print('twisted.internet.reactor' in sys.modules)\n"
        )
        reason, installed = out.splitlines()
        self.assertIn("webrtc.enabled = false", reason)
        self.assertEqual(installed, "False")

    def test_daemonChoiceWithTheExtra(self) -> None:
        """
        chooseDaemonReactor (what twistd rpmiddleware calls first) installs
        the asyncio reactor when the extra is there.
        """
        from tests.support.webrtc import missingExtra

        missing = missingExtra()
        if missing is not None:
            self.skipTest(missing)
        out = child(
            "from rpmiddleware.config.settings import Settings\n"
            "from rpmiddleware.webrtc.reactor import chooseDaemonReactor\n"
            "print(chooseDaemonReactor(Settings()))\n"
            "from twisted.internet import reactor\n"
            "print(type(reactor).__name__)\n"
        )
        self.assertEqual(out.splitlines(), ["None", "AsyncioSelectorReactor"])

    def test_aiortcImportedAtTheFirstOffer(self) -> None:
        """
        The daemon's choice finds the extra without importing aiortc (28 MB
        of an idle daemon); L{availability}, asked at an offer, imports it.
        """
        from tests.support.webrtc import missingExtra

        missing = missingExtra()
        if missing is not None:
            self.skipTest(missing)
        out = child(
            "import sys\n"
            "from rpmiddleware.config.settings import Settings\n"
            "from rpmiddleware.webrtc.reactor import availability, chooseDaemonReactor\n"
            "print(chooseDaemonReactor(Settings()))\n"
            "print('aiortc' in sys.modules, 'av' in sys.modules)\n"
            "from twisted.internet import reactor\n"
            "print(availability(reactor))\n"
            "print('aiortc' in sys.modules)\n"
        )
        self.assertEqual(out.splitlines(), ["None", "False False", "None", "True"])

    def test_brokenExtra(self) -> None:
        """
        An aiortc that is there but does not import: the daemon still
        chooses the asyncio reactor, and offers are refused with the import's
        error.
        """
        from tests.support.webrtc import missingExtra

        if missingExtra() is not None:
            self.skipTest("needs webrtcvad, so that only aiortc is broken")
        out = child(
            "import os, sys, tempfile\n"
            "top = tempfile.mkdtemp()\n"
            "os.mkdir(os.path.join(top, 'aiortc'))\n"
            "with open(os.path.join(top, 'aiortc', '__init__.py'), 'w') as f:\n"
            "    f.write('raise ImportError(\"broken build\")')\n"
            "sys.path.insert(0, top)\n"
            "from rpmiddleware.config.settings import Settings\n"
            "from rpmiddleware.webrtc.reactor import availability, chooseDaemonReactor\n"
            "print(chooseDaemonReactor(Settings()))\n"
            "from twisted.internet import reactor\n"
            "print(availability(reactor))\n"
        )
        chosen, reason = out.splitlines()
        self.assertEqual(chosen, "None")
        self.assertIn("aiortc is missing: broken build", reason)
        self.assertIn('pip install "rpmiddleware[webrtc]"', reason)


class ProblemTests(SynchronousTestCase):
    def test_reactorProblem(self) -> None:
        from twisted.internet.testing import MemoryReactorClock

        from rpmiddleware.webrtc.reactor import WrongReactor, eventLoop, reactorProblem

        fake = MemoryReactorClock()
        problem = reactorProblem(fake)
        assert problem is not None
        self.assertIn("MemoryReactorClock", problem)
        self.assertRaises(WrongReactor, eventLoop, fake)


class TwistdReactorTests(SynchronousTestCase):
    """
    The real command line: twistd rpmiddleware picks the asyncio reactor
    itself when WebRTC is enabled, and explains another reactor instead of
    failing.
    """

    def twistd(self, *before: str) -> str:
        """
        Run C{twistd -n [before] rpmiddleware --demo --port 0} until the demo
        turn is complete; its log.
        """
        args = [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile=", "--logfile=-", *before, "rpmiddleware", "--demo", "--port", "0",
        ]  # fmt: skip
        # In a folder of its own: the daemon makes its memory store at start-up.
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        process = subprocess.Popen(
            args, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        # A daemon that never completes its turn is killed after a minute,
        # which ends the read below.
        watchdog = threading.Timer(60, process.kill)
        watchdog.start()
        output = []
        try:
            assert process.stdout is not None
            for line in process.stdout:
                output.append(line)
                if "the turn is complete" in line:
                    break
        finally:
            watchdog.cancel()
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return "".join(output)

    def test_picksAsyncio(self) -> None:
        from tests.support.webrtc import missingExtra

        missing = missingExtra()
        if missing is not None:
            self.skipTest(missing)
        log = self.twistd()
        self.assertIn("WebRTC enabled (aiortc on the asyncio reactor)", log)
        self.assertIn("AsyncioSelectorReactor", log)
        self.assertIn("the turn is complete", log)
        self.assertNotIn("Traceback", log)

    def test_otherReactorExplained(self) -> None:
        log = self.twistd("--reactor=poll")
        self.assertIn("offers are answered with WEBRTC_UNAVAILABLE", log)
        # Which reason depends on the child's installation, not this process's.
        self.assertTrue(
            "this process runs the PollReactor reactor; start the daemon with "
            "`twistd --reactor=asyncio rpmiddleware`"
            in log
            or 'install it with: pip install "rpmiddleware[webrtc]"' in log,
            log[-3000:],
        )
        self.assertIn("the turn is complete", log)
        self.assertNotIn("Traceback", log)
