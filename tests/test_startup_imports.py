"""
What an idle daemon has imported: C{twistd rpmiddleware}'s start-up, in a
child process (tests/idle_daemon.py) so that nothing this test run imported
counts, loads none of the libraries it needs only for some work, and the
work that needs them still does it when it comes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runChild(cwd: str) -> dict[str, Any]:
    """
    Run tests/idle_daemon.py; its reports, merged.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TOP, env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "tests.idle_daemon"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    reports: dict[str, Any] = {}
    for line in result.stdout.splitlines():
        reports.update(json.loads(line))
    if result.returncode or "failed" in reports or "afterTurn" not in reports:
        raise AssertionError(
            f"the child failed ({result.returncode}): {reports.get('failed', '')}"
            f"{result.stderr[-3000:]}"
        )
    return reports


class StartupImportTests(SynchronousTestCase):
    def test_audioLibrariesImportedWhenEngineComes(self) -> None:
        """
        The started daemon has not imported numpy or soxr (nor aiortc,
        jsonschema or treq); a client's recording and the reply's speech
        are then converted as always (48 kHz stereo to RPEngine's 16 kHz
        mono, RPEngine's 44.1 kHz to the client's 24 kHz, every sample
        accounted for), L{rpmiddleware.audio.pcm} imported when RPEngine's session
        started.
        """
        folder = self.mktemp()
        os.makedirs(folder)
        reports = runChild(folder)
        self.assertEqual(reports["atStart"], [])
        self.assertEqual(reports["ended"], "reply-complete")
        self.assertEqual(reports["toEngine"], ["pcm_s16le", 16000, 1])
        self.assertEqual(reports["rates"], [24000])
        self.assertGreater(reports["samples"], 0)
        self.assertEqual(reports["samples"], reports["expected"])
        # A client alone does not need them; RPEngine's session starting
        # imports them, ahead of any request.
        self.assertNotIn("rpmiddleware.audio.pcm", reports["beforeEngine"])
        self.assertIn("rpmiddleware.audio.pcm", reports["afterEngine"])
        self.assertIn("rpmiddleware.audio.pcm", reports["afterTurn"])
        self.assertIn("soxr", reports["afterTurn"])
