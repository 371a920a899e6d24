"""
The stress command's exit status, which CI relies on to fail when a check of
the stress run fails.
"""

from __future__ import annotations

import os
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The verdict given inside task.react, as python -m bench stress gives it.
SCRIPT = """
import sys
from twisted.internet import defer, task
from bench.__main__ import concluded
task.react(lambda reactor: defer.maybeDeferred(concluded, sys.argv[1:]))
"""


def verdict(*failed: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *failed],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


class VerdictTests(SynchronousTestCase):
    def test_failedRunExitsNonZero(self) -> None:
        """
        A stress run whose books do not balance ends the process with status
        1 and says what failed.
        """
        result = verdict("load: 999 of 1000 turns completed")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("STRESS FAILED", result.stdout)
        self.assertIn("999 of 1000", result.stdout)

    def test_passedRunExitsZero(self) -> None:
        result = verdict()
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("stress ok", result.stdout)
