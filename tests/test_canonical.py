"""
The canonical JSON is RPEngine's, not RFC 8785: the bytes its
C{canonical_value} (crates/rp-engine-core/src/json_core.rs) writes for what
serde_json reads from our C{json.dumps}; and the fast C encoder writes exactly
what the pure-Python writer writes wherever it is used.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.cards.canonical import (
    _serdeNumber,
    _slowJson,
    canonicalHash,
    canonicalJson,
    isPlain,
    knownPlainJson,
    plainJson,
)
from rpmiddleware.cards.hasher import CardHasher
from rpmiddleware.testing.kit import exampleCard
from tests.support.imports import ourModules, readImports

# Expected bytes below were produced by serde_json 1.0.150 (with zmij 1.0.23,
# the versions RPEngine's Cargo.lock pins; built from their sources) running
# RPEngine's json_core.rs canonical_value on json.dumps of each value.
# serde_json 1.0.87 (Debian, ryu) wrote the same except "e16" for "e+16":
# serde_json writes floats with zmij, and an "e+", since 1.0.147.
SERDE_VECTORS: list[tuple[Any, bytes]] = [
    (1.0, b"1.0"),
    (-0.0, b"-0.0"),
    (0.1, b"0.1"),
    (1e16, b"1e+16"),
    (1e15, b"1000000000000000.0"),
    (123456789012345680.0, b"1.2345678901234568e+17"),
    (1e21, b"1e+21"),
    (1e22, b"1e+22"),
    (1e-5, b"0.00001"),
    (1e-6, b"1e-6"),
    (1.5e-7, b"1.5e-7"),
    (0.0001234, b"0.0001234"),
    (5e-324, b"5e-324"),
    (1.7976931348623157e308, b"1.7976931348623157e+308"),
    # serde_json's decimal reading is not correctly rounded: these come back
    # as a neighbouring double.
    (-2.634073021688141e75, b"-2.6340730216881408e+75"),
    (7.884707671321887e-76, b"7.884707671321886e-76"),
    (2**53 + 1, b"9007199254740993"),
    (2**60, b"1152921504606846976"),
    (2**64 - 1, b"18446744073709551615"),
    (2**64, b"1.8446744073709552e+19"),
    (2**70, b"1.1805916207174113e+21"),
    (-(2**63), b"-9223372036854775808"),
    (-(2**63) - 1, b"-9.223372036854776e+18"),
    (10**30 + 1, b"1e+30"),
    (-4943029705740223083052933764, b"-4.9430297057402237e+27"),
    ({"b": 1, "a": [True, None]}, b'{"a":[true,null],"b":1}'),
    (
        {"\ue000": 1, "\U0001f600": 2, "z": 3},
        b'{"z":3,"\xf0\x9f\x98\x80":2,"\xee\x80\x80":1}',
    ),
    (
        'q"\\\b\f\n\r\t\x01\x1f\x7f\u2028é\U0001f600',
        b'"q\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xe2\x80\xa8\xc3\xa9\xf0\x9f\x98\x80"',
    ),
    ((1, 2.5), b"[1,2.5]"),
    # json.dumps writes "1" twice; serde_json keeps the last value.
    ({1: "a", "1": "b", None: 0, False: 1.0}, b'{"1":"b","false":1.0,"null":0}'),
]

CARD: dict[str, Any] = {
    "spec": "chara_card_v2",
    "spec_version": "2.0",
    "data": {
        "name": "Mira",
        "description": "Runs the inn at the crossroads.\nSpeaks softly.",
        "personality": "Kind, wary of strangers.",
        "scenario": "A stormy night.",
        "first_mes": "Come in out of the rain, traveller.",
        "mes_example": "",
        "creator_notes": "",
        "system_prompt": "",
        "post_history_instructions": "",
        "alternate_greetings": ["Ah, you again.", "Ключ? Ça va, ünïcödé 😀"],
        "tags": ["inn", "fantasy"],
        "creator": "tests",
        "character_version": "1",
        "extensions": {"depth": 4, "seed": 2**63, "\ue000": "private use", "\U0001f600": True},
    },
}
FLOAT_CARD: dict[str, Any] = {
    **CARD,
    "data": {
        **CARD["data"],
        "extensions": {
            "talkativeness": 0.5,
            "weights": [1.0, -0.0, 1e16, 1e-6, 0.00001, 0.30000000000000004],
            "id": 2**70,
            "depth": 4,
        },
        "character_book": {
            "name": "lore",
            "extensions": {},
            "entries": [
                {
                    "keys": ["inn"],
                    "content": "The inn has stood for 300 years.",
                    "extensions": {},
                    "enabled": True,
                    "insertion_order": 10,
                    "priority": 1.5,
                }
            ],
        },
    },
}
# SHA-256 over the canonical JSON serde_json 1.0.150 wrote for the two cards.
SERDE_CARD_HASHES = [
    (CARD, "ebbd9c388f2057b3fc28eaa24ce2ffd615f6501725a69b337a0b2f8e63bbb62d"),
    (FLOAT_CARD, "c66364e1f549991369ec66085ea570a17fc47f41539b78e150e042bdbfcddce6"),
]

# Keys and strings from all of Unicode (surrogates excluded: JSON text cannot
# hold them), so that UTF-16 ordering and escaping are exercised.
_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=10)
_plainKeys = st.text(st.characters(max_codepoint=0xD7FF), max_size=8)
_plainJson = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | _text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_plainKeys, children),
    max_leaves=30,
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=5),
    max_leaves=30,
)


class SerdeVectorTests(SynchronousTestCase):
    def test_vectors(self) -> None:
        for value, expected in SERDE_VECTORS:
            self.assertEqual(canonicalJson(value), expected, value)

    def test_cardHashes(self) -> None:
        for card, expected in SERDE_CARD_HASHES:
            self.assertEqual(canonicalHash(card), expected)
            self.assertEqual(hashlib.sha256(canonicalJson(card)).hexdigest(), expected)

    def test_notRfc8785(self) -> None:
        """
        Where RPEngine's form differs from RFC 8785: floats with integral
        values keep their C{.0} and sign, positive exponents their C{+},
        small numbers their positional form, and integers that fit C{u64} stay
        exact (RFC 8785 refuses them past 2**53); larger ones become doubles.
        """
        for value, ours, rfc in [
            (1.0, b"1.0", b"1"),
            (-0.0, b"-0.0", b"0"),
            (1e16, b"1e+16", b"10000000000000000"),
            (1e-6, b"1e-6", b"0.000001"),
        ]:
            self.assertEqual(canonicalJson(value), ours)
            self.assertEqual(rfc8785.dumps(value), rfc)
        self.assertEqual(canonicalJson(2**60), b"1152921504606846976")
        self.assertEqual(canonicalJson(2**70), b"1.1805916207174113e+21")
        for big in (2**60, 2**70):
            self.assertRaises(rfc8785.IntegerDomainError, rfc8785.dumps, big)
        floats = copy.deepcopy(FLOAT_CARD)
        del floats["data"]["extensions"]["id"]  # beyond RFC 8785's integers
        self.assertNotEqual(canonicalHash(floats), _rfc8785Hash(floats))
        # Without floats and big integers the two agree.
        card = {**CARD, "data": {**CARD["data"], "extensions": {"depth": 4}}}
        self.assertEqual(canonicalHash(card), _rfc8785Hash(card))

    def test_refusals(self) -> None:
        """
        What serde_json cannot read raises ValueError saying so.
        """
        for value in [
            {"a": "\ud800"},
            ["\udfff"],
            {"\udc00": 1},
            "x\ud83dy",
            {"f": float("nan")},
            [float("inf")],
            -float("inf"),
            10**400,
        ]:
            e = self.assertRaises(ValueError, canonicalJson, value)
            self.assertIn("RPEngine", str(e))

    def test_typeError(self) -> None:
        self.assertRaises(TypeError, canonicalJson, {"a": object()})


class FastPathTests(SynchronousTestCase):
    @settings(max_examples=300, deadline=None)
    @given(_plainJson)
    def test_plainUsesTheCEncoder(self, value: Any) -> None:
        """
        JSON without floats, with integers serde_json keeps exact and keys
        below U+D800 never needs the slow writer, and the fast one agrees
        with it.
        """
        self.assertTrue(isPlain(value))
        self.assertEqual(plainJson(value), _slowJson(value))
        self.assertEqual(knownPlainJson(value), _slowJson(value))

    @settings(max_examples=300, deadline=None)
    @given(_json)
    def test_writesWhatSerdeRead(self, value: Any) -> None:
        """
        The canonical JSON holds exactly the values serde_json reads from
        C{json.dumps(value)} (each double's digits read back as that double),
        with object keys in UTF-16 order.

        It is not a fixed point: serde_json's reading of a double's shortest
        digits is not always that double, so canonical JSON read again by
        serde_json may hold another.
        """
        encoded = canonicalJson(value)
        read = json.loads(json.dumps(value), parse_int=_serdeNumber, parse_float=_serdeNumber)
        self.assertEqual(json.loads(encoded), read)
        json.loads(encoded, object_pairs_hook=self.assertUtf16Order)

    def assertUtf16Order(self, pairs: list[tuple[str, Any]]) -> None:
        keys = [key.encode("utf-16-be") for key, _ in pairs]
        self.assertEqual(keys, sorted(keys))

    def test_slowCases(self) -> None:
        """
        Each kind of value the C encoder would write differently goes to the
        slow writer: floats, keys whose UTF-16 order differs, tuples,
        integers beyond i64 and u64, subclasses.
        """
        for value in [
            {"a": 1.0},
            {"\ue000": 1, "\U0001f600": 2},
            {"a": (1, 2)},
            [2**64],
            {"n": -(2**63) - 1},
            [True, 1.5],
            {1: "a"},
        ]:
            self.assertIsNone(plainJson(value), value)
        for value in [[2**64 - 1], {"n": -(2**63)}, {"é": "\x00"}, {"a": [None, "b"]}]:
            self.assertIsNotNone(plainJson(value), value)


def _rfc8785Hash(document: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(document)).hexdigest()


class WithDataTests(SynchronousTestCase):
    """
    CardHasher.withData: a copy of an owned card with some data text
    changed hashes as the whole copy would, whatever the card holds.
    """

    def test_plainCard(self) -> None:
        hasher = CardHasher(None)
        base = hasher.canonicalNow(exampleCard()).document
        card = hasher.withData(base, {"scenario": "A stormy night.", "mes_example": "A: b"})
        self.assertTrue(card.plain)
        self.assertEqual(card.hash, canonicalHash(card.document))
        self.assertEqual(card.document["data"]["scenario"], "A stormy night.")
        self.assertIs(card.document["data"]["character_book"], base["data"]["character_book"])
        self.assertNotEqual(card.hash, hasher.known(base).hash)  # type: ignore[union-attr]

    def test_cardThatNeedsTheSlowWriter(self) -> None:
        hasher = CardHasher(None)
        base = hasher.canonicalNow(exampleCard(extensions={"weight": 1.5})).document
        card = hasher.withData(base, {"scenario": "x"})
        self.assertFalse(card.plain)
        self.assertEqual(card.hash, canonicalHash(card.document))

    def test_cardTheMiddlewareDoesNotOwn(self) -> None:
        hasher = CardHasher(None)
        game = exampleCard()
        card = hasher.withData(game, {"scenario": "x"})
        self.assertEqual(card.hash, canonicalHash(card.document))
        game["data"]["tags"].append("changed later")
        self.assertEqual(card.hash, canonicalHash(card.document), "a private copy")


class ReferenceOnlyTests(SynchronousTestCase):
    def test_productDoesNotImportTheReference(self) -> None:
        """
        rfc8785, the reference encoder the tests hold ours to, is a test and
        bench dependency (setup.cfg's extras), not the product's: no module
        of rpmiddleware or of the built-in plugins imports it.
        """
        modules = ourModules()
        self.assertIn("rpmiddleware.cards.canonical", modules)
        importing: list[str] = []
        for module in modules.values():
            readImports(module)
            importing.extend(
                f"{module.name}:{line}"
                for target, _, line in module.imports
                if target.partition(".")[0] == "rfc8785"
            )
        self.assertEqual(importing, [], "install rfc8785 with the product again, or drop it")
