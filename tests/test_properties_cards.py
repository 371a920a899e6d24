"""
Property tests for card identity and card transfers: the canonical hash
ignores key order and whitespace, L{CardHasher} agrees with it for owned
and unowned documents, L{rpmiddleware.cards.diff} patches round-trip, and
over a whole session of small edits every transfer card-cache chooses is one
RPEngine's own cache accepts with the right hash.
"""

from __future__ import annotations

import copy
import gc
import json
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.card_cache import CardCache, jsonSize, smallerPatch
from rpmiddleware.cards.diff import applyPatch, diff
from rpmiddleware.cards.validation import CanonicalCard, CardHasher, canonicalHash, snapshotTransfer
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.cardstore import SessionCardStore, simulatorHash
from rpmiddleware.testing.kit import PluginHarness, exampleCard

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
        CardHasher gives the canonical hash through every entry point, with a
        private copy equal to the document; the copy is then found by
        identity without being read again.
        """
        hasher = CardHasher(None)
        expected = canonicalHash(document)
        self.assertIsNone(hasher.known(document))
        cards: list[CanonicalCard] = []
        hasher.canonical(document).addCallback(cards.append)
        [card] = cards
        self.assertEqual((card.hash, card.document), (expected, document))
        self.assertIsNot(card.document, document)
        self.assertEqual(card.size, jsonSize(document))
        self.assertEqual(hasher.computed, 1)
        for again in (hasher.known(card.document), hasher.canonicalNow(card.document)):
            assert again is not None
            self.assertIs(again.document, card.document)
            self.assertEqual((again.hash, again.size), (card.hash, card.size))
        self.assertEqual(hasher.computed, 1)
        self.assertEqual(hasher.hashNow(permuted(document, rng)), expected)
        self.assertEqual(hasher.computed, 2)

    @settings(max_examples=40, deadline=None)
    @given(documents, documents)
    def test_unownedDocumentsReadEachTime(self, first: Any, second: Any) -> None:
        """
        A document the hasher does not own may change in place between
        turns (a game's dict): its hash always follows its content.
        """
        hasher = CardHasher(None)
        mutable = dict(first)
        self.assertEqual(hasher.hashNow(mutable), canonicalHash(first))
        mutable.clear()
        mutable.update(second)
        self.assertEqual(hasher.hashNow(mutable), canonicalHash(second))

    @settings(max_examples=40, deadline=None)
    @given(documents)
    def test_adoptedNotCopied(self, document: Any) -> None:
        """
        An adopted document is only given a new top: its contents are not
        copied, and its hash is computed once.
        """
        hasher = CardHasher(None)
        owned = hasher.adopt(document)
        self.assertEqual(owned, document)
        self.assertIs(hasher.adopt(owned), owned)
        for key in document:
            self.assertIs(owned[key], document[key])
        self.assertIsNone(hasher.known(owned))
        card = hasher.canonicalNow(owned)
        self.assertIs(card.document, owned)
        self.assertEqual(card.hash, canonicalHash(document))
        self.assertEqual(hasher.computed, 1)
        hasher.canonicalNow(owned)
        self.assertEqual(hasher.computed, 1)

    @settings(max_examples=40, deadline=None)
    @given(st.lists(documents, min_size=1, max_size=12))
    def test_hasherMemoryBounded(self, many: list[Any]) -> None:
        """
        Owned documents are remembered only while something else keeps
        them; hashes by content (for the slow encoder) in a bounded cache.
        """
        hasher = CardHasher(None, cacheSize=4)
        owned = [hasher.canonicalNow(document) for document in many]
        for document, card in zip(many, owned, strict=True):
            self.assertEqual(card.hash, canonicalHash(document))
        self.assertEqual(len(hasher._owned), len(many))
        self.assertLessEqual(len(hasher._slow), 4)
        last = owned[-1].document
        del owned[:]
        gc.collect()
        self.assertEqual(len(hasher._owned), 1)
        self.assertIsNotNone(hasher.known(last))


def frozen(*values: Any) -> list[str]:
    return [json.dumps(value, sort_keys=True) for value in values]


class PatchProperties(SynchronousTestCase):
    @settings(max_examples=150, deadline=None)
    @given(documents, documents)
    def test_diffRoundTrip(self, base: Any, target: Any) -> None:
        """
        diff(base, target) applied to base with applyPatch gives target,
        for jsonpatch too, and changes neither the inputs nor the patch.
        """
        before = frozen(base, target)
        operations = diff(base, target, limit=10_000)
        assert operations is not None
        opsBefore = frozen(operations)
        self.assertEqual(applyPatch(base, operations), target)
        self.assertEqual(jsonpatch.apply_patch(base, operations), target)
        self.assertEqual(frozen(base, target), before)
        self.assertEqual(frozen(operations), opsBefore)

    @settings(max_examples=150, deadline=None)
    @given(documents, documents)
    def test_applyLikeJsonpatch(self, base: Any, target: Any) -> None:
        """
        Any patch (here make_patch's, with moves and copies) applies as
        jsonpatch applies it, leaving base and the patch unchanged.
        """
        operations = jsonpatch.make_patch(base, target).patch
        before = frozen(base, operations)
        self.assertEqual(applyPatch(base, operations), jsonpatch.apply_patch(base, operations))
        self.assertEqual(frozen(base, operations), before)

    @settings(max_examples=100, deadline=None)
    @given(documents, documents)
    def test_smallerPatchExact(self, base: Any, target: Any) -> None:
        """
        card-cache's patch is either refused (None) or smaller than the
        target and reproduces it exactly: the same canonical hash, so true
        never stands in for 1.  Neither input is changed.
        """
        hasher = CardHasher(None)
        old, new = hasher.canonicalNow(base), hasher.canonicalNow(target)
        before = frozen(old.document, new.document)
        operations = smallerPatch(old, new)
        self.assertEqual(frozen(old.document, new.document), before)
        if operations is None:
            return
        self.assertLess(jsonSize(operations), new.size)
        patched = jsonpatch.apply_patch(base, operations)
        self.assertEqual(canonicalHash(patched), canonicalHash(target))

    def test_trueIsNotOne(self) -> None:
        """
        The case that makes verification necessary: Python's == sees no
        change from 1 to true inside an array.  The plugin's patch is either
        refused or reproduces the target exactly, true and not 1.
        """
        base, target = {"a": [1, 2], "pad": "x" * 50}, {"a": [True, 2], "pad": "x" * 50}
        self.assertEqual(diff(base, target), [])
        hasher = CardHasher(None)
        self.assertIsNone(smallerPatch(hasher.canonicalNow(base), hasher.canonicalNow(target)))
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
        # Every field RPEngine requires of an entry (json_core.rs validate_card_value).
        book["entries"].append(
            {
                "keys": [value[:5]],
                "content": value,
                "extensions": {},
                "enabled": True,
                "insertion_order": len(book["entries"]),
            }
        )
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
            targetHash, document = engine.resolve(out, "game", "mira")
            self.assertEqual(targetHash, simulatorHash(card))
            self.assertEqual(simulatorHash(document), targetHash)
            harness.toGame("reply.accepted", requestId=requestId, resolvedCardHash=targetHash)
            harness.toGame("reply.completed", requestId=requestId)
            snapshots += jsonSize(snapshotTransfer(card, targetHash))
            sent += jsonSize(out)
        self.assertEqual(engine.transfers[0][0], "snapshot")
        self.assertLessEqual(sent, snapshots)
