"""
Property tests for card identity and card transfers: the canonical hash
ignores key order and whitespace, L{CardHasher} agrees with it cold and
cached, RFC 6902 patches round-trip, and over a whole session of small edits
every transfer card-cache chooses is one RPEngine's own cache accepts with
the right hash.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from plugins.card_cache import CardCache, jsonSize, smallerPatch
from rpmiddleware.cards import CardHasher, canonicalHash, snapshotTransfer
from rpmiddleware.testing.cardstore import SessionCardStore, simulatorHash
from rpmiddleware.testing.kit import PluginHarness, exampleCard
from rpmiddleware.timeline import Timeline

#: I-JSON numbers: RFC 8785 refuses integers beyond 2**53.
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
jsonValues = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=25,
)
documents = st.dictionaries(st.text(max_size=8), jsonValues, max_size=6)


def permuted(value: Any, rng: Any) -> Any:
    """
    The same JSON value with every object's keys in a shuffled order.
    """
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: permuted(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [permuted(v, rng) for v in value]
    return value


_SERIALISATIONS = [
    {},
    {"indent": 2},
    {"indent": "\t", "sort_keys": True},
    {"separators": (",", ":")},
    {"separators": (" ,  ", " :\n ")},
    {"ensure_ascii": False, "indent": 0},
    {"ensure_ascii": True, "sort_keys": True, "indent": 7},
]


class CanonicalHashProperties(SynchronousTestCase):
    @settings(max_examples=80, deadline=None)
    @given(documents, st.sampled_from(_SERIALISATIONS), st.randoms(use_true_random=False))
    def test_keyOrderAndWhitespace(self, document: Any, how: Any, rng: Any) -> None:
        """
        Re-serialising a document with other whitespace, key order and
        escaping, and parsing it back, never changes its canonical hash.
        """
        expected = canonicalHash(document)
        self.assertEqual(expected, simulatorHash(document))
        text = json.dumps(permuted(document, rng), **how)
        self.assertEqual(canonicalHash(json.loads(text)), expected)

    @settings(max_examples=60, deadline=None)
    @given(documents, st.randoms(use_true_random=False))
    def test_hasherAgrees(self, document: Any, rng: Any) -> None:
        """
        CardHasher gives the canonical hash cold and cached, through every
        entry point, and a reordered copy is a cache hit.
        """
        hasher = CardHasher(None)
        expected = canonicalHash(document)
        self.assertIsNone(hasher.cached(document))
        results: list[str] = []
        hasher.hash(document).addCallback(results.append)
        self.assertEqual(results, [expected])
        self.assertEqual(hasher.computed, 1)
        self.assertEqual(hasher.cached(document), expected)
        self.assertEqual(hasher.hashNow(permuted(document, rng)), expected)
        hasher.hash(json.loads(json.dumps(document, indent=3))).addCallback(results.append)
        self.assertEqual(results, [expected, expected])
        self.assertEqual(hasher.computed, 1)

    @settings(max_examples=40, deadline=None)
    @given(st.lists(documents, min_size=1, max_size=12))
    def test_hasherCacheBounded(self, many: list[Any]) -> None:
        hasher = CardHasher(None, cacheSize=4)
        for document in many:
            self.assertEqual(hasher.hashNow(document), canonicalHash(document))
        self.assertLessEqual(len(hasher._cache), 4)


class PatchProperties(SynchronousTestCase):
    @settings(max_examples=100, deadline=None)
    @given(documents, documents)
    def test_roundTrip(self, base: Any, target: Any) -> None:
        """
        make_patch(base, target) applied to base gives target, and leaves
        base as it was.
        """
        before = copy.deepcopy(base)
        operations = jsonpatch.make_patch(base, target).patch
        self.assertEqual(jsonpatch.apply_patch(base, operations), target)
        self.assertEqual(base, before)

    @settings(max_examples=100, deadline=None)
    @given(documents, documents)
    def test_smallerPatchExact(self, base: Any, target: Any) -> None:
        """
        card-cache's patch is either refused (None) or smaller than the
        target and reproduces it exactly: the same canonical hash, so true
        never stands in for 1.  Neither input is changed (it runs in threads
        on shared documents).
        """
        frozen = (json.dumps(base, sort_keys=True), json.dumps(target, sort_keys=True))
        size = jsonSize(target)
        operations = smallerPatch(base, target, size)
        self.assertEqual(
            (json.dumps(base, sort_keys=True), json.dumps(target, sort_keys=True)), frozen
        )
        if operations is None:
            return
        self.assertLess(jsonSize(operations), size)
        patched = jsonpatch.apply_patch(base, operations)
        self.assertEqual(canonicalHash(patched), canonicalHash(target))

    def test_trueIsNotOne(self) -> None:
        """
        The case that makes verification necessary: some jsonpatch releases
        (1.33) see no change from 1 to true inside an array.  Whatever the
        installed release does, the plugin's patch is either refused or
        reproduces the target exactly, true and not 1.
        """
        base, target = {"a": [1, 2], "pad": "x" * 50}, {"a": [True, 2], "pad": "x" * 50}
        operations = smallerPatch(base, target, jsonSize(target))
        if operations is not None:
            patched = jsonpatch.apply_patch(base, operations)
            self.assertIs(patched["a"][0], True)
            self.assertEqual(canonicalHash(patched), canonicalHash(target))
        self.assertNotEqual(canonicalHash(base), canonicalHash(target))


_edits = st.one_of(
    st.tuples(st.just("description"), st.text(max_size=30)),
    st.tuples(st.just("tag+"), st.text(max_size=10)),
    st.tuples(st.just("tag-"), st.integers(0, 5)),
    st.tuples(st.just("ext"), st.tuples(st.sampled_from("abc"), _scalars)),
    st.tuples(st.just("entry+"), st.text(max_size=40)),
    st.tuples(st.just("entry-"), st.integers(0, 5)),
    st.tuples(st.just("same"), st.none()),
)


def edited(card: dict[str, Any], edit: tuple[str, Any]) -> dict[str, Any]:
    card = copy.deepcopy(card)
    data = card["data"]
    kind, value = edit
    book = data.setdefault("character_book", {"name": "lore", "extensions": {}, "entries": []})
    if kind == "description":
        data["description"] = value
    elif kind == "tag+":
        data["tags"].append(value)
    elif kind == "tag-" and data["tags"]:
        del data["tags"][value % len(data["tags"])]
    elif kind == "ext":
        data["extensions"][value[0]] = value[1]
    elif kind == "entry+":
        book["entries"].append({"keys": [value[:5]], "content": value})
    elif kind == "entry-" and book["entries"]:
        del book["entries"][value % len(book["entries"])]
    return card


class SessionOfEditsProperties(SynchronousTestCase):
    @settings(max_examples=40, deadline=None)
    @given(st.lists(_edits, min_size=1, max_size=20), st.booleans())
    def test_everyTransferAccepted(self, edits: list[tuple[str, Any]], sameCard: bool) -> None:
        """
        A game sends a snapshot every turn while editing its card a little;
        card-cache turns them into references and patches, and RPEngine's
        own cache (the simulator's, hashing independently) accepts every
        one of them with the hash of the card the game sent.  Never more
        bytes than the snapshots would have been.
        """
        harness = PluginHarness(CardCache(CardHasher(None), Timeline()))
        harness.startSession()
        engine = SessionCardStore()
        card = exampleCard()
        snapshots = sent = 0
        for turn, edit in enumerate(edits):
            if not (sameCard and turn % 2):
                card = edited(card, edit)
            requestId = f"r{turn}"
            transfer = snapshotTransfer(copy.deepcopy(card), "0" * 64)
            harness.toEngine(
                "reply.request",
                requestId=requestId,
                integrationId="game",
                characterId="mira",
                event={"text": "hi"},
                card=transfer,
            )
            out = harness.sentToEngine[-1]["card"]
            targetHash, document = engine.resolve(out)
            self.assertEqual(targetHash, simulatorHash(card))
            self.assertEqual(simulatorHash(document), targetHash)
            harness.toGame("reply.accepted", requestId=requestId)
            harness.toGame("reply.completed", requestId=requestId)
            snapshots += jsonSize(snapshotTransfer(card, targetHash))
            sent += jsonSize(out)
        self.assertEqual(engine.transfers[0][0], "snapshot")
        self.assertLessEqual(sent, snapshots)
