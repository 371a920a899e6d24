"""
L{rpmiddleware.cards.diff}: patches a person would write for a game's small
edits, bounded in length, applied without copying the whole card.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.cards.diff import OPERATION_LIMIT, applyPatch, diff


def lore(n: int) -> dict[str, Any]:
    return {
        "data": {
            "name": "Mira",
            "entries": [{"keys": [f"k{i}"], "content": f"entry {i}"} for i in range(n)],
        }
    }


class DiffTests(SynchronousTestCase):
    def test_equalIsEmpty(self) -> None:
        self.assertEqual(diff(lore(5), lore(5)), [])

    def test_insertAtFrontIsOneAdd(self) -> None:
        """
        make_patch rewrites every shifted element (and takes 200 ms on a
        200 KB card); trimming the common suffix leaves one add.
        """
        base, target = lore(300), lore(300)
        new = {"keys": ["fresh"], "content": "new"}
        target["data"]["entries"].insert(0, new)
        self.assertEqual(
            diff(base, target), [{"op": "add", "path": "/data/entries/0", "value": new}]
        )

    def test_removeFromMiddleIsOneRemove(self) -> None:
        base, target = lore(300), lore(300)
        del target["data"]["entries"][150]
        self.assertEqual(diff(base, target), [{"op": "remove", "path": "/data/entries/150"}])

    def test_changedEntryIsOneReplace(self) -> None:
        base, target = lore(300), lore(300)
        target["data"]["entries"][42]["content"] = "changed"
        self.assertEqual(
            diff(base, target),
            [{"op": "replace", "path": "/data/entries/42/content", "value": "changed"}],
        )

    def test_tooManyOperations(self) -> None:
        """
        A rewrite (here the lorebook reversed, 21 s for make_patch) stops at
        the limit: a snapshot is sent instead.
        """
        base, target = lore(300), lore(300)
        target["data"]["entries"].reverse()
        self.assertIsNone(diff(base, target))
        operations = diff(base, target, limit=10_000)
        assert operations is not None
        self.assertGreater(len(operations), OPERATION_LIMIT)
        self.assertEqual(applyPatch(base, operations), target)

    def test_keysEscaped(self) -> None:
        base, target = {"a/b": 1, "c~d": 2}, {"a/b": 3, "c~d": 4}
        self.assertEqual(
            diff(base, target),
            [
                {"op": "replace", "path": "/a~1b", "value": 3},
                {"op": "replace", "path": "/c~0d", "value": 4},
            ],
        )

    def test_typeChangeReplaced(self) -> None:
        self.assertEqual(
            diff({"a": [1], "b": 1}, {"a": {"0": 1}, "b": 1.0}),
            [
                {"op": "replace", "path": "/a", "value": {"0": 1}},
                {"op": "replace", "path": "/b", "value": 1.0},
            ],
        )


class ApplyPatchTests(SynchronousTestCase):
    def test_sharesWhatItDoesNotTouch(self) -> None:
        base = lore(50)
        before = copy.deepcopy(base)
        patched = applyPatch(
            base, [{"op": "replace", "path": "/data/entries/3/content", "value": "x"}]
        )
        self.assertEqual(base, before)
        self.assertEqual(patched["data"]["entries"][3]["content"], "x")
        self.assertIsNot(patched["data"]["entries"], base["data"]["entries"])
        self.assertIsNot(patched["data"]["entries"][3], base["data"]["entries"][3])
        self.assertIs(patched["data"]["entries"][4], base["data"]["entries"][4])

    def test_writesInsideAnAddedValueLeaveThePatchAlone(self) -> None:
        """
        jsonpatch.apply_patch changes the value of an earlier add when a later
        operation writes inside it, so the patch it was given (and forwards)
        no longer means what it meant.
        """
        operations: list[dict[str, Any]] = [
            {"op": "add", "path": "/l", "value": []},
            {"op": "add", "path": "/l/0", "value": "x"},
        ]
        self.assertEqual(applyPatch({}, operations), {"l": ["x"]})
        self.assertEqual(operations[0]["value"], [])

    def test_moveThenWriteLeavesBaseAlone(self) -> None:
        base = {"a": {"x": 1}}
        patched = applyPatch(
            base,
            [{"op": "move", "from": "/a", "path": "/b"}, {"op": "add", "path": "/b/y", "value": 2}],
        )
        self.assertEqual(patched, {"b": {"x": 1, "y": 2}})
        self.assertEqual(base, {"a": {"x": 1}})

    def test_failuresAreJsonpatchErrors(self) -> None:
        for operations in (
            [{"op": "remove", "path": "/nope/deeper"}],
            [{"op": "test", "path": "/a", "value": 2}],
            [{"op": "frobnicate", "path": "/a"}],
        ):
            self.assertRaises(
                (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException),
                applyPatch,
                {"a": 1},
                operations,
            )
        self.assertRaises(jsonpatch.InvalidJsonPatch, applyPatch, {"a": 1}, {"op": "remove"})
