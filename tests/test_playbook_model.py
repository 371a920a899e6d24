"""
Playbooks are checked whole when they are loaded, and a mistake names the
stage and the field: the example loads, and every kind of mistake is refused.
"""

from __future__ import annotations

import copy
import datetime
import json
from importlib import resources
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from plugins.playbook_model import (
    Matcher,
    PlaybookError,
    Rule,
    loadPlaybookFile,
    parsePlaybook,
    parseText,
)
from plugins.playbook_tools import FunctionTool

TOP = Path(__file__).resolve().parent.parent
EXAMPLE = TOP / "docs" / "examples" / "quest-giver.toml"


def minimal() -> dict[str, Any]:
    """
    A small valid playbook to break one field at a time.
    """
    return {
        "name": "t",
        "tools": {"give": {"runBy": "client"}},
        "stages": {
            "a": {
                "promptDirective": {"directUserGuide": "Be a."},
                "transitions": [
                    {"on": "player", "keywords": ["go"], "to": "b", "tools": ["give"]},
                ],
            },
            "b": {"tools": ["give"], "transitions": []},
        },
    }


class ExampleTests(SynchronousTestCase):
    def test_exampleLoads(self) -> None:
        playbook = loadPlaybookFile(EXAMPLE, {})
        self.assertEqual(playbook.name, "quest-giver")
        self.assertEqual(playbook.initial, "greeting")
        self.assertEqual(
            list(playbook.stages), ["greeting", "offer", "accepted", "refused", "rewarded"]
        )
        self.assertEqual(playbook.tools["give_quest"].runBy, "client")
        self.assertEqual(playbook.tools["give_quest"].timeout, 15.0)
        greeting = playbook.stage("greeting")
        self.assertIn("Rusty Anchor", greeting.promptScene["sceneContext"])
        self.assertEqual(set(greeting.promptDirective), {"directUserGuide", "autoEventGuide"})
        self.assertEqual([r.on for r in greeting.rules], ["player", "idle"])
        self.assertEqual(greeting.rules[1].after, 20.0)
        self.assertEqual(greeting.rules[1].limit, 2)

    def test_packagedCopyIsTheSame(self) -> None:
        """
        C{--demo} plays the packaged copy; it must be the documented one.
        """
        packaged = resources.files("rpmiddleware").joinpath("data/quest-giver.toml").read_text()
        self.assertEqual(packaged, EXAMPLE.read_text())

    def test_jsonEqualsToml(self) -> None:
        document = parseText(EXAMPLE.read_text(), "toml", "example")
        path = Path(self.mktemp() + ".json")
        path.write_text(json.dumps(document))
        self.assertEqual(loadPlaybookFile(path, {}), loadPlaybookFile(EXAMPLE, {}))


class DefaultsTests(SynchronousTestCase):
    def test_initialIsTheFirstStage(self) -> None:
        self.assertEqual(parsePlaybook(minimal(), {}).initial, "a")

    def test_defaultsMergeIntoStages(self) -> None:
        document = minimal()
        document["defaults"] = {
            "promptScene": {"sceneContext": "An inn."},
            "promptDirective": {"autoEventGuide": "React."},
            "voice": "M2",
        }
        document["stages"]["b"]["voice"] = "F3"
        document["stages"]["b"]["promptScene"] = {"sceneContext": "The cellar."}
        playbook = parsePlaybook(document, {})
        a, b = playbook.stage("a"), playbook.stage("b")
        self.assertEqual(a.promptScene, {"sceneContext": "An inn."})
        self.assertEqual(
            a.promptDirective, {"autoEventGuide": "React.", "directUserGuide": "Be a."}
        )
        self.assertEqual((a.voice, b.voice), ("M2", "F3"))
        self.assertEqual(b.promptScene, {"sceneContext": "The cellar."})

    def test_middlewareTool(self) -> None:
        """
        A tool a plugin provides needs no declaration, and keeps its timeout.
        """
        tool = FunctionTool("lookup", lambda arguments, call: 1, timeout=3.0)
        document = minimal()
        document["stages"]["b"]["tools"] = ["lookup"]
        document["stages"]["a"]["transitions"][0]["tools"] = ["lookup"]
        playbook = parsePlaybook(document, {"lookup": tool})
        self.assertEqual(playbook.tools["lookup"].runBy, "middleware")
        self.assertEqual(playbook.tools["lookup"].timeout, 3.0)

    def test_toolUseArguments(self) -> None:
        document = minimal()
        document["stages"]["a"]["transitions"][0]["tools"] = [
            {"name": "give", "arguments": {"id": "q1", "n": [1, 2]}}
        ]
        rule = parsePlaybook(document, {}).stage("a").rules[0]
        self.assertEqual(rule.tools[0].name, "give")
        self.assertEqual(rule.tools[0].arguments, {"id": "q1", "n": [1, 2]})


class RefusalTests(SynchronousTestCase):
    """
    Each mistake is refused at load time with the stage and field named.
    """

    def assertRefused(self, document: Any, *words: str, tools: Any = None) -> PlaybookError:
        with self.assertRaises(PlaybookError) as caught:
            parsePlaybook(document, tools or {})
        for word in words:
            self.assertIn(word, str(caught.exception))
        return caught.exception

    def broken(self, change: Any) -> dict[str, Any]:
        document = minimal()
        change(document)
        return document

    def test_topLevel(self) -> None:
        self.assertRefused(
            self.broken(lambda d: d.update(stagez={})), "playbook 't'", "field stagez", "unknown"
        )
        self.assertRefused(self.broken(lambda d: d.pop("stages")), "field stages", "at least one")
        self.assertRefused(
            self.broken(lambda d: d.update(initial="zz")), "field initial", "'zz' is not a stage"
        )
        self.assertRefused(self.broken(lambda d: d.update(version=2)), "field version")
        self.assertRefused(self.broken(lambda d: d.update(defaults=[])), "field defaults")

    def test_stageIds(self) -> None:
        error = self.assertRefused(
            self.broken(lambda d: d["stages"].update({"bad id": {}})), "field stages.bad id"
        )
        self.assertEqual(error.field, "stages.bad id")

    def test_stageFields(self) -> None:
        error = self.assertRefused(
            self.broken(lambda d: d["stages"]["a"].update(promptDirectve={})),
            "stage 'a'",
            "field promptDirectve",
            "unknown field",
        )
        self.assertEqual((error.playbook, error.stage), ("t", "a"))
        self.assertRefused(
            self.broken(lambda d: d["stages"]["a"]["promptDirective"].update(directUserGide="x")),
            "stage 'a'",
            "field promptDirective.directUserGide",
            "known: autoEventGuide, directUserGuide",
        )
        self.assertRefused(
            self.broken(lambda d: d["stages"]["b"].update(promptScene={"sceneContext": 5})),
            "stage 'b'",
            "field promptScene.sceneContext",
            "must be a string",
        )
        self.assertRefused(
            self.broken(lambda d: d["stages"]["b"].update(voice="Q9")),
            "stage 'b'",
            "field voice",
            "F1-F5, M1-M5",
        )
        self.assertRefused(
            self.broken(lambda d: d["stages"]["b"].update(transitions={})),
            "stage 'b'",
            "field transitions",
        )
        self.assertRefused(
            self.broken(lambda d: d["stages"]["b"].update(tools=["nope"])),
            "stage 'b'",
            "field tools[0]",
            "unknown tool 'nope'",
        )

    def rule(self, **fields: Any) -> dict[str, Any]:
        def change(d: dict[str, Any]) -> None:
            d["stages"]["a"]["transitions"] = [fields]

        return self.broken(change)

    def test_rules(self) -> None:
        cases: list[tuple[dict[str, Any], list[str]]] = [
            ({"to": "b"}, ["field transitions[0].on", "must be one of player, reply"]),
            ({"on": "ladder", "to": "b"}, ["field transitions[0].on", "'ladder'"]),
            ({"on": "player", "keywords": ["x"], "to": "zz"}, ["transitions[0].to", "'zz'"]),
            ({"on": "player", "to": "b"}, ["field transitions[0]", "needs keywords or regex"]),
            ({"on": "reply", "regex": "(", "to": "b"}, ["transitions[0].regex[0]", "regular"]),
            ({"on": "player", "keywords": [], "to": "b"}, ["transitions[0].keywords"]),
            ({"on": "player", "keywords": "x", "after": 3}, ["transitions[0].after", "unknown"]),
            ({"on": "idle"}, ["field transitions[0]", "needs after"]),
            ({"on": "idle", "after": -1}, ["transitions[0].after", "more than 0"]),
            ({"on": "idle", "after": "soon"}, ["transitions[0].after", "must be a number"]),
            ({"on": "turns", "count": 0}, ["transitions[0].count", "at least 1"]),
            ({"on": "turns", "count": 1.5}, ["transitions[0].count", "whole number"]),
            ({"on": "tool"}, ["field transitions[0]", "needs tool"]),
            ({"on": "tool", "tool": "nope"}, ["transitions[0].tool", "unknown tool 'nope'"]),
            ({"on": "tool", "tool": "give", "outcome": "meh"}, ["transitions[0].outcome"]),
            ({"on": "event", "limit": 0}, ["transitions[0].limit", "at least 1"]),
            ({"on": "event", "say": 5}, ["transitions[0].say", "must be a string"]),
            ({"on": "event", "tools": "give"}, ["transitions[0].tools", "must be a list"]),
            (
                {"on": "event", "tools": ["give"]},
                ["transitions[0].tools[0].name", "may not run in stage 'a'"],
            ),
            (
                {"on": "event", "to": "b", "tools": [{"name": "give", "args": {}}]},
                ["transitions[0].tools[0].args", "unknown field"],
            ),
            (
                {"on": "event", "to": "b", "tools": [{"name": "give", "arguments": []}]},
                ["transitions[0].tools[0].arguments", "must be a table"],
            ),
            (
                {
                    "on": "event",
                    "to": "b",
                    "tools": [{"name": "give", "arguments": {"when": datetime.date(2026, 1, 1)}}],
                },
                ["transitions[0].tools[0].arguments.when", "must be JSON"],
            ),
        ]
        for fields, words in cases:
            error = self.assertRefused(self.rule(**fields), "stage 'a'", *words)
            self.assertEqual(error.stage, "a", fields)

    def test_tools(self) -> None:
        self.assertRefused(
            self.broken(lambda d: d["tools"]["give"].update(runBy="server")),
            "field tools.give.runBy",
        )
        self.assertRefused(
            self.broken(lambda d: d["tools"]["give"].update(runBy="middleware")),
            "field tools.give.runBy",
            "no plugin provides a tool 'give'",
        )
        self.assertRefused(
            self.broken(lambda d: d["tools"]["give"].update(timeout=0)),
            "field tools.give.timeout",
        )
        self.assertRefused(
            self.broken(lambda d: d["tools"]["give"].update(secret=1)),
            "field tools.give.secret",
        )

    def test_notATable(self) -> None:
        self.assertRefused(self.broken(lambda d: d["stages"].update(a=[])), "stage 'a'", "table")

    def test_unchangedInput(self) -> None:
        """
        Parsing keeps no reference to the document: a client changing its
        copy later changes nothing.
        """
        document = minimal()
        before = copy.deepcopy(document)
        playbook = parsePlaybook(document, {})
        self.assertEqual(document, before)
        document["stages"]["a"]["promptDirective"]["directUserGuide"] = "changed"
        self.assertEqual(playbook.stage("a").promptDirective["directUserGuide"], "Be a.")


class FileTests(SynchronousTestCase):
    def test_missing(self) -> None:
        with self.assertRaises(PlaybookError) as caught:
            loadPlaybookFile(Path(self.mktemp()), {})
        self.assertIn("does not exist", str(caught.exception))

    def test_notToml(self) -> None:
        path = Path(self.mktemp() + ".toml")
        path.write_text("stages = [\n")
        with self.assertRaises(PlaybookError) as caught:
            loadPlaybookFile(path, {})
        self.assertIn("is not valid TOML", str(caught.exception))

    def test_nameFromFile(self) -> None:
        path = Path(self.mktemp()).with_name("innkeeper.json")
        document = minimal()
        del document["name"]
        path.write_text(json.dumps(document))
        self.assertEqual(loadPlaybookFile(path, {}).name, "innkeeper")


class MatcherTests(SynchronousTestCase):
    def matcher(self, keywords: tuple[str, ...] = (), regex: tuple[str, ...] = ()) -> Matcher:
        import re

        return Matcher.of(keywords, tuple(re.compile(r, re.IGNORECASE) for r in regex))

    def test_keywordsAreWholeWords(self) -> None:
        m = self.matcher(("no", "I'll do it"))
        self.assertEqual(m.find("No, thanks."), 'said "no"')
        self.assertIsNone(m.find("I know the road"))
        self.assertIsNone(m.find("nothing"))
        self.assertEqual(m.find("Fine, i'll   DO it!"), 'said "I\'ll do it"')
        self.assertEqual(m.find("Fine, I\u2019ll do it"), 'said "I\'ll do it"')

    def test_regex(self) -> None:
        m = self.matcher(regex=(r"\bquests?\b",))
        self.assertEqual(m.find("Any QUESTS?"), r"matched /\bquests?\b/")
        self.assertIsNone(m.find("a questionable idea"))

    def test_resultSubset(self) -> None:
        rule = Rule("a", 0, "tool", "b", tool="t", result={"ok": True, "item": {"id": 1}})
        self.assertTrue(rule.resultMatches({"ok": True, "item": {"id": 1, "n": 2}, "x": 0}))
        self.assertFalse(rule.resultMatches({"ok": 1, "item": {"id": 1}}))
        self.assertFalse(rule.resultMatches({"ok": True}))
        self.assertFalse(rule.resultMatches("ok"))
        self.assertTrue(Rule("a", 0, "tool", "b", tool="t").resultMatches(None))
