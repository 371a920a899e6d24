"""
The console in headless Chromium against C{twistd rpmiddleware --demo}.

The browser session runs once, in a child process (C{tests/console_browser.py}
starts the daemon, Chromium and a page on another port, and reports each
check as a line of JSON); each test here reads its check.  Nothing of the
browser or Playwright runs in trial's process, so its reactor stays clean.

Needs Debian's Chromium at /usr/bin/chromium and the playwright package
(never a browser Playwright downloads); skipped with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from tests.console_browser import CHROMIUM, TOP

#: The whole browser session takes about 30 s; past this it has hung.
SESSION_TIMEOUT = 150


def _whyNot() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright)"
    return None


_results: dict[str, dict[str, Any]] | None = None
_problem: str | None = None


def results() -> dict[str, dict[str, Any]]:
    """
    Every check of the one browser session, by name (run on first use).
    """
    global _results, _problem
    if _results is None and _problem is None:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "tests.console_browser"],
                cwd=TOP,
                capture_output=True,
                text=True,
                timeout=SESSION_TIMEOUT,
            )
        except subprocess.TimeoutExpired as e:
            _problem = f"the browser session took over {SESSION_TIMEOUT} s: {e.stdout!r}"[-6000:]
        else:
            lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            _results = {r["check"]: r for r in lines if "check" in r}
            if not any(r.get("done") for r in lines):
                _problem = (
                    f"the browser session ended early (exit {done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
    if _problem is not None:
        raise AssertionError(_problem)
    assert _results is not None
    return _results


class ConsoleInBrowserTests(SynchronousTestCase):
    skip = _whyNot()

    def check(self, name: str) -> Any:
        found = results()
        daemon = found.get("daemon")
        if daemon is not None and not daemon["ok"]:
            self.fail(f"twistd rpmiddleware --demo did not start:\n{daemon['detail']}")
        result = found.get(name)
        self.assertIsNotNone(result, f"check {name!r} did not run: {sorted(found)}")
        assert result is not None
        if not result["ok"]:
            self.fail(
                f"{name}: {result['detail']}\npage errors: {result.get('pageErrors')}\n"
                f"daemon log:\n{result.get('daemon', '')}"
            )
        return result["detail"]

    def test_status(self) -> None:
        """
        The status shows RPEngine connected, its link with the real port,
        the capacity as the status message has it, and the chain.
        """
        detail = self.check("status")
        self.assertEqual(detail["engine"], "Connected")
        # RPEngine's queue limit (app.rs QUEUE_LIMIT), as the simulated RPEngine reports it.
        self.assertEqual(detail["limit"], "20")
        builtIn = ["moderation", "audio-resample", "capacity-gate", "card-cache"]
        self.assertEqual([name for name in detail["plugins"] if name in builtIn], builtIn)

    def test_scene(self) -> None:
        """
        A scene's turn shows in the turns table with who spoke, in order
        (the guard answered, the innkeeper reacted), and the cast on hover.
        """
        detail = self.check("scene")
        self.assertEqual(detail["lines"], ["Garrick", "Mara"])
        self.assertEqual(detail["cell"]["title"], "scene north-gate: Garrick, Mara")

    def test_localhost(self) -> None:
        """
        The console served as http://localhost:PORT connects too.
        """
        self.check("localhost")

    def test_jsonCard(self) -> None:
        self.assertIn("from a JSON card", self.check("json card")["cardState"])

    def test_pngCard(self) -> None:
        self.assertIn("from a PNG card", self.check("png card")["cardState"])

    def test_brokenCards(self) -> None:
        """
        A PNG without a card, a V3 card, a V1 card (found by the page) and a
        V2 card missing a field (refused by the middleware) each show their
        error, and the card loaded before stays.
        """
        errors = [e["error"] for e in self.check("broken cards")]
        self.assertIn("no character card", errors[0])
        self.assertIn("Character Card V3", errors[1])
        self.assertIn("V1", errors[2])
        self.assertIn("data.first_mes", errors[3])

    def test_typedTurn(self) -> None:
        """
        A typed turn streams its text into the page, and the AudioContext
        is given buffers of exactly the reply's speech, scheduled gap-free.
        """
        detail = self.check("typed turn")
        self.assertEqual(detail["seconds"], detail["expected"])
        self.assertGreater(detail["chunks"], 1)

    def test_cancel(self) -> None:
        """
        Cancel stops what is scheduled, and no text or audio of the turn
        follows.
        """
        detail = self.check("cancel")
        self.assertGreaterEqual(detail["stops"], 1)

    def test_microphone(self) -> None:
        """
        Holding the talk button records Chromium's fake microphone, and the
        recording becomes an audio turn that RPEngine hears and answers.
        """
        detail = self.check("microphone")
        self.assertEqual(detail["outcome"], "completed")

    def test_otherOrigin(self) -> None:
        """
        A page from another loopback port cannot open /client/socket or
        /rp-engine/socket; the console's own origin opens /client/socket.
        """
        detail = self.check("other origin")
        self.assertEqual([a["opened"] for a in detail["elsewhere"]], [False, False])

    def test_metrics(self) -> None:
        self.check("metrics")

    def test_noPageErrors(self) -> None:
        self.check("page errors")

    def test_faceInStep(self) -> None:
        """
        Mid-sentence, with the audio clock stopped, the face shows what the
        line's marks give for that moment: the subtitle's sentence, the
        highlighted word, the mouth's viseme and openness, and the
        sentence's feeling (issue 35, part 4).
        """
        detail = self.check("face in step")
        self.assertEqual(detail["shown"][0]["text"], detail["expected"]["word"])
        self.assertEqual(detail["expected"]["feeling"], "fear")

    def test_faceInStepCountsCodePoints(self) -> None:
        """
        The same with a character outside the BMP before the word: the
        marks' offsets are code points, not UTF-16 units.
        """
        detail = self.check("face in step, astral")
        self.assertEqual(detail["shown"][0]["text"], detail["expected"]["word"])

    def test_faceByLoudness(self) -> None:
        """
        Without viseme marks the mouth opens with the voice's loudness and
        shuts in a pause.
        """
        detail = self.check("face by loudness")
        self.assertGreater(detail["voiced"]["open"], detail["silent"]["open"])

    def test_faceTurn(self) -> None:
        """
        A typed turn brings the page the line's sentence, word and viseme
        marks and its feelings, before its first speech.
        """
        detail = self.check("face turn")
        self.assertEqual(detail["kinds"], ["sentence", "viseme", "word"])
        self.assertTrue(detail["feelings"])
