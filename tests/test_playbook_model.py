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

from rpmiddleware.builtin.playbook.model import Matcher, PlaybookError, Rule
from rpmiddleware.builtin.playbook.parser import loadPlaybookFile, parsePlaybook, parseText
from rpmiddleware.builtin.playbook.tools import FunctionTool
from rpmiddleware.protocol.rules import INTERACTION_MODES, checkPromptContext

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
                "promptDirective": {
                    "sceneContext": "An inn.",
                    "autoEventGuide": "React.",
                    "directUserGuide": "Be a.",
                },
                "transitions": [
                    {"on": "player", "keywords": ["go"], "to": "b", "tools": ["give"]},
                ],
            },
            "b": {
                "promptDirective": {
                    "sceneContext": "The cellar.",
                    "autoEventGuide": "Jump.",
                    "directUserGuide": "Be b.",
                },
                "tools": ["give"],
                "transitions": [],
            },
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
        self.assertIn("Rusty Anchor", greeting.promptDirective["sceneContext"])
        self.assertEqual(
            greeting.promptScene,
            {
                "kind": "greeting",
                "family": "quest-giver",
                "label": "Small talk; Mira only hints that she needs help.",
                "sceneLine": "The Rusty Anchor, a riverside inn, on a rainy evening.",
                "priority": 0,
            },
        )
        self.assertEqual(
            set(greeting.promptDirective),
            {
                "protocolVersion",
                "promptVersion",
                "sceneContext",
                "autoEventGuide",
                "directUserGuide",
            },
        )
        self.assertEqual(greeting.promptDirective["protocolVersion"], 1)
        self.assertEqual([r.on for r in greeting.rules], ["player", "idle"])
        self.assertEqual(greeting.rules[1].after, 20.0)
        self.assertEqual(greeting.rules[1].limit, 2)

    def test_everyStageIsWhole(self) -> None:
        """
        Every stage of the example gives RPEngine a whole prompt context in
        either mode, and its own guide for each.
        """
        playbook = loadPlaybookFile(EXAMPLE, {})
        for stage in playbook.stages.values():
            for mode in INTERACTION_MODES:
                context = stage.promptContext(mode)
                assert context is not None
                checkPromptContext({"type": "reply.request", **context})
        guides = {s.promptDirective["directUserGuide"] for s in playbook.stages.values()}
        self.assertEqual(len(guides), len(playbook.stages), "each stage its own guide")

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
        """
        The defaults are merged into every stage, the stage winning key by
        key, and what neither writes is derived: kind from the stage id,
        family from the playbook's name, label from the stage's description
        (else its id), sceneLine from sceneContext's first line, priority 0,
        protocolVersion 1, and no promptVersion.
        """
        document = minimal()
        document["defaults"] = {
            "promptScene": {"family": "tavern", "priority": 2},
            "promptDirective": {"sceneContext": "An inn.\nRain.", "autoEventGuide": "React."},
            "voice": "M2",
        }
        document["stages"]["a"]["promptDirective"] = {"directUserGuide": "Be a."}
        document["stages"]["b"]["voice"] = "F3"
        document["stages"]["b"]["description"] = "\n  The cellar, below.\nDark."
        document["stages"]["b"]["promptScene"] = {"sceneLine": "The cellar.", "priority": 1.5}
        document["stages"]["b"]["promptDirective"] = {
            "directUserGuide": "Be b.",
            "protocolVersion": 3,
            "promptVersion": "v9",
        }
        playbook = parsePlaybook(document, {})
        a, b = playbook.stage("a"), playbook.stage("b")
        self.assertEqual(
            a.promptScene,
            {"kind": "a", "family": "tavern", "label": "a", "sceneLine": "An inn.", "priority": 2},
        )
        self.assertEqual(
            a.promptDirective,
            {
                "protocolVersion": 1,
                "sceneContext": "An inn.\nRain.",
                "autoEventGuide": "React.",
                "directUserGuide": "Be a.",
            },
        )
        self.assertEqual((a.voice, b.voice), ("M2", "F3"))
        self.assertEqual(
            b.promptScene,
            {
                "kind": "b",
                "family": "tavern",
                "label": "The cellar, below.",
                "sceneLine": "The cellar.",
                "priority": 1.5,
            },
        )
        self.assertEqual(
            b.promptDirective,
            {
                "protocolVersion": 3,
                "promptVersion": "v9",
                "sceneContext": "An inn.\nRain.",
                "autoEventGuide": "React.",
                "directUserGuide": "Be b.",
            },
        )

    def test_sceneContextFromSceneLine(self) -> None:
        document = minimal()
        del document["stages"]["a"]["promptDirective"]["sceneContext"]
        document["stages"]["a"]["promptScene"] = {"sceneLine": "A quiet inn."}
        stage = parsePlaybook(document, {}).stage("a")
        self.assertEqual(stage.promptDirective["sceneContext"], "A quiet inn.")
        self.assertEqual(stage.promptScene["family"], "t")

    def test_noPromptContext(self) -> None:
        """
        A playbook that writes no prompt field at all gives its stages no
        prompt context: its requests carry none of theirs.
        """
        document = minimal()
        for stage in document["stages"].values():
            del stage["promptDirective"]
        stage = parsePlaybook(document, {}).stage("a")
        self.assertFalse(stage.hasPrompt)
        self.assertIsNone(stage.promptContext("direct_user"))

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
            "known: autoEventGuide, directUserGuide, promptVersion, protocolVersion, sceneContext",
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

    def test_promptFields(self) -> None:
        """
        Each prompt field is checked for RPEngine's type, and a field in
        the other table (the old shape's promptScene.sceneContext) is named
        with where it belongs.
        """

        def scene(**fields: Any) -> dict[str, Any]:
            return self.broken(lambda d: d["stages"]["b"].update(promptScene=fields))

        def directive(**fields: Any) -> dict[str, Any]:
            return self.broken(lambda d: d["stages"]["b"]["promptDirective"].update(fields))

        cases: list[tuple[dict[str, Any], list[str]]] = [
            (
                scene(sceneContext="The cellar."),
                ["field promptScene.sceneContext", "belongs in promptDirective"],
            ),
            (
                directive(sceneLine="x"),
                ["field promptDirective.sceneLine", "belongs in promptScene"],
            ),
            (scene(mood="grim"), ["field promptScene.mood", "unknown field", "kind, label"]),
            (scene(kind=5), ["field promptScene.kind", "must be a string"]),
            (scene(label="  "), ["field promptScene.label", "must not be empty"]),
            (scene(sceneLine=""), ["field promptScene.sceneLine", "must not be empty"]),
            (scene(priority="high"), ["field promptScene.priority", "finite number"]),
            (scene(priority=True), ["field promptScene.priority", "finite number"]),
            (scene(priority=float("inf")), ["field promptScene.priority", "finite number"]),
            (directive(protocolVersion=0), ["field promptDirective.protocolVersion", "at least 1"]),
            (directive(protocolVersion=1.0), ["promptDirective.protocolVersion", "whole number"]),
            (directive(promptVersion=" "), ["field promptDirective.promptVersion", "not be empty"]),
            (directive(autoEventGuide="\n"), ["field promptDirective.autoEventGuide", "empty"]),
            (directive(directUserGuide=None), ["promptDirective.directUserGuide", "a string"]),
        ]
        for document, words in cases:
            error = self.assertRefused(document, "stage 'b'", *words)
            self.assertEqual(error.stage, "b")
        self.assertRefused(
            self.broken(lambda d: d.update(defaults={"promptScene": {"sceneContext": "x"}})),
            "field defaults.promptScene.sceneContext",
            "belongs in promptDirective",
        )

    def test_incompleteStage(self) -> None:
        """
        A stage whose merged prompt context would still be incomplete is
        refused when the playbook is loaded, naming the stage and the field
        missing; so is a stage with no prompt context in a playbook whose
        other stages have one.
        """
        for key in ("sceneContext", "autoEventGuide", "directUserGuide"):
            error = self.assertRefused(
                self.broken(lambda d, key=key: d["stages"]["b"]["promptDirective"].pop(key)),
                "playbook 't', stage 'b'",
                f"field promptDirective.{key}: is missing",
                "RPEngine refuses",
            )
            self.assertEqual((error.stage, error.field), ("b", f"promptDirective.{key}"))
        error = self.assertRefused(
            self.broken(lambda d: d["stages"]["b"].pop("promptDirective")),
            "stage 'b'",
            "field promptDirective.sceneContext: is missing",
        )
        self.assertEqual(error.field, "promptDirective.sceneContext")
        # The defaults can supply what a stage leaves out.
        document = self.broken(lambda d: d["stages"]["b"]["promptDirective"].pop("autoEventGuide"))
        document["defaults"] = {"promptDirective": {"autoEventGuide": "Shrug."}}
        self.assertEqual(
            parsePlaybook(document, {}).stage("b").promptDirective["autoEventGuide"], "Shrug."
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
