"""
Declarative schemas (msgspec) and their errors in our words.

A schema is a C{msgspec.Struct}; L{conform} converts a decoded value to it
and, when the value does not fit, L{SchemaProblem} says which field and what
is wrong, so that each caller can word its error as its reader expects
(C{reply.text.delta.sequence must be integer, got string} for the log,
C{server.port must be a whole number, got 'high'} for a game developer).

msgspec's C{ValidationError} carries the field as a JSON path in its text
(C{Expected `int`, got `str` - at `$.sequence`}); L{problemOf} reads that text
back into parts.  tests/test_schema.py pins the shapes it reads, so a msgspec
that words them differently fails there rather than in a message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec

__all__ = ["JSON_WORDS", "TOML_WORDS", "SchemaError", "SchemaProblem", "conform", "problemOf"]

T = TypeVar("T")

#: msgspec's type names as the protocol documents say them.
JSON_WORDS: Mapping[str, str] = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "object": "object",
    "array": "array",
    "null": "null",
}
#: msgspec's type names as a TOML file's reader says them (C{got NAME}: the
#: words for a value that came, where they differ from those for one asked).
TOML_WORDS: Mapping[str, str] = {
    "str": "a string",
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "got bool": "a boolean",
    "object": "a table",
    "array": "a list",
    "null": "nothing",
    "got datetime": "a date and time",
    "got date": "a date",
    "got time": "a time of day",
}

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_FIELD = re.compile(r"^Object (?P<kind>missing required|contains unknown) field `(?P<name>.*)`$")
_TYPE = re.compile(r"^Expected `(?P<expected>[^`]*)`, got `(?P<got>[^`]*)`$")
_CONSTRAINT = re.compile(r"^Expected `(?P<expected>[^`]*)` (?P<rest>.+)$")


@dataclass(frozen=True)
class SchemaProblem:
    """
    Why a value does not fit a schema.

    @ivar field: the offending field as a path below the checked value,
        such as C{sequence}, C{ice_servers[0]} or C{d[...].urls}; empty for
        the value itself.
    @ivar kind: C{missing}, C{unknown} (a field the schema does not have),
        C{type} (a JSON type other than the expected ones) or C{value}.
    @ivar problem: what is wrong, in the given words, to follow the field's
        name: C{is missing}, C{must be integer, got string}.
    """

    field: str
    kind: Literal["missing", "unknown", "type", "value"]
    problem: str

    def at(self, prefix: str) -> str:
        """
        The field's path below C{prefix} (a message type, a section, ...).
        """
        if not self.field:
            return prefix
        if not prefix:
            return self.field
        return prefix + ("" if self.field.startswith("[") else ".") + self.field


class SchemaError(ValueError):
    """
    A value that does not fit its schema; C{problem} says where and why.
    """

    def __init__(self, problem: SchemaProblem) -> None:
        super().__init__(f"{problem.field or 'the value'} {problem.problem}")
        self.problem = problem


def _words(types: str, words: Mapping[str, str]) -> str:
    return " or ".join(words.get(t, t) for t in types.split(" | "))


def problemOf(
    error: msgspec.ValidationError, words: Mapping[str, str] = JSON_WORDS
) -> SchemaProblem:
    """
    The field and problem that msgspec's C{error} names.
    """
    match = _AT.match(str(error))
    assert match is not None  # the pattern matches any text
    what, path = match["what"], (match["path"] or "").removeprefix(".")
    field = _FIELD.match(what)
    if field is not None:
        name = field["name"]
        path = f"{path}.{name}" if path else name
        if field["kind"] == "missing required":
            return SchemaProblem(path, "missing", "is missing")
        return SchemaProblem(path, "unknown", "is not a known field")
    wrong = _TYPE.match(what)
    if wrong is not None:
        got = wrong["got"]
        expected, got = (
            _words(wrong["expected"], words),
            words.get(f"got {got}", words.get(got, got)),
        )
        return SchemaProblem(path, "type", f"must be {expected}, got {got}")
    constraint = _CONSTRAINT.match(what)
    if constraint is not None:
        expected = _words(constraint["expected"], words)
        return SchemaProblem(path, "value", f"must be {expected} {constraint['rest']}")
    return SchemaProblem(path, "value", what[:1].lower() + what[1:])


def conform(value: Any, schema: type[T], words: Mapping[str, str] = JSON_WORDS) -> T:
    """
    C{value} (decoded JSON or TOML) converted to C{schema}, strictly: no
    string is read as a number, no boolean as an integer; an integer is a
    number.  Fields the schema does not name are ignored unless the schema
    forbids them.

    @raise SchemaError: naming the first field that does not fit.
    """
    try:
        return msgspec.convert(value, schema, strict=True)
    except msgspec.ValidationError as e:
        raise SchemaError(problemOf(e, words)) from None
