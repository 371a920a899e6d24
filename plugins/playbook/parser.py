"""
Loading and checking a playbook.

A playbook is checked whole when it is loaded (a file named in the
configuration at start-up, or a client's C{playbook} message), so that a
mistake is reported once, naming the stage and the field, and never halfway
through a conversation: after loading, nothing in a playbook can be wrong.
C{docs/playbooks.md} is the reference for authors; this module is what
enforces it, and builds the immutable objects of
L{rpmiddleware.builtin.playbook.model}.

The checks are written out rather than declared as schemas
(L{rpmiddleware.protocol.schema}): most of them reach across the document (a
transition's target stage, the tools a stage allows, a middleware tool that
must exist, defaults merged into each stage and then checked whole with
RPEngine's prompt rules) or answer with what the author should write instead
(a field that belongs in promptDirective, the stages and tools there are).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rpmiddleware.builtin.playbook.model import (
    DEFAULT_DIRECTIVE_VERSION,
    DEFAULT_PRIORITY,
    DIRECTIVE_KEYS,
    DIRECTIVE_TEXT_KEYS,
    MAX_IDLE,
    MAX_NAME_CHARS,
    MAX_PATTERN_CHARS,
    MAX_PROMPT_CHARS,
    MAX_RULES,
    MAX_STAGES,
    MAX_TIMEOUT,
    MAX_TOOLS_PER_RULE,
    OUTCOMES,
    RUN_BY,
    SCENE_KEYS,
    TRIGGERS,
    Matcher,
    Playbook,
    PlaybookError,
    Rule,
    Stage,
    ToolSpec,
    ToolUse,
)
from rpmiddleware.plugin import INTERACTION_MODES, VOICES, EngineRefusal, checkPromptContext

_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_TOP_KEYS = frozenset({"name", "description", "version", "initial", "defaults", "stages", "tools"})
_STAGE_KEYS = frozenset(
    {"description", "promptScene", "promptDirective", "voice", "tools", "transitions"}
)
_DEFAULT_KEYS = frozenset({"promptScene", "promptDirective", "voice"})
_TOOL_KEYS = frozenset({"runBy", "timeout", "description"})
_RULE_COMMON = frozenset({"on", "to", "tools", "say", "limit", "reason"})
_RULE_KEYS: dict[str, frozenset[str]] = {
    "player": frozenset({"keywords", "regex"}),
    "reply": frozenset({"keywords", "regex"}),
    "event": frozenset({"keywords", "regex"}),
    "tool": frozenset({"tool", "outcome", "result", "keywords", "regex"}),
    "idle": frozenset({"after"}),
    "turns": frozenset({"count"}),
}


def loadPlaybookFile(path: str | Path, knownTools: Mapping[str, Any]) -> Playbook:
    """
    Read a playbook file: TOML unless its name ends in C{.json}.

    @param knownTools: the middleware's tools by name (L{ITool} providers).
    @raise PlaybookError: unreadable, not TOML/JSON, or not a valid playbook.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlaybookError(f"playbook file {path} does not exist")
    except (OSError, UnicodeDecodeError) as e:
        raise PlaybookError(f"cannot read playbook file {path}: {e}")
    kind = "json" if path.suffix.lower() == ".json" else "toml"
    document = parseText(text, kind, str(path))
    return parsePlaybook(document, knownTools, source=str(path), defaultName=path.stem)


def parseText(text: str, kind: str, source: str) -> dict[str, Any]:
    """
    A playbook document from TOML or JSON text.
    """
    try:
        document = tomllib.loads(text) if kind == "toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise PlaybookError(f"{source} is not valid {kind.upper()}: {e}")
    if not isinstance(document, dict):
        raise PlaybookError(f"{source}: a playbook must be a table (a JSON object)")
    return document


def parsePlaybook(
    document: Mapping[str, Any],
    knownTools: Mapping[str, Any],
    *,
    source: str = "client",
    defaultName: str = "playbook",
) -> Playbook:
    """
    Check a whole playbook document and build the L{Playbook}.

    @raise PlaybookError: naming the stage and field of the first problem.
    """
    return _Parser(document, knownTools, source, defaultName).parse()


def _firstLine(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


class _Parser:
    def __init__(
        self,
        document: Mapping[str, Any],
        knownTools: Mapping[str, Any],
        source: str,
        defaultName: str,
    ) -> None:
        self.document = document
        self.knownTools = knownTools
        self.source = source
        name = document.get("name", defaultName)
        self.name = name if isinstance(name, str) and name.strip() else defaultName
        self.stageId: str | None = None

    def fail(self, field: str | None, problem: str) -> PlaybookError:
        return PlaybookError(problem, playbook=self.name, stage=self.stageId, field=field)

    def parse(self) -> Playbook:
        doc = self.document
        self.unknown(doc, _TOP_KEYS, "")
        if "name" in doc:
            self.text(doc["name"], "name", limit=200)
        if doc.get("version", 1) != 1 or isinstance(doc.get("version"), bool):
            raise self.fail("version", "must be 1 (the only version of the format)")
        description = self.text(doc.get("description", ""), "description", empty=True)
        tools = self.toolSpecs(doc.get("tools", {}))
        defaults = doc.get("defaults", {})
        if not isinstance(defaults, dict):
            raise self.fail("defaults", f"must be a table, got {_kind(defaults)}")
        self.unknown(defaults, _DEFAULT_KEYS, "defaults.")
        baseScene = self.prompt(defaults.get("promptScene", {}), "defaults.promptScene")
        baseDirective = self.prompt(defaults.get("promptDirective", {}), "defaults.promptDirective")
        baseVoice = self.voice(defaults.get("voice"), "defaults.voice")
        stages = doc.get("stages")
        if not isinstance(stages, dict) or not stages:
            raise self.fail("stages", "a playbook needs at least one stage ([stages.ID] tables)")
        if len(stages) > MAX_STAGES:
            raise self.fail("stages", f"at most {MAX_STAGES} stages, got {len(stages)}")
        for stageId in stages:
            if not _ID.match(stageId):
                raise self.fail(
                    f"stages.{stageId}",
                    "a stage id is 1-64 letters, digits, '_', '.' or '-' (not starting with "
                    "'.' or '-')",
                )
        initial = doc.get("initial", next(iter(stages)))
        if not isinstance(initial, str) or initial not in stages:
            raise self.fail("initial", f"{initial!r} is not a stage (stages: {', '.join(stages)})")
        # First pass: each stage's own fields, so transitions can check targets' tools.
        shells: dict[str, dict[str, Any]] = {}
        for stageId, table in stages.items():
            self.stageId = stageId
            if not isinstance(table, dict):
                raise self.fail(None, f"a stage must be a table, got {_kind(table)}")
            self.unknown(table, _STAGE_KEYS, "")
            ownScene = self.prompt(table.get("promptScene", {}), "promptScene")
            ownDirective = self.prompt(table.get("promptDirective", {}), "promptDirective")
            voice = self.voice(table.get("voice"), "voice") or baseVoice
            allowed = self.stageTools(table.get("tools", []), tools)
            shells[stageId] = {
                "description": self.text(table.get("description", ""), "description", empty=True),
                "promptScene": {**baseScene, **ownScene},
                "promptDirective": {**baseDirective, **ownDirective},
                "voice": voice,
                "tools": allowed,
            }
        # A playbook gives every stage a complete prompt context, or none: a
        # stage left without one in a playbook that has them was forgotten.
        if any(shell["promptScene"] or shell["promptDirective"] for shell in shells.values()):
            for stageId, shell in shells.items():
                self.stageId = stageId
                self.completePrompt(
                    stageId, shell["description"], shell["promptScene"], shell["promptDirective"]
                )
        built: dict[str, Stage] = {}
        for stageId, table in stages.items():
            self.stageId = stageId
            rules = self.rules(table.get("transitions", []), stages, shells, tools)
            shell = shells[stageId]
            built[stageId] = Stage(
                id=stageId,
                promptScene=shell["promptScene"],
                promptDirective=shell["promptDirective"],
                voice=shell["voice"],
                tools=shell["tools"],
                rules=rules,
                description=shell["description"],
            )
        self.stageId = None
        return Playbook(self.name, initial, built, tools, description, self.source)

    # Pieces.

    def unknown(self, table: Mapping[str, Any], known: frozenset[str], prefix: str) -> None:
        for key in table:
            if key not in known:
                raise self.fail(
                    f"{prefix}{key}", f"unknown field (known: {', '.join(sorted(known))})"
                )

    def text(self, value: Any, where: str, *, empty: bool = False, limit: int = 2000) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, got {_kind(value)}")
        if not empty and not value.strip():
            raise self.fail(where, "must not be empty")
        if len(value) > limit:
            raise self.fail(where, f"is longer than {limit} characters")
        return value

    def prompt(self, value: Any, where: str) -> dict[str, Any]:
        """
        The fields a C{promptScene} or C{promptDirective} table writes, each
        checked for its type; whether together they make a prompt context is
        L{promptContext}'s to say, after the defaults are merged.
        """
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table, got {_kind(value)}")
        isScene = where.endswith("promptScene")
        known, elsewhere = (SCENE_KEYS, DIRECTIVE_KEYS) if isScene else (DIRECTIVE_KEYS, SCENE_KEYS)
        fields: dict[str, Any] = {}
        for key, v in value.items():
            at = f"{where}.{key}"
            if key in elsewhere and key not in known:
                other = "promptDirective" if isScene else "promptScene"
                raise self.fail(at, f"{key} belongs in {other}, as RPEngine reads it")
            if key not in known:
                raise self.fail(at, f"unknown field (known: {', '.join(sorted(known))})")
            if key == "priority":
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise self.fail(at, f"must be a finite number, got {_kind(v)}")
                fields[key] = v
            elif key == "protocolVersion":
                fields[key] = self.whole(v, at)
            else:
                # Not blank: RPEngine trims the guides and sceneContext
                # (prompt.rs, prompt_context), and a blank guide silently
                # drops the whole scene and guide from the prompt.
                prose = key in DIRECTIVE_TEXT_KEYS or key == "sceneLine"
                fields[key] = self.text(v, at, limit=MAX_PROMPT_CHARS if prose else MAX_NAME_CHARS)
        return fields

    def completePrompt(
        self, stageId: str, description: str, scene: dict[str, Any], directive: dict[str, Any]
    ) -> None:
        """
        Complete a stage's C{promptScene} and C{promptDirective} (what the
        stage and the defaults wrote) in place, deriving what may be left
        out.  The scene and both guides must be written: RPEngine refuses a
        request whose prompt context is partial
        (crates/rp-engine-core/src/json_core.rs, validate_prompt_context).

        @raise PlaybookError: naming the missing or refused field.
        """
        if "sceneContext" not in directive and "sceneLine" in scene:
            directive["sceneContext"] = scene["sceneLine"]
        if "sceneLine" not in scene and "sceneContext" in directive:
            scene["sceneLine"] = _firstLine(directive["sceneContext"])
        scene.setdefault("kind", stageId)
        scene.setdefault("family", self.name)
        scene.setdefault("label", _firstLine(description) or stageId)
        scene.setdefault("priority", DEFAULT_PRIORITY)
        directive.setdefault("protocolVersion", DEFAULT_DIRECTIVE_VERSION)
        missing = {
            "sceneContext": "the scene, in every request's prompt (or write promptScene.sceneLine)",
            "autoEventGuide": "how the character reacts in auto_event turns (game events, say)",
            "directUserGuide": "how the character answers the player in direct_user turns",
        }
        for key, what in missing.items():
            if key not in directive:
                raise self.fail(
                    f"promptDirective.{key}",
                    f"is missing: {what}. RPEngine refuses a request whose prompt context lacks "
                    f"it; write it in this stage or in [defaults.promptDirective]",
                )
        # RPEngine's own rules are the last word: a synthetic request of each
        # mode must pass them as it will be sent.
        for mode in INTERACTION_MODES:
            synthetic = {
                "type": "reply.request",
                "interactionMode": mode,
                "promptScene": scene,
                "promptDirective": directive,
            }
            try:
                checkPromptContext(synthetic)
            except EngineRefusal as e:
                raise self.fail(e.field, f"{e.problem} (RPEngine would refuse every request)")

    def voice(self, value: Any, where: str) -> str | None:
        if value is None:
            return None
        if value not in VOICES:
            raise self.fail(where, f"{value!r} is not a voice of RPEngine (F1-F5, M1-M5)")
        return str(value)

    def number(self, value: Any, where: str, low: float, high: float) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise self.fail(where, f"must be a number, got {_kind(value)}")
        if not low < value <= high:
            raise self.fail(where, f"must be more than {low:g} and at most {high:g}")
        return float(value)

    def whole(self, value: Any, where: str, low: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"must be a whole number, got {_kind(value)}")
        if value < low:
            raise self.fail(where, f"must be at least {low}")
        return value

    def json(self, value: Any, where: str, depth: int = 0) -> Any:
        """
        A copy of C{value} that is certain to be JSON (TOML has dates, which
        JSON does not).
        """
        if depth > 32:
            raise self.fail(where, "is nested too deeply")
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int | float):
            if isinstance(value, float) and not math.isfinite(value):
                raise self.fail(where, "must be a finite number")
            return value
        if isinstance(value, list):
            return [self.json(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): self.json(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
        raise self.fail(where, f"must be JSON (a string, number, boolean, list or table), got "
                        f"{_kind(value)}")  # fmt: skip

    def toolSpecs(self, table: Any) -> dict[str, ToolSpec]:
        if not isinstance(table, dict):
            raise self.fail("tools", f"must be a table of [tools.NAME], got {_kind(table)}")
        specs: dict[str, ToolSpec] = {}
        for name, spec in table.items():
            where = f"tools.{name}"
            if not _ID.match(name):
                raise self.fail(where, "a tool name is 1-64 letters, digits, '_', '.' or '-'")
            if not isinstance(spec, dict):
                raise self.fail(where, f"must be a table, got {_kind(spec)}")
            self.unknown(spec, _TOOL_KEYS, f"{where}.")
            runBy = spec.get("runBy", "client")
            if runBy not in RUN_BY:
                raise self.fail(f"{where}.runBy", f"must be one of {', '.join(RUN_BY)}")
            if runBy == "middleware" and name not in self.knownTools:
                raise self.fail(f"{where}.runBy", self.noSuchTool(name))
            timeout = spec.get("timeout")
            if timeout is not None:
                timeout = self.number(timeout, f"{where}.timeout", 0, MAX_TIMEOUT)
            description = self.text(spec.get("description", ""), f"{where}.description", empty=True)
            specs[name] = ToolSpec(name, runBy, timeout, description)
        return specs

    def noSuchTool(self, name: str) -> str:
        known = ", ".join(sorted(self.knownTools)) or "none"
        return (
            f"no plugin provides a tool {name!r} (tools of the middleware: {known}); a tool the "
            f'game runs is declared as [tools.{name}] with runBy = "client"'
        )

    def resolveTool(self, name: Any, where: str, tools: dict[str, ToolSpec]) -> str:
        """
        A tool name used somewhere: declared in [tools], or a middleware tool
        (added to C{tools} as such).
        """
        if not isinstance(name, str) or not name:
            raise self.fail(where, f"must be a tool name, got {_kind(name)}")
        if name in tools:
            return name
        if name in self.knownTools:
            tools[name] = ToolSpec(
                name, "middleware", getattr(self.knownTools[name], "timeout", None)
            )
            return name
        raise self.fail(where, f"unknown tool {name!r}: " + self.noSuchTool(name))

    def stageTools(self, value: Any, tools: dict[str, ToolSpec]) -> frozenset[str]:
        if not isinstance(value, list):
            raise self.fail("tools", f"must be a list of tool names, got {_kind(value)}")
        return frozenset(self.resolveTool(n, f"tools[{i}]", tools) for i, n in enumerate(value))

    def strings(self, value: Any, where: str) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise self.fail(where, "must be a string or a non-empty list of strings")
        out = []
        for i, item in enumerate(value):
            out.append(self.text(item, f"{where}[{i}]", limit=MAX_PATTERN_CHARS))
        return tuple(out)

    def matcher(self, rule: Mapping[str, Any], where: str) -> Matcher:
        keywords = self.strings(rule["keywords"], f"{where}.keywords") if "keywords" in rule else ()
        patterns = []
        if "regex" in rule:
            for i, source in enumerate(self.strings(rule["regex"], f"{where}.regex")):
                try:
                    patterns.append(re.compile(source, re.IGNORECASE))
                except re.error as e:
                    raise self.fail(f"{where}.regex[{i}]", f"not a valid regular expression: {e}")
        return Matcher.of(keywords, tuple(patterns))

    def rules(
        self,
        value: Any,
        stages: Mapping[str, Any],
        shells: Mapping[str, dict[str, Any]],
        tools: dict[str, ToolSpec],
    ) -> tuple[Rule, ...]:
        if not isinstance(value, list):
            raise self.fail("transitions", f"must be a list of tables, got {_kind(value)}")
        if len(value) > MAX_RULES:
            raise self.fail("transitions", f"at most {MAX_RULES} per stage, got {len(value)}")
        return tuple(self.rule(i, r, stages, shells, tools) for i, r in enumerate(value))

    def rule(
        self,
        index: int,
        rule: Any,
        stages: Mapping[str, Any],
        shells: Mapping[str, dict[str, Any]],
        tools: dict[str, ToolSpec],
    ) -> Rule:
        where = f"transitions[{index}]"
        assert self.stageId is not None
        if not isinstance(rule, dict):
            raise self.fail(where, f"must be a table, got {_kind(rule)}")
        on = rule.get("on")
        if on not in TRIGGERS:
            raise self.fail(f"{where}.on", f"must be one of {', '.join(TRIGGERS)}, got {on!r}")
        self.unknown(rule, _RULE_COMMON | _RULE_KEYS[on], f"{where}.")
        to = rule.get("to")
        if to is not None and (not isinstance(to, str) or to not in stages):
            raise self.fail(f"{where}.to", f"unknown stage {to!r} (stages: {', '.join(stages)})")
        fields: dict[str, Any] = {}
        matcher = self.matcher(rule, where)
        if on in ("player", "reply") and matcher.empty:
            raise self.fail(where, f'an on = "{on}" transition needs keywords or regex')
        if on == "idle":
            if "after" not in rule:
                raise self.fail(where, 'an on = "idle" transition needs after (seconds)')
            fields["after"] = self.number(rule["after"], f"{where}.after", 0, MAX_IDLE)
        if on == "turns":
            if "count" not in rule:
                raise self.fail(where, 'an on = "turns" transition needs count')
            fields["count"] = self.whole(rule["count"], f"{where}.count")
        if on == "tool":
            if "tool" not in rule:
                raise self.fail(where, 'an on = "tool" transition needs tool (its name)')
            fields["tool"] = self.resolveTool(rule["tool"], f"{where}.tool", tools)
            outcome = rule.get("outcome", "success")
            if outcome not in OUTCOMES:
                raise self.fail(f"{where}.outcome", f"must be one of {', '.join(OUTCOMES)}")
            fields["outcome"] = outcome
            if "result" in rule:
                fields["result"] = self.json(rule["result"], f"{where}.result")
        # Tools run in the stage the transition leads to (or this one).
        target = to if to is not None else self.stageId
        uses = rule.get("tools", [])
        if not isinstance(uses, list):
            raise self.fail(f"{where}.tools", f"must be a list, got {_kind(uses)}")
        if len(uses) > MAX_TOOLS_PER_RULE:
            raise self.fail(f"{where}.tools", f"at most {MAX_TOOLS_PER_RULE} tools")
        parsed = []
        for i, use in enumerate(uses):
            at = f"{where}.tools[{i}]"
            if isinstance(use, str):
                use = {"name": use}
            if not isinstance(use, dict):
                raise self.fail(at, f"must be a tool name or a table, got {_kind(use)}")
            self.unknown(use, frozenset({"name", "arguments"}), f"{at}.")
            name = self.resolveTool(use.get("name"), f"{at}.name", tools)
            if name not in shells[target]["tools"]:
                allowed = ", ".join(sorted(shells[target]["tools"])) or "none"
                raise self.fail(
                    f"{at}.name",
                    f"tool {name!r} may not run in stage {target!r} (its tools: {allowed}); "
                    f"list it in that stage's tools",
                )
            arguments = use.get("arguments", {})
            if not isinstance(arguments, dict):
                raise self.fail(f"{at}.arguments", f"must be a table, got {_kind(arguments)}")
            parsed.append(ToolUse(name, self.json(arguments, f"{at}.arguments")))
        say = rule.get("say")
        if say is not None:
            say = self.text(say, f"{where}.say", empty=True)
        limit = rule.get("limit")
        if limit is not None:
            limit = self.whole(limit, f"{where}.limit")
        reason = rule.get("reason")
        if reason is not None:
            reason = self.text(reason, f"{where}.reason", limit=200)
        return Rule(
            stage=self.stageId,
            index=index,
            on=on,
            to=to,
            matcher=matcher,
            tools=tuple(parsed),
            say=say,
            limit=limit,
            reason=reason,
            **fields,
        )
