"""
python -m bench's report: one section run alone replaces only its part of
docs/benchmarks.md, and a section's missing extra is found before anything
runs.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from bench import __main__ as cli
from bench.common import Section


def section(source: str, title: str, goal: str, met: bool = True) -> Section:
    made = Section(title, f"{title} body", [(goal, "1.0x", met)])
    made.source = source
    made.measured = "2026-12-05 10:00"
    return made


class ReportTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.patch(cli, "machine", lambda: "a test machine")
        self.patch(cli, "loadAverage", lambda: "0.00")

    def written(self, sections: list[Section], output: str) -> str:
        text = cli.writeReport(
            sections, False, "2026-12-05 10:00", "0.00", cli.previousReport(output)
        )
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
        return text

    def test_oneSectionKeepsTheOthers(self) -> None:
        """
        Running one section keeps every other section and its goals from the
        earlier report, in the benchmarks' order, and says which are older.
        """
        output = self.mktemp()
        hop = section("hop", "Hop", "hop goal")
        load = section("load", "Load", "load goal", met=False)
        self.written([hop, load], output)
        newer = section("load", "Load", "load goal, again")
        text = self.written([newer], output)
        self.assertIn("| hop | hop goal | 1.0x | yes |", text)
        self.assertIn("| load | load goal, again | 1.0x | yes |", text)
        self.assertNotIn("| load | load goal | 1.0x |", text)
        self.assertLess(text.index("## Hop"), text.index("## Load"))
        self.assertEqual(text.count("## Load"), 1)
        self.assertIn("the sections hop are from an earlier run", text)

    def test_figuresTable(self) -> None:
        """
        A section's figures make issue 20's table, with the ratio to the relay.
        """
        output = self.mktemp()
        hop = section("hop", "Hop", "hop goal")
        hop.figures = {"text hop p50": (200.0, 230.0, "us")}
        text = self.written([hop], output)
        self.assertIn("| hop | text hop p50 | 200 us | 230 us | 1.15x |", text)
        load = section("load", "Load", "load goal")
        load.figures = {"CPU": (20.0, 30.0, "%")}
        text = self.written([load], output)
        self.assertIn("| hop | text hop p50 | 200 us | 230 us | 1.15x |", text)
        self.assertIn("| load | CPU | 20 % | 30 % | 1.50x |", text)

    def test_tablesOfSectionsAreNotGoals(self) -> None:
        """
        A section's own four-column table whose first cell names a benchmark
        is not taken for a goal.
        """
        output = self.mktemp()
        mailbox = section("mailbox", "Mailbox", "mailbox goal")
        mailbox.body = "| hop | WebSocket p50 | inotify | polling |\n|---|---:|---:|---:|"
        self.written([mailbox], output)
        text = self.written([section("prompt", "Prompt", "prompt goal")], output)
        goals = text[text.index("## Goals") : text.index("## Mailbox")]
        self.assertNotIn("WebSocket p50", goals)

    def test_runningSectionsNamed(self) -> None:
        """
        While a run goes on, the report names the sections still to come.
        """
        text = cli.writeReport(
            [section("hop", "Hop", "g")], False, "now", "0.00", ([], [], []), ["load", "cards"]
        )
        self.assertIn("**Still running: load, cards**", text)

    def test_sectionsToComeKeptUntilReplaced(self) -> None:
        """
        A run that stops part way (a section fails) leaves the earlier
        results of the sections it did not reach in the file.
        """
        output = self.mktemp()
        self.written(
            [section("hop", "Hop", "old hop"), section("cards", "Cards", "old cards")], output
        )
        text = cli.writeReport(
            [section("hop", "Hop", "new hop")],
            False,
            "now",
            "0.00",
            cli.previousReport(output),
            ["cards"],
        )
        self.assertIn("| cards | old cards | 1.0x | yes |", text)
        self.assertIn("## Cards", text)
        self.assertNotIn("old hop", text)


class NeedsTests(SynchronousTestCase):
    def test_missingExtraNamed(self) -> None:
        """
        A section whose module is not installed is named with the pip
        command that installs it; one with nothing missing is not.
        """
        real = importlib.util.find_spec

        def findSpec(name: str, *args: Any) -> Any:
            return None if name == "scipy" else real(name, *args)

        self.patch(importlib.util, "find_spec", findSpec)
        self.assertEqual(cli.missing(["hop", "load"]), [])
        [problem] = cli.missing(["hop", "resample"])
        self.assertIn("scipy", problem)
        self.assertIn('pip install ".[bench]"', problem)
