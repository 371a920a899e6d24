"""
Recall (issue 33, part 1): every entry and memory is in the store's full-text
index, kept in step with the entries; memories are kept, exported and
restored with their conversation.
"""

from __future__ import annotations

import sqlite3

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.memory.conversation import CHARACTER, COMPLETE, PLAYER, Key
from rpmiddleware.builtin.memory.store import RECALL_SPAN, InvalidDocument, MemoryStore

KEY = Key("game", "mira", "save-1")


def indexed(path: str, words: str) -> list[int]:
    """The recall index's row ids matching C{words}, read from the file."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT rowid FROM recall WHERE recall MATCH ? ORDER BY rowid", (words,)
        ).fetchall()
    finally:
        db.close()
    return [row[0] for row in rows]


class MemoriesTests(SynchronousTestCase):
    def test_rememberedInMemoryAtOnceAndKept(self) -> None:
        path = self.mktemp()
        store = MemoryStore(path, lambda: 7.0)
        conversation = store.conversation(KEY)
        kept = store.remember(conversation, " Alex fears the sea. ", 0.9, "reflection")
        self.assertIsNone(self.successResultOf(kept))
        [item] = conversation.memories
        self.assertEqual(
            (item.text, item.importance, item.at, item.source),
            ("Alex fears the sea.", 0.9, 7.0, "reflection"),
        )
        store.close()
        again = MemoryStore(path, lambda: 8.0).conversation(KEY)
        self.assertEqual([m.asDict() for m in again.memories], [item.asDict()])

    def test_wrongMemoriesAreRefusedByName(self) -> None:
        store = MemoryStore(":memory:", lambda: 0.0)
        conversation = store.conversation(KEY)
        for text, importance, source, word in [
            ("", 0.5, "game", "text"),
            ("x", 1.5, "game", "importance"),
            ("x", True, "game", "importance"),
            ("x", 0.5, "", "source"),
        ]:
            e = self.assertRaises(
                ValueError, store.remember, conversation, text, importance, source
            )
            self.assertIn(word, str(e))
        self.assertEqual(conversation.memories, [])

    def test_exportedAndRestored(self) -> None:
        store = MemoryStore(self.mktemp(), lambda: 3.0)
        conversation = store.conversation(KEY)
        store.append(conversation, (PLAYER, "Alex", "Hi", COMPLETE))
        store.remember(conversation, "Alex has a sister, Jo.", 0.8, "reflection")
        document = store.export(conversation)
        self.assertEqual(document["memories"][0]["text"], "Alex has a sister, Jo.")
        other = Key("game", "mira", "save-2")
        restored = store.restore(other, document)
        self.assertEqual([m.text for m in restored.memories], ["Alex has a sister, Jo."])
        changed = {**document, "memories": [{**document["memories"][0], "importance": 0.1}]}
        e = self.assertRaises(InvalidDocument, store.restore, other, changed)
        self.assertIn("checksum", str(e))
        bad = {**document, "memories": [{"text": "", "importance": 0.5}]}
        e = self.assertRaises(InvalidDocument, store.restore, other, bad)
        self.assertIn("memories[0].text", str(e))
        store.close()
        again = MemoryStore(store.path, lambda: 0.0)
        self.assertEqual(
            [m.text for m in again.conversation(other).memories], ["Alex has a sister, Jo."]
        )
        # Both conversations hold it, each in its own range of the index.
        self.assertEqual(
            indexed(store.path, "sister"), [-(2 * RECALL_SPAN + 2), -(RECALL_SPAN + 1)]
        )

    def test_oldExportWithoutMemoriesImports(self) -> None:
        store = MemoryStore(":memory:", lambda: 3.0)
        conversation = store.conversation(KEY)
        store.append(conversation, (PLAYER, "Alex", "Hi", COMPLETE))
        document = store.export(conversation)
        self.assertNotIn("memories", document)
        self.assertEqual(store.restore(Key("game", "mira", "b"), document).memories, [])


class IndexTests(SynchronousTestCase):
    def test_indexFollowsEntriesAndMemories(self) -> None:
        path = self.mktemp()
        store = MemoryStore(path, lambda: 1.0)
        conversation = store.conversation(KEY)
        store.append(
            conversation,
            (PLAYER, "Alex", "My sister lives by the harbour.", COMPLETE),
            (CHARACTER, "Mira", "The harbour is cold.", COMPLETE),
        )
        store.remember(conversation, "Alex's sisters are twins.", 0.7)
        base = 1 * RECALL_SPAN
        # Porter stemming: "sisters" finds "sister".
        self.assertEqual(indexed(path, "sister"), [-(base + 1), base + 1])
        store.edit(conversation, 1, "My brother lives by the harbour.")
        self.assertEqual(indexed(path, "sister"), [-(base + 1)])
        self.assertEqual(indexed(path, "brother"), [base + 1])
        store.edit(conversation, 2, None)
        self.assertEqual(indexed(path, "harbour"), [base + 1])
        store.forget(KEY)
        self.assertEqual(indexed(path, "harbour OR sister"), [])
        store.close()

    def test_fileWithoutIndexIsIndexedWhenOpened(self) -> None:
        path = self.mktemp()
        store = MemoryStore(path, lambda: 1.0)
        conversation = store.conversation(KEY)
        store.append(conversation, (PLAYER, "Alex", "The lantern is blue.", COMPLETE))
        store.close()
        db = sqlite3.connect(path)
        db.executescript(
            "DROP TABLE recall; DROP VIEW recall_source;"
            " DROP TRIGGER recall_entry_added; DROP TRIGGER recall_entry_removed;"
            " DROP TRIGGER recall_entry_changed; DROP TRIGGER recall_memory_added;"
            " DROP TRIGGER recall_memory_removed; DROP TRIGGER recall_memory_changed;"
            " INSERT INTO entries VALUES"
            " (1, 2, 'player', 'Alex', 'A green lantern.', 'complete', 2);"
        )
        db.close()
        MemoryStore(path, lambda: 1.0).check()
        self.assertEqual(indexed(path, "lantern"), [RECALL_SPAN + 1, RECALL_SPAN + 2])
        # Opened again: not built twice (the rows are there once).
        MemoryStore(path, lambda: 1.0).check()
        self.assertEqual(indexed(path, "green"), [RECALL_SPAN + 2])
