"""
The fast canonical encoder writes exactly what C{rfc8785} writes, and refuses
what it refuses.
"""

from __future__ import annotations

from typing import Any

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.canonical import canonicalJson, plainJson

# Keys and strings from all of Unicode (surrogates excluded: JSON text cannot
# hold them), so that UTF-16 ordering and escaping are exercised.
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=10)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=5),
    max_leaves=30,
)
_plainJson = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _text,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(st.characters(max_codepoint=0xD7FF), max_size=8), children)
    ),
    max_leaves=30,
)


class CanonicalJsonTests(SynchronousTestCase):
    @settings(max_examples=300, deadline=None)
    @given(_json)
    def test_sameBytesAsRfc8785(self, value: Any) -> None:
        self.assertEqual(canonicalJson(value), rfc8785.dumps(value))

    @settings(max_examples=200, deadline=None)
    @given(_plainJson)
    def test_plainUsesTheCEncoder(self, value: Any) -> None:
        """
        JSON without floats and with keys below U+D800 never needs the slow
        encoder, and the fast one agrees with it.
        """
        self.assertEqual(plainJson(value), rfc8785.dumps(value))

    def test_slowCases(self) -> None:
        """
        Each kind of value the C encoder would write differently goes to
        rfc8785: floats, keys whose UTF-16 order differs, tuples, big ints.
        """
        for value in [
            {"a": 1.0},
            {"\ue000": 1, "\U0001f600": 2},
            {"a": (1, 2)},
            [2**53],
            {"n": 2**60},
        ]:
            self.assertIsNone(plainJson(value), value)
        self.assertEqual(
            canonicalJson({"\ue000": 1, "\U0001f600": 2}),
            rfc8785.dumps({"\ue000": 1, "\U0001f600": 2}),
        )
        self.assertEqual(canonicalJson({"a": 1.0, "b": 1e21}), b'{"a":1,"b":1e+21}')

    def test_refusals(self) -> None:
        """
        What RFC 8785 cannot represent raises its ValueError either way.
        """
        for value in [{"a": "\ud800"}, {"n": 2**53}, {"f": float("nan")}]:
            self.assertRaises(ValueError, canonicalJson, value)

    def test_escapes(self) -> None:
        self.assertEqual(
            canonicalJson({"s": 'q"\\\b\f\n\r\t\x01\x1f\x7f\u2028é'}),
            b'{"s":"q\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xe2\x80\xa8\xc3\xa9"}',
        )
