"""
L{loadJson} reads with msgspec first and json's reader for what msgspec
refuses: it must read every text exactly as json's reader with our hooks did
(the same values of the same types, the same errors), which these tests
check against that reader on generated JSON, valid and not.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.client.messages import decodeFrame
from rpmiddleware.protocol.clienterrors import InvalidMessage
from rpmiddleware.protocol.envelope import loadJson, loadJsonStdlib, loadJsonUtf8


def typed(value: Any) -> Any:
    """
    C{value} with every scalar's type beside it, so that C{1}, C{1.0} and
    C{True} differ, as do C{0.0} and C{-0.0}, and objects keep their order.
    """
    if isinstance(value, dict):
        return ("object", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("array", [typed(v) for v in value])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def outcome(read: Any, payload: Any) -> Any:
    try:
        return ("value", typed(read(payload)))
    except RecursionError:
        return ("error", "RecursionError")
    except ValueError as e:
        return ("error", type(e).__name__, str(e))


def fromUtf8(payload: bytes) -> Any:
    return loadJsonStdlib(payload.decode("utf-8"))


#: Every code point, lone surrogates among them.
anyText = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
numbers = (
    st.integers()
    | st.integers(-(2**200), 2**200)
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, -(2**64)])
    | st.floats()
    | st.floats(min_value=-1e-300, max_value=1e-300)
)
scalars = st.none() | st.booleans() | numbers | anyText
jsonValues = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(anyText, children, max_size=5)
    ),
    max_leaves=25,
)


@st.composite
def documents(draw: st.DrawFn) -> str:
    """
    A JSON text (or json's extension of it: NaN, Infinity) in one of the
    ways json writes it.
    """
    value = draw(jsonValues)
    return json.dumps(
        value,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.sampled_from([None, 0, 2, "\t"])),
        separators=draw(st.none() | st.just((",", ":")) | st.just((" , ", " : "))),
    )


#: Number texts as JSON writes them, and some it does not.
numberTexts = st.from_regex(r"\A-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][-+]?[0-9]{1,4})?\Z") | (
    st.from_regex(r"\A[-+.0-9eE]{1,12}\Z")
)

#: Bits of JSON to splice into a document: what may confuse a reader.
fragments = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        "-1e400",
        "18446744073709551616",
        "-9223372036854775809",
        '"\\ud800"',
        '"\\udc00\\ud800"',
        '"\\uD83D\\uDE00"',
        "\ufeff",
        "\x00",
        "\x0b",
        "\u00a0",
        ",",
        ":",
        "[",
        "]",
        "{",
        "}",
        '"',
        "\\",
        "\t",
        "\n",
        " ",
        "01",
        "1.",
        "tru",
        "null",
    ]
)


@st.composite
def mangled(draw: st.DrawFn) -> str:
    """
    A document with a few characters cut out or spliced in.
    """
    text = draw(documents())
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()) and at < len(text):
            text = text[:at] + text[at + draw(st.integers(1, 3)) :]
        else:
            text = text[:at] + draw(fragments | anyText) + text[at:]
    return text


@st.composite
def duplicateKeys(draw: st.DrawFn) -> str:
    pairs = draw(
        st.lists(st.tuples(st.sampled_from(["a", "b", "c", "\u00e9"]), numbers), max_size=8)
    )
    return (
        "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v, allow_nan=True)}" for k, v in pairs) + "}"
    )


def encodings(text: str) -> list[bytes | str]:
    """
    C{text} as a str and as the bytes of a frame (lone surrogates written
    as UTF-8 would if it could, which is not UTF-8).
    """
    return [text, text.encode("utf-8", "surrogatepass")]


class LoadJsonTests(SynchronousTestCase):
    def assertSameAsBefore(self, text: str) -> None:
        for payload in encodings(text):
            self.assertEqual(outcome(loadJson, payload), outcome(loadJsonStdlib, payload), payload)
        utf8 = text.encode("utf-8", "surrogatepass")
        self.assertEqual(outcome(loadJsonUtf8, utf8), outcome(fromUtf8, utf8), utf8)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(documents())
    def test_documents(self, text: str) -> None:
        """
        Every document json writes (nested objects, integers past 64 bits,
        floats, NaN and the infinities, any code point) reads as before.
        """
        self.assertSameAsBefore(text)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(mangled())
    def test_mangled(self, text: str) -> None:
        """
        Broken documents are refused with the same error as before, or read
        to the same value.
        """
        self.assertSameAsBefore(text)

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(numberTexts)
    def test_numbers(self, text: str) -> None:
        """
        A number alone and in an array: the same int or float (correctly
        rounded, overflow refused), or the same error.
        """
        self.assertSameAsBefore(text)
        self.assertSameAsBefore(f"[{text}, {text}]")

    @settings(max_examples=100, deadline=None, derandomize=True)
    @given(duplicateKeys())
    def test_duplicateKeys(self, text: str) -> None:
        """
        The last of duplicate keys wins, in the first one's place.
        """
        self.assertSameAsBefore(text)

    def test_examples(self) -> None:
        """
        What msgspec refuses or reads differently from json on its own.
        """
        for text in [
            "NaN",
            "[Infinity]",
            '{"a": -Infinity}',
            "1e400",
            "-1e400",
            "1.7976931348623159e308",
            str(2**64),
            str(-(2**200)),
            "1" * 4300,
            "-" + "1" * 4300,
            "1" * 4301,
            '"\\ud800"',
            '{"\\udc00": 1}',
            "\ufeff{}",
            "\x0c{}",
            "\u00a0{}",
            "{}\x00",
            "[1,]",
            "",
            " ",
            '{"a":1,"a":2,"b":3,"a":4}',
            "[" * 100_000 + "]" * 100_000,
            "[" * 900 + "]" * 900,
        ]:
            self.assertSameAsBefore(text)

    def test_notUtf8(self) -> None:
        """
        Frames that are not UTF-8: json read a byte order mark and UTF-16 or
        UTF-32 (loadJson still does), and refused the rest as before;
        loadJsonUtf8 refuses all of them as C{bytes.decode} does.
        """
        for payload in [
            b"\xef\xbb\xbf{}",
            "{}".encode("utf-16"),
            "[1]".encode("utf-16-le"),
            "[1]".encode("utf-32"),
            b'"\xc0\xaf"',
            b'"\xed\xa0\x80"',
            b'"\xf4\x90\x80\x80"',
            b"\xff",
        ]:
            self.assertEqual(outcome(loadJson, payload), outcome(loadJsonStdlib, payload), payload)
            self.assertEqual(outcome(loadJsonUtf8, payload), outcome(fromUtf8, payload), payload)

    def test_errorTypes(self) -> None:
        """
        The errors callers catch: C{ValueError} (json's C{JSONDecodeError},
        C{UnicodeDecodeError}), C{RecursionError}.
        """
        self.assertRaises(json.JSONDecodeError, loadJson, b"{")
        self.assertRaises(ValueError, loadJson, "NaN")
        self.assertRaises(UnicodeDecodeError, loadJsonUtf8, b'"\xff"')
        self.assertRaises(RecursionError, loadJson, "[" * (sys.getrecursionlimit() * 100))

    def test_decodeFrame(self) -> None:
        """
        The client's frames read as bytes say the same as before.
        """
        self.assertEqual(
            decodeFrame(b'{"type":"ping","n":18446744073709551616}', False)["n"], 2**64
        )
        for payload, words in [
            (b'{"type":"ping"\xff}', "not valid UTF-8"),
            (b'{"type":"ping","n":NaN}', "not valid JSON: NaN is not a JSON value"),
            (b"\xef\xbb\xbf{}", "not valid JSON: Unexpected UTF-8 BOM"),
            (b"[" * 100_000, "nested too deeply"),
        ]:
            e = self.assertRaises(InvalidMessage, decodeFrame, payload, False)
            self.assertIn(words, str(e))
