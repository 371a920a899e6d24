"""
The declarative schemas' errors: msgspec's words read back into the field
and the problem, which every validator built on L{rpmiddleware.protocol.schema}
words for its reader.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated, Any

import msgspec
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.protocol.schema import TOML_WORDS, SchemaError, SchemaProblem, conform


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    urls: str


class Sample(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    count: int = 0
    ratio: float = 1.0
    note: str | None = None
    tag: Annotated[str, msgspec.Meta(min_length=1)] = "x"
    servers: list[Inner] = []


class ProblemTests(SynchronousTestCase):
    def problem(self, value: Any, words: Any = None) -> SchemaProblem:
        with self.assertRaises(SchemaError) as caught:
            conform(value, Sample, *([words] if words else []))
        return caught.exception.problem

    def test_fits(self) -> None:
        """
        A fitting value is converted; an integer is a number.
        """
        self.assertEqual(conform({"name": "a", "ratio": 2}, Sample), Sample("a", ratio=2.0))

    def test_missing(self) -> None:
        self.assertEqual(self.problem({}), SchemaProblem("name", "missing", "is missing"))

    def test_unknown(self) -> None:
        self.assertEqual(
            self.problem({"name": "a", "nmae": 1}),
            SchemaProblem("nmae", "unknown", "is not a known field"),
        )

    def test_wrongType(self) -> None:
        """
        A wrong type names the field, what it must be and what came, in
        the given words; a boolean is not an integer.
        """
        self.assertEqual(
            self.problem({"name": "a", "count": True}),
            SchemaProblem("count", "type", "must be integer, got boolean"),
        )
        self.assertEqual(
            self.problem({"name": "a", "count": "1"}, TOML_WORDS),
            SchemaProblem("count", "type", "must be a whole number, got a string"),
        )
        self.assertEqual(
            self.problem({"name": "a", "note": 3}),
            SchemaProblem("note", "type", "must be string or null, got integer"),
        )

    def test_constraint(self) -> None:
        self.assertEqual(
            self.problem({"name": "a", "tag": ""}),
            SchemaProblem("tag", "value", "must be string of length >= 1"),
        )

    def test_nested(self) -> None:
        """
        A problem inside a list names the item and its field.
        """
        self.assertEqual(
            self.problem({"name": "a", "servers": [{"urls": "u"}, {"url": "u"}]}),
            SchemaProblem("servers[1].url", "unknown", "is not a known field"),
        )
        self.assertEqual(
            self.problem({"name": "a", "servers": [{}]}),
            SchemaProblem("servers[0].urls", "missing", "is missing"),
        )

    def test_notAnObject(self) -> None:
        problem = self.problem([1])
        self.assertEqual((problem.field, problem.problem), ("", "must be object, got array"))
        self.assertEqual(problem.at("server"), "server")

    def test_at(self) -> None:
        self.assertEqual(SchemaProblem("port", "type", "").at("server"), "server.port")
        self.assertEqual(SchemaProblem("[0].x", "type", "").at("list"), "list[0].x")
        self.assertEqual(SchemaProblem("port", "type", "").at(""), "port")


class MsgspecWordingTests(SynchronousTestCase):
    """
    msgspec's own words, which L{rpmiddleware.protocol.schema.problemOf} reads
    back into parts (setup.cfg pins msgspec to the versions checked): each
    shape it parses, as msgspec says it.  The tests above check what comes
    out; these say, when they fail, which of msgspec's wordings changed.
    """

    def wording(self, value: Any) -> str:
        with self.assertRaises(msgspec.ValidationError) as caught:
            msgspec.convert(value, Sample, strict=True)
        return str(caught.exception)

    def assertWording(self, value: Any, expected: str, shape: str) -> None:
        said = self.wording(value)
        self.assertEqual(
            said,
            expected,
            f"msgspec {version('msgspec')} words {shape} differently; "
            f"rpmiddleware/protocol/schema.py parses {expected!r}, got {said!r}",
        )

    def test_missing(self) -> None:
        self.assertWording({}, "Object missing required field `name`", "a missing field (_FIELD)")

    def test_unknownAt(self) -> None:
        self.assertWording(
            {"name": "a", "servers": [{"url": "u"}]},
            "Object contains unknown field `url` - at `$.servers[0]`",
            "an unknown field and its JSON path (_FIELD, _AT)",
        )

    def test_type(self) -> None:
        self.assertWording(
            {"name": "a", "note": 3},
            "Expected `str | null`, got `int` - at `$.note`",
            "a wrong type (_TYPE)",
        )

    def test_constraint(self) -> None:
        self.assertWording(
            {"name": "a", "tag": ""},
            "Expected `str` of length >= 1 - at `$.tag`",
            "a constraint (_CONSTRAINT)",
        )
