"""
Playbooks once loaded: stages, transitions, matchers and tools, and the
format's limits.

Everything here is immutable, so one playbook is shared by every client
session that plays it and the sessions keep only where they are.  Reading
and checking a playbook document is L{rpmiddleware.builtin.playbook.parser}'s
job; after it, nothing in a playbook can be wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: What can fire a transition.
TRIGGERS = ("player", "reply", "tool", "event", "idle", "turns")
#: Who runs a tool: the client (game) that receives tool-call-start, or a
#: plugin's ITool inside the middleware.
RUN_BY = ("client", "middleware")
#: Which tool endings a C{tool} transition fires on.
OUTCOMES = ("success", "error", "any")
#: The prompt context in RPEngine's shape (crates/rp-engine-core/src/json_core.rs,
#: validate_prompt_context); anything else is a typo.
SCENE_TEXT_KEYS = ("kind", "family", "label", "sceneLine")
SCENE_KEYS = frozenset({*SCENE_TEXT_KEYS, "priority"})
DIRECTIVE_TEXT_KEYS = ("sceneContext", "autoEventGuide", "directUserGuide")
DIRECTIVE_KEYS = frozenset({*DIRECTIVE_TEXT_KEYS, "protocolVersion", "promptVersion"})
#: What a stage that leaves them out gets.
DEFAULT_PRIORITY = 0
DEFAULT_DIRECTIVE_VERSION = 1

MAX_STAGES = 256
MAX_RULES = 64
MAX_TOOLS_PER_RULE = 16
MAX_PATTERN_CHARS = 1000
MAX_PROMPT_CHARS = 20000
#: kind, family, label, promptVersion: names, not prose.
MAX_NAME_CHARS = 200
MAX_TIMEOUT = 3600.0
MAX_IDLE = 86400.0
#: How much of a text the matchers look at: bounds the cost of a regular
#: expression on the reactor thread, whatever a client sends.
MATCH_CHARS = 10000

_MISSING: Any = object()


class PlaybookError(ValueError):
    """
    A playbook that cannot be used.  The message names the playbook, the
    stage and the field (whichever apply), because it goes to the person who
    wrote it: at start-up for a configured file, in a PLAYBOOK_ERROR for a
    client's.
    """

    def __init__(
        self,
        problem: str,
        *,
        playbook: str | None = None,
        stage: str | None = None,
        field: str | None = None,
    ) -> None:
        self.problem = problem
        self.playbook = playbook
        self.stage = stage
        self.field = field
        where = []
        if playbook is not None:
            where.append(f"playbook {playbook!r}")
        if stage is not None:
            where.append(f"stage {stage!r}")
        if field is not None:
            where.append(f"field {field}")
        super().__init__(f"{', '.join(where)}: {problem}" if where else problem)


def _keywordPattern(keyword: str) -> re.Pattern[str]:
    """
    A keyword or phrase as a whole-word, case-insensitive pattern in which
    any run of spaces matches any run of whitespace.
    """
    words = [re.escape(w) for w in keyword.split()]
    return re.compile(r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)", re.IGNORECASE)


def _normalized(text: str) -> str:
    # Typed text often has typographic apostrophes; keywords are written plain.
    return text[:MATCH_CHARS].replace("\u2019", "'").replace("\u2018", "'")


@dataclass(frozen=True)
class Matcher:
    """
    Keywords (whole words or phrases, any case) and regular expressions
    (searched, case-insensitive); any one matching is a match.
    """

    keywords: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, keywords: tuple[str, ...], patterns: tuple[re.Pattern[str], ...]) -> Matcher:
        return cls(keywords, patterns, tuple(_keywordPattern(k) for k in keywords))

    @property
    def empty(self) -> bool:
        return not self.keywords and not self.patterns

    def find(self, text: str) -> str | None:
        """
        What matched in C{text}, said for a stage-change reason, or C{None}.
        """
        text = _normalized(text)
        for keyword, compiled in zip(self.keywords, self._compiled, strict=True):
            if compiled.search(text):
                return f'said "{keyword}"'
        for pattern in self.patterns:
            if pattern.search(text):
                return f"matched /{pattern.pattern}/"
        return None


@dataclass(frozen=True)
class ToolUse:
    """
    One tool a transition runs, with the arguments the playbook gives it.
    """

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    """
    A tool a playbook may run.  C{timeout} None means the tool's own, or the
    plugin's C{tool_timeout}.
    """

    name: str
    runBy: str
    timeout: float | None = None
    description: str = ""


@dataclass(frozen=True)
class Rule:
    """
    One entry of a stage's C{transitions}: a trigger, where it leads (C{to};
    None stays without a stage-change), and what it does on the way.
    """

    stage: str
    index: int
    on: str
    to: str | None
    matcher: Matcher = field(default_factory=Matcher)
    after: float | None = None
    count: int | None = None
    tool: str | None = None
    outcome: str = "success"
    result: Any = _MISSING
    tools: tuple[ToolUse, ...] = ()
    say: str | None = None
    limit: int | None = None
    reason: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.stage, self.index)

    @property
    def hasResult(self) -> bool:
        return self.result is not _MISSING

    def resultMatches(self, result: Any) -> bool:
        return not self.hasResult or _subset(self.result, result)


def _subset(expected: Any, actual: Any) -> bool:
    """
    Whether C{actual} has everything C{expected} has: objects by their keys
    (recursively), anything else by equality (a boolean never equals a number).
    """
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _subset(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    return bool(expected == actual)


@dataclass(frozen=True)
class Stage:
    """
    One stage.  C{promptScene} and C{promptDirective} are complete, in
    RPEngine's shape (checked when the playbook was loaded), or both empty:
    a stage whose playbook writes no prompt field at all has no prompt
    context of its own.
    """

    id: str
    promptScene: dict[str, Any]
    promptDirective: dict[str, Any]
    voice: str | None
    tools: frozenset[str]
    rules: tuple[Rule, ...]
    description: str = ""

    def rulesOn(self, trigger: str) -> list[Rule]:
        return [r for r in self.rules if r.on == trigger]

    @property
    def hasPrompt(self) -> bool:
        return bool(self.promptDirective)

    def promptContext(self, interactionMode: str) -> dict[str, Any] | None:
        """
        The three prompt-context fields of a request in this stage (fresh
        copies, for the caller to change), or C{None} for a stage without.
        """
        if not self.hasPrompt:
            return None
        return {
            "interactionMode": interactionMode,
            "promptScene": dict(self.promptScene),
            "promptDirective": dict(self.promptDirective),
        }


@dataclass(frozen=True)
class Playbook:
    name: str
    initial: str
    stages: dict[str, Stage]
    tools: dict[str, ToolSpec]
    description: str = ""
    #: Where it came from (a path, or "client"), for logs.
    source: str = field(default="", compare=False)

    def stage(self, stageId: str) -> Stage:
        return self.stages[stageId]
