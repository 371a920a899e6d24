"""
Recall (issue 33, part 1): every entry and memory is in the store's full-text
index, kept in step with the entries; memories are kept, exported and
restored with their conversation.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from bench.recall import measure
from rpmiddleware.builtin.memory import IConversationMemory, Memory
from rpmiddleware.builtin.memory.conversation import (
    CHARACTER,
    COMPLETE,
    PLAYER,
    Conversation,
    Entry,
    Key,
    MemoryItem,
)
from rpmiddleware.builtin.memory.planner import Limits, lineOf, plan
from rpmiddleware.builtin.memory.recall import (
    ENTRY,
    MEMORY,
    Found,
    Recalled,
    block,
    chosen,
    entryLine,
    queryOf,
    queryWords,
    rank,
)
from rpmiddleware.builtin.memory.search import RECALL_SPAN
from rpmiddleware.builtin.memory.sessionindex import SessionIndex
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.builtin.memory.storeerrors import InvalidDocument
from rpmiddleware.builtin.memory.summarizer import SUMMARIZER_ID
from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.plugin import renderMacros
from rpmiddleware.protocol.prompt import AssembledPrompt
from rpmiddleware.testing.inmemory import connectInMemory
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.simoptions import SimulatorOptions, defaultReplyText
from rpmiddleware.testing.simsummaries import isSummaryRequest, lossySummary
from tests.support.client import clockedEndpoint
from tests.support.connections import OpenConnections
from tests.support.memory import assertAssembledAsPlanned, settle

KEY = Key("game", "mira", "save-1")
KEY_A = Key("game", "mira", "session:a")
KEY_B = Key("game", "mira", "session:b")


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


class QueryTests(SynchronousTestCase):
    def test_wordsOfTheLineWithoutStopWords(self) -> None:
        self.assertEqual(
            queryWords("What did I tell you about my SISTER's bees?", "the gate"),
            ["sister", "bees", "gate"],
        )
        self.assertEqual(queryOf("Sister, sister!"), '"sister"')
        self.assertIsNone(queryOf("What was it?", ""))

    @settings(max_examples=200, deadline=None)
    @given(
        # Assigned characters (an unassigned or private one joins a word in
        # SQLite's tokenizer, not in Python's: no player types those).
        st.text(st.characters(categories=["L", "N", "P", "S", "Zs"]), max_size=80),
        st.text(alphabet='"*^:-+()NEAROTD ', max_size=30),
    )
    def test_anyTextIsOnlyWords(self, text: str, operators: str) -> None:
        """
        Whatever a player types (quotes, operators, column filters), the
        query is valid FTS5 and finds an entry holding one of its words.
        """
        db = sqlite3.connect(":memory:")
        db.execute("CREATE VIRTUAL TABLE t USING fts5 (text, tokenize='porter unicode61')")
        db.execute("INSERT INTO t (text) VALUES (?)", (text + " " + operators,))
        match = queryOf(text + " " + operators)
        if match is None:
            self.assertEqual(queryWords(text + " " + operators), [])
            return
        found = db.execute("SELECT count(*) FROM t WHERE t MATCH ?", (match,)).fetchone()[0]
        if text.isascii():
            # (SQLite's Unicode tables are older than Python's: a symbol
            # new to one may be a letter to the other.)
            self.assertEqual(found, 1)


TEXT_ONLY = {"modalities": ["text"], "language": "en"}
PADDING = "The rain keeps falling on the old roads and the fields beyond them. " * 4


def forgetfulReplies(request: dict[str, Any]) -> str:
    """Replies as the simulator makes them; summaries that keep nothing."""
    if request.get("characterId") == SUMMARIZER_ID:
        return "They talked at length."
    return defaultReplyText(request)


class Rig:
    """The default chain and the simulated RPEngine, on a Clock."""

    def __init__(self, **memory: Any) -> None:
        self.clock = Clock()
        config = Settings()
        config.plugins["memory"] = {"path": ":memory:", "max_input_tokens": 1000, **memory}
        self.middleware = Middleware.fromSettings(self.clock, config)
        options = SimulatorOptions(replyText=forgetfulReplies)
        self.link = connectInMemory(self.middleware, self.clock, options)
        settle(self.clock, 0.1)
        plugin = self.middleware.plugin(IConversationMemory)
        assert isinstance(plugin, Memory)
        self.memory = plugin

    @property
    def last(self) -> AssembledPrompt:
        """The model invocation of the last turn (not a summary's after it)."""
        return self.link.engine.invocations[self._turn]

    def say(self, text: str, wait: float = 3.0, **meta: Any) -> ReplyStream:
        self._turn = len(self.link.engine.invocations)
        stream = self.middleware.requestReply(
            "mira",
            text=text,
            card=exampleCard(),
            output=TEXT_ONLY,
            player={"displayName": "Alex"},
            meta={"client": "c1", "conversation": "save-1", **meta},
        )
        settle(self.clock, wait)
        return stream

    def pad(self, turns: int, **meta: Any) -> None:
        for i in range(turns):
            self.say(f"Line {i}. {PADDING}", **meta)

    def remembered(self) -> str:
        """The "What ... remembers" block of the last invocation, or ""."""
        system = self.last.system
        start = system.find("remembers]\n")
        return "" if start < 0 else system[start:].split("\n\n")[0]


class RecallTests(SynchronousTestCase):
    def test_oldDetailComesBackWhenAskedByItsTopic(self) -> None:
        """
        A detail the summary dropped and the history no longer holds is
        given to the model, quoted with its speaker, when the player asks
        about its topic; the newest exchange is kept and the prompt fits.
        """
        rig = Rig()
        rig.say("My sister Jolene keeps bees on the cliffs of Tarn.")
        rig.pad(12)
        self.assertNotIn("Jolene", rig.last.system + str(rig.last.history))
        self.successResultOf(rig.say("Do you remember my sister?").done)
        self.assertIn('Alex said: "My sister Jolene keeps bees', rig.remembered())
        self.assertTrue(rig.last.history[-1][1].startswith('You said "Line 11.'))
        self.assertLessEqual(rig.last.tokens, rig.last.limit)
        report = rig.middleware.timeline.recent()[-1].details["memory"]
        self.assertGreaterEqual(report["recall"]["moments"], 1)

    def test_whatTheHistoryHoldsIsNotRecalled(self) -> None:
        rig = Rig()
        rig.say("My sister Jolene keeps bees on the cliffs of Tarn.")
        rig.say("Do you remember my sister?")
        self.assertIn(
            ("user", "My sister Jolene keeps bees on the cliffs of Tarn."), rig.last.history
        )
        self.assertEqual(rig.remembered(), "")

    def test_memoriesAreRecalledByImportance(self) -> None:
        rig = Rig()
        rig.say("Hello.")
        rig.memory.remember("mira", "save-1", "Alex is terrified of the open sea.", 0.9)
        rig.say("Shall we take the boat across the sea?")
        self.assertIn("- Alex is terrified of the open sea.", rig.remembered())

    def test_offBySettingOrBudget(self) -> None:
        for setting in ({"recall": False}, {"recall_tokens": 0}, {"recall_moments": 0}):
            rig = Rig(**setting)
            rig.say("My sister Jolene keeps bees on the cliffs of Tarn.")
            rig.pad(12)
            rig.say("Do you remember my sister?")
            self.assertEqual(rig.remembered(), "", setting)
            self.assertNotIn("Jolene", rig.last.system)

    def test_recallGivesWayBeforeTheNewestExchange(self) -> None:
        """
        With a budget larger than the prompt has room for, moments go
        before the newest exchange does, and RPEngine never refuses it.
        """
        rig = Rig(max_input_tokens=700, recall_tokens=2000, recall_moments=20)
        for i in range(10):
            rig.say(f"Remember the sister, number {i}, of the bees of Tarn. {PADDING}")
        stream = rig.say(f"Tell me of my sister and the bees of Tarn. {PADDING}")
        self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        self.assertLessEqual(rig.last.tokens, rig.last.limit)
        self.assertTrue(rig.last.history[-2][1].startswith("Remember the sister, number 9"))
        self.assertTrue(rig.last.user.startswith("Tell me of my sister"))

    def test_searchRunsOnTheReaderAndHoldsTheEnvelopesInOrder(self) -> None:
        """
        The index is searched on the store's reader (a Lane: a thread of
        its own in the daemon), and while it is, the request and the cancel
        sent after it wait, in order.
        """
        rig = Rig()
        rig.say("My sister Jolene keeps bees on the cliffs of Tarn.")
        rig.pad(12)
        store = rig.memory.store
        searches: list[Deferred[Any]] = []
        run = store._reader.run

        def later(work: Any) -> Deferred[Any]:
            d: Deferred[Any] = Deferred()
            searches.append(d)
            d.addCallback(lambda _: run(work))
            return d

        store._reader.run = later  # type: ignore[method-assign]
        received = rig.link.engine.receivedMessages
        before = len(received)
        stream = rig.say("Do you remember my sister?", wait=0)
        stream.cancel()
        self.assertEqual(len(received), before, "nothing passes while the search runs")
        store._reader.run = run  # type: ignore[method-assign]
        [search] = searches
        search.callback(None)
        settle(rig.clock, 3.0)
        self.failureResultOf(stream.done)
        mine = [m for m in received[before:] if m.get("requestId") == stream.requestId]
        self.assertEqual([m["type"] for m in mine[:2]], ["reply.request", "request.cancel"])
        self.assertIn("Jolene", json.dumps(mine[0]["card"]), "recalled once the search was done")


class SceneRecallTests(SynchronousTestCase):
    def test_aCharacterRecallsOnlyWhatItHeard(self) -> None:
        """
        The player tells the guard a secret before the innkeeper joins the
        scene; asked about it later, the guard recalls it and the innkeeper,
        searched with the same words, finds nothing of it.
        """
        clock = Clock()
        config = Settings()
        config.plugins["memory"] = {"path": ":memory:", "summaries": False, "max_input_tokens": 700}
        middleware = Middleware.fromSettings(clock, config)
        lines = {"garrick": "Halt.", "mara": "Hello there."}
        replies = SimulatorOptions(replyText=lambda r: lines[str(r.get("characterId"))])
        link = connectInMemory(middleware, clock, replies)
        endpoint = clockedEndpoint(middleware, config, clock)
        clients = OpenConnections(endpoint, clock)
        middleware.router.observe(ExtensionBridge(clients))
        settle(clock, 0.1)
        connection, writer = clients.connect()

        def say(**message: Any) -> None:
            clients.say(connection, **message)

        def turn(text: str) -> AssembledPrompt:
            before = len(link.engine.invocations)
            say(type="text", text=text)
            settle(clock, 30)
            return link.engine.invocations[before]

        guard = exampleCard(name="Garrick", description="The gate's guard.", mes_example="")
        innkeeper = exampleCard(name="Mara", description="The innkeeper.", mes_example="")
        say(type="memory", op="use", conversationId="save-1")
        say(type="character", characterId="garrick", card=guard)
        say(type="configure", player={"displayName": "Alex"})
        cast = [{"characterId": "garrick", "card": guard, "voice": "M2"}]
        say(type="scene", op="open", sceneId="gate", cast=cast, reactions=0)
        turn("Garrick, the Marigold password opens the cellar under the mill.")
        for i in range(8):
            turn(f"Garrick, line {i}. {PADDING}")
        member = {"characterId": "mara", "card": innkeeper, "voice": "F3"}
        say(type="scene", op="join", member=member)
        say(type="scene", op="address", characterId="mara")
        mara = turn("Mara, what does the Marigold password open?")
        self.assertNotIn("cellar", mara.system + json.dumps(mara.history))
        say(type="scene", op="address", characterId="garrick")
        garrick = turn("Garrick, what does the Marigold password open?")
        self.assertIn('Alex said: "Garrick, the Marigold password opens the cellar', garrick.system)
        self.assertNotIn("cellar", json.dumps(garrick.history))
        plugin = middleware.plugin(IConversationMemory)
        assert isinstance(plugin, Memory)
        found = {
            character: self.successResultOf(
                plugin.store.searchLater(
                    Key("rpmiddleware", character, "save-1"), ["cellar"], 1, 10, 10, 10
                )
            )
            for character in ("garrick", "mara")
        }
        self.assertEqual(len(found["garrick"]), 1)
        self.assertEqual(found["mara"], [])


class MeasuredTests(SynchronousTestCase):
    def test_oldDetailsReachTheModel(self) -> None:
        """
        Issue 33, part 5 (bench/recall.py's run, on a Clock): 40 details told
        over 500 turns of long lines, the simulator's summaries keeping only
        the newest 3; asked about each of the 37 older ones by its topic, at
        least 90% reach the model's input; no turn is refused or over the
        limit, and every one keeps the newest exchange.
        """
        measured = measure(turns=500, details=40, keptDetails=3, recall=True)
        self.assertEqual(len(measured.asked), 37)
        self.assertGreaterEqual(measured.share, 0.9, measured.reached)
        self.assertEqual((measured.refused, measured.overLimit, measured.newestMissing), (0, 0, 0))
        self.assertEqual(measured.invocations, 537)

    def test_summariesAreAsLossyAsASmallModels(self) -> None:
        """The simulator's lossy summary keeps the newest details only."""
        request = {
            "event": {
                "text": "The summary so far of the conversation between Alex and Mira:\n"
                "They talked. Remember this: my dog is Rex.\n\nWhat was said since:\n"
                "Alex: Remember this: my horse is Ash. The rain falls.\n"
                'Mira: You said "Remember this: my horse is Ash."\n'
                "Alex: Remember this: my sister is Jo.\n\n"
                "Write the updated summary in at most 250 words."
            }
        }
        self.assertTrue(isSummaryRequest(request))
        self.assertEqual(
            lossySummary(request, 2),
            "They talked at length. Remember this: my horse is Ash. "
            "Remember this: my sister is Jo.",
        )
        self.assertFalse(isSummaryRequest({"event": {"text": "Hello"}}))


class RankTests(SynchronousTestCase):
    def conversation(self) -> Conversation:
        conversation = Conversation(KEY)
        for seq in range(1, 401):
            conversation.entries.append(Entry(seq, PLAYER, f"line {seq}", speaker="Alex", at=seq))
        conversation.memories.append(MemoryItem(1, "Alex fears the sea.", 1.0, at=10.5))
        return conversation

    def test_relevanceFirstThenRecencyAndImportance(self) -> None:
        conversation = self.conversation()
        found = [
            Found(ENTRY, 5, -2.0),  # old, a quarter as relevant as the best
            Found(ENTRY, 300, -2.0),  # as relevant, recent
            Found(ENTRY, 2, -8.0),  # the oldest, the most relevant
            Found(ENTRY, 350, -2.5),  # a little more relevant, more recent
            Found(ENTRY, 351, -7.9),  # in the history: never recalled
            Found(ENTRY, 352, -1.9),  # under a quarter of the best: dropped
            Found(MEMORY, 1, -2.0),  # old, as relevant as 5, more important
        ]
        moments = rank(conversation, found, 351, "Mira", "Alex")
        # 1.0 x relevance + 0.5 x recency (halving every 200 entries back
        # from 400) + 0.5 x importance (0.6 for the player's lines).
        self.assertEqual(
            [m.text for m in moments],
            [
                '- Alex said: "line 2"',  # 1 + 0.13 + 0.3
                '- Alex said: "line 350"',  # 0.31 + 0.42 + 0.3
                '- Alex said: "line 300"',  # 0.25 + 0.35 + 0.3
                "- Alex fears the sea.",  # 0.25 + 0.13 + 0.5
                '- Alex said: "line 5"',  # 0.25 + 0.13 + 0.3
            ],
        )
        # The block reads in the order things happened; the budget keeps the best.
        kept = chosen(moments, tokens=100, count=3)
        self.assertEqual(
            block(kept).splitlines(),
            ['- Alex said: "line 2"', '- Alex said: "line 300"', '- Alex said: "line 350"'],
        )
        self.assertEqual(len(chosen(moments, tokens=moments[0].tokens, count=9)), 1)


_line = st.text(alphabet="ab cdé.\n{}<>", max_size=300)


class RecallPlanHoldsProperties(SynchronousTestCase):
    """
    With recalled moments, what the plugin plans RPEngine's assembly still
    takes whole: no C{prompt_too_large}, no chat message left out, the same
    estimate, the newest entry last; recall stays in its budget and never
    repeats a line of the history.
    """

    @settings(max_examples=50, deadline=None, derandomize=True)
    @given(
        lines=st.lists(_line, min_size=10, max_size=40),
        found=st.lists(st.tuples(st.integers(1, 20), st.floats(-20.0, -0.01)), max_size=30),
        memories=st.lists(_line.filter(lambda t: t.strip() != ""), max_size=4),
        limit=st.integers(300, 3000),
        budget=st.integers(0, 3000),
        count=st.integers(0, 10),
        summary=_line,
    )
    def test_planWithRecallFitsRPEngine(
        self,
        lines: list[str],
        found: list[tuple[int, float]],
        memories: list[str],
        limit: int,
        budget: int,
        count: int,
        summary: str,
    ) -> None:
        store = MemoryStore(":memory:", lambda: 0.0)
        conversation = Conversation(KEY)
        store.append(
            conversation,
            *(
                # Long lines, so that the history leaves the older ones out.
                (PLAYER if i % 2 == 0 else CHARACTER, "Alex", t + " w" * 100, COMPLETE)
                for i, t in enumerate(lines)
            ),
        )
        conversation.summary = summary
        for text in memories:
            store.remember(conversation, text, 0.5)
        matches = [Found(ENTRY, seq, score) for seq, score in found]
        matches += [Found(MEMORY, m.id, -1.0) for m in conversation.memories]
        card = exampleCard()
        request = {
            "event": {"text": "What of the bees?"},
            "output": {"modalities": ["text"], "language": "en"},
            "player": {"displayName": "Alex"},
        }
        made = plan(
            request,
            card,
            conversation,
            [],
            Limits(limit),
            False,
            4,
            None,
            False,
            recalled=Recalled(matches, budget, count),
        )
        if made.card is None:
            return
        result = assertAssembledAsPlanned(self, request, made.card, made.report, limit)
        self.assertLessEqual(result.tokens, limit)
        recall = made.report["recall"]
        self.assertLessEqual(recall["moments"], count)
        self.assertLessEqual(recall["estimatedTokens"], budget)
        kept = made.report["history"]["kept"]
        if kept:
            newest = lineOf(conversation.entries[-1], ("x", "y"))
            if newest is not None:
                self.assertEqual(
                    result.history[-1][1], renderMacros(newest[1], "Mira the Innkeeper", "Alex")
                )
        # Nothing recalled is in the history: every recalled entry is older.
        first = len(conversation.entries) - kept + 1
        block = made.card["data"].get("scenario", "").split("remembers]\n")[-1]
        shown = set(block.split("\n"))
        for entry in conversation.entries[first - 1 :]:
            self.assertNotIn(entryLine(entry, "Mira the Innkeeper", "Alex"), shown)


class RememberOpTests(SynchronousTestCase):
    def test_aGameKeepsAMemoryOverTheClientProtocol(self) -> None:
        clock = Clock()
        config = Settings()
        config.plugins["memory"] = {"path": ":memory:"}
        middleware = Middleware.fromSettings(clock, config)
        connectInMemory(middleware, clock)
        endpoint = clockedEndpoint(middleware, config, clock)
        clients = OpenConnections(endpoint, clock)
        middleware.router.observe(ExtensionBridge(clients))
        settle(clock, 0.1)
        connection, writer = clients.connect()
        plugin = middleware.plugin(IConversationMemory)
        assert isinstance(plugin, Memory)

        def ask(**message: Any) -> dict[str, Any]:
            clients.say(connection, type="memory", **message)
            settle(clock, 0.1)
            return writer.sent[-1]

        ask(op="use", conversationId="save-1")
        said = ask(
            op="remember", id=7, characterId="mira", text="Alex fears the sea.", importance=0.9
        )
        self.assertEqual((said["type"], said["op"], said["id"]), ("memory-result", "remember", 7))
        stored = plugin.store.conversation(Key("rpmiddleware", "mira", "save-1"))
        self.assertEqual(
            [(m.text, m.importance, m.source) for m in stored.memories],
            [("Alex fears the sea.", 0.9, "game")],
        )
        for wrong, named in (
            ({"text": "x", "importance": 2}, "importance"),
            ({"text": "x", "source": ""}, "source"),
            ({"text": ""}, "text"),
        ):
            error = ask(op="remember", id=8, characterId="mira", **wrong)
            self.assertEqual((error["type"], error["code"]), ("error", "INVALID_MESSAGE"))
            self.assertIn(named, error["message"])
        self.assertEqual(len(stored.memories), 1)


class SessionRecallTests(SynchronousTestCase):
    def test_aSessionsConversationIsRecalledToo(self) -> None:
        """
        A client that names no conversation (its session's own, never
        written) is recalled from the session index.
        """
        rig = Rig()
        rig.say("My sister Jolene keeps bees on the cliffs of Tarn.", conversation=None)
        rig.pad(12, conversation=None)
        self.assertNotIn("Jolene", rig.last.system + str(rig.last.history))
        rig.say("Do you remember my sister?", conversation=None)
        self.assertIn('Alex said: "My sister Jolene keeps bees', rig.remembered())
        key = Key("rpmiddleware", "mira", "session:c1")
        self.assertEqual(len(rig.memory.sessions.conversation(key).entries), 28)
        self.assertIsNone(rig.memory.store.cached(Key("rpmiddleware", "mira", "save-1")))

    def test_indexFollowsTheConversation(self) -> None:
        kept = {KEY_A, KEY_B}
        index = SessionIndex(Clock(), lambda key: key in kept)
        store = MemoryStore(":memory:", lambda: 0.0)
        a, b = Conversation(KEY_A), Conversation(KEY_B)
        store.append(a, (PLAYER, "Alex", "My sister keeps bees.", COMPLETE))
        store.append(a, (CHARACTER, "Mira", "Bees, in winter?", COMPLETE))
        store.append(b, (PLAYER, "Alex", "My sister sails.", COMPLETE))

        def found(conversation: Conversation, *words: str) -> list[tuple[str, int]]:
            d = index.searchLater(conversation, list(words), 99, 10, 10, 10)
            return sorted((f.kind, f.ref) for f in self.successResultOf(d))

        self.assertEqual(found(a, "sister", "bees"), [(ENTRY, 1), (ENTRY, 2)])
        self.assertEqual(found(b, "sister"), [(ENTRY, 1)], "only its own conversation")
        store.cut(a, 1, "My brother")
        self.assertEqual(found(a, "sister"), [])
        self.assertEqual(found(a, "brother"), [(ENTRY, 1)])
        store.edit(a, 2, None)
        store.remember(a, "Alex fears bees.", 0.9)
        self.assertEqual(found(a, "bees"), [(MEMORY, 1)])
        # A session over: its rows go; one no longer kept goes at the next search.
        index.forget([KEY_A])
        kept.discard(KEY_B)
        self.assertEqual(found(Conversation(KEY_A), "bees", "brother"), [])
        db = index._open()
        self.assertEqual(db.execute("SELECT count(*) FROM recall").fetchone()[0], 0)
