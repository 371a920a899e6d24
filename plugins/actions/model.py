"""
Actions a game declares and the calls a character writes: declarations
checked (their JSON Schema included), the prompt lines that teach the model
the call syntax, the response-processing rule that takes the calls out of
what the player reads and hears, and each call read back and checked.

RPEngine calls no functions and adds no output-format instructions: its one
structured channel out of the model is C{output.responseProcessing}
(C{docs/protocol-v3.md}; C{crates/rp-engine-core/src/app.rs}): buffered regex
rules whose captures come back as C{extractedContent} on
C{reply.text.completed}, removed from text and speech.  So the prompt
teaches the syntax, the rule captures it, and this module checks what came
back: an unknown action, arguments that are not JSON or fail the schema, or
an action not allowed to that character never reach the game.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rpmiddleware.builtin.memory.api import ATTITUDE_AXES
from rpmiddleware.plugin import MAX_RESPONSE_RULES

#: The response-processing rule's id (RPEngine: ^[a-z][a-z0-9_.-]{0,63}$).
RULE_ID = "rpmiddleware.action"
#: A call: [[name {json}]], anywhere in the reply, over several lines too,
#: and the forms a small model slips into: [[name({json})]], [[name: {json}]],
#: [[name, {json}]], one closing bracket.  Lazy inside, so two calls stay
#: two; a JSON object may nest (a "}" before the closing bracket ends it).
#: Rust regex syntax, no lookaround (RPEngine compiles it).
CALL_PATTERN = r"\[\[\s*([A-Za-z_][A-Za-z0-9_.-]*(?:[\s:,(]*\{.*?\}\s*\)?)?)\s*\]\]?"
RULE: dict[str, Any] = {
    "id": RULE_ID,
    "matcher": {"type": "regex", "pattern": CALL_PATTERN, "flags": "s"},
    "captureGroup": 1,
    "occurrence": "all",
    "remove": "match",
    "removeFrom": ["text", "audio"],
}
MAX_ACTIONS = 32
MAX_DESCRIPTION = 500
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)[\s:,(]*(\{.*\})?\s*\)?\s*$", re.S)


class ActionError(ValueError):
    """A declaration that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Action:
    name: str
    description: str
    parameters: Mapping[str, Any]
    #: The characters that may call it; C{None}: every one.
    characters: frozenset[str] | None = None
    #: The playbook stages it is offered in; C{None}: every stage, and no playbook.
    stages: frozenset[str] | None = None
    #: How the calling character's attitude to the player changes once the
    #: game reports the call done (C{{"trust": -10}}); C{None}: it does not.
    attitude: Mapping[str, int] | None = None

    def offeredTo(self, characterId: str, stage: str | None) -> bool:
        if self.characters is not None and characterId not in self.characters:
            return False
        return self.stages is None or stage in self.stages

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }
        if self.characters is not None:
            described["characters"] = sorted(self.characters)
        if self.stages is not None:
            described["stages"] = sorted(self.stages)
        if self.attitude is not None:
            described["attitude"] = dict(self.attitude)
        return described


def _names(value: Any, at: str) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ActionError(f"{at} must be an array of non-empty strings")
    return frozenset(value)


def action(raw: Any, at: str) -> Action:
    """
    One declaration: C{name}, C{description}, C{parameters} (a JSON Schema
    of an object), C{characters} and C{stages}.
    """
    if not isinstance(raw, Mapping):
        raise ActionError(f"{at} must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ActionError(f"{at}.name must match ^[a-z][a-z0-9_]{{0,63}}$")
    description = raw.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise ActionError(f"{at}.description must be a string of at most {MAX_DESCRIPTION}")
    parameters = raw.get("parameters", {"type": "object"})
    if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
        raise ActionError(f"{at}.parameters must be a JSON Schema of an object")
    # jsonschema (about 2 MB and 27 ms) is imported at the first declaration,
    # not when the daemon starts: most games declare no actions.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as e:
        raise ActionError(f"{at}.parameters is not a valid JSON Schema: {e.message}")
    return Action(
        name,
        " ".join(description.split()),
        dict(parameters),
        _names(raw.get("characters"), f"{at}.characters"),
        _names(raw.get("stages"), f"{at}.stages"),
        _attitude(raw.get("attitude"), f"{at}.attitude"),
    )


def _attitude(value: Any, at: str) -> dict[str, int] | None:
    """An action's attitude effect: axes to whole numbers from -100 to 100."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise ActionError(f"{at} must be an object of {', '.join(ATTITUDE_AXES)}")
    for axis, amount in value.items():
        if axis not in ATTITUDE_AXES:
            raise ActionError(f"{at}.{axis} is not an axis (the axes: {', '.join(ATTITUDE_AXES)})")
        if isinstance(amount, bool) or not isinstance(amount, int) or not -100 <= amount <= 100:
            raise ActionError(f"{at}.{axis} must be a whole number from -100 to 100")
    return dict(value)


def actions(raw: Any) -> dict[str, Action]:
    if not isinstance(raw, list):
        raise ActionError("actions.actions must be an array of actions")
    if len(raw) > MAX_ACTIONS:
        raise ActionError(f"actions.actions has {len(raw)}; at most {MAX_ACTIONS}")
    made: dict[str, Action] = {}
    for index, entry in enumerate(raw):
        declared = action(entry, f"actions.actions[{index}]")
        if declared.name in made:
            raise ActionError(f"actions.actions[{index}].name {declared.name!r} is there twice")
        made[declared.name] = declared
    return made


def _shape(schema: Mapping[str, Any]) -> str:
    """A short reading of an argument's schema for the prompt."""
    if isinstance(schema.get("enum"), list):
        return " or ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    return kind if isinstance(kind, str) else "value"


def signature(declared: Action) -> str:
    properties = declared.parameters.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return "{}"
    parts = [
        f'"{name}": {_shape(spec) if isinstance(spec, Mapping) else "value"}'
        for name, spec in properties.items()
    ]
    return "{" + ", ".join(parts) + "}"


_EXAMPLES = {"string": "...", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}


def example(declared: Action) -> str:
    """A call of C{declared} as the model should write it, with made-up values."""
    properties = declared.parameters.get("properties")
    arguments: dict[str, Any] = {}
    for name, spec in (properties if isinstance(properties, Mapping) else {}).items():
        spec = spec if isinstance(spec, Mapping) else {}
        if isinstance(spec.get("enum"), list) and spec["enum"]:
            arguments[name] = spec["enum"][0]
        else:
            arguments[name] = _EXAMPLES.get(str(spec.get("type")), "...")
    return f"[[{declared.name} {json.dumps(arguments, ensure_ascii=False)}]]"


def instructions(offered: Sequence[Action], character: str) -> str:
    """
    What the model is taught: the syntax, with the first action as its
    example, and each action it may call.
    """
    example_ = example(offered[0])
    lines = [
        f"{character} can act in the world. To do one of the actions below, write it in "
        f"double square brackets with its arguments as a JSON object, like {example_}, "
        "where it happens in the reply. It is not read aloud. Only do an action when "
        f"{character} decides to; never describe the brackets. Actions:",
    ]
    for declared in offered:
        about = f" - {declared.description}" if declared.description else ""
        lines.append(f"[[{declared.name} {signature(declared)}]]{about}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


class BadCall(ValueError):
    """A call a character wrote that is not done; the message says why."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(why)
        self.name = name
        self.why = why


def readCall(captured: str, offered: Mapping[str, Action]) -> Call:
    """
    A captured call, checked: its action offered to this turn's character,
    its arguments a JSON object that the action's schema accepts.

    @raise BadCall: saying what was wrong.
    """
    found = _CALL.match(captured.strip())
    if found is None:
        raise BadCall(captured[:64], "it is not an action name and a JSON object")
    name, rawArguments = found.group(1), found.group(2)
    declared = offered.get(name) or offered.get(name.lower())
    if declared is None:
        raise BadCall(name, "no such action is offered to this character here")
    try:
        arguments = json.loads(rawArguments) if rawArguments else {}
    except ValueError as e:
        raise BadCall(name, f"its arguments are not JSON ({e})")
    if not isinstance(arguments, dict):
        raise BadCall(name, "its arguments are not a JSON object")
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(declared.parameters).iter_errors(arguments), key=str)
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "arguments"
        raise BadCall(name, f"{where}: {errors[0].message}")
    return Call(declared.name, arguments)


__all__ = [
    "MAX_RESPONSE_RULES",
    "RULE",
    "RULE_ID",
    "Action",
    "ActionError",
    "BadCall",
    "Call",
    "actions",
    "instructions",
    "readCall",
]
