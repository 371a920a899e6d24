"""
Memory tied to a game's saves (issue 33, part 4): taking, loading, listing
and dropping saves through the C{memory} ops and the Python API, the next
request planned from a loaded save, forgetting by age or size, and the
store's size in C{/metrics}.  On a Clock; the store on a file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.memory import IConversationMemory, Memory, exports, memory, saves
from rpmiddleware.builtin.memory.conversation import CHARACTER, COMPLETE, PLAYER, Key
from rpmiddleware.builtin.memory.exports import parseExport
from rpmiddleware.builtin.memory.saves import BATCH, SAVE_FORMAT, SIZE_EVERY, DamagedSave, unseal
from rpmiddleware.builtin.memory.summarizer import isSummaryRequest
from rpmiddleware.cards.hasher import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.console.metrics import MiddlewareMetrics
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.clientext import TO_CLIENT, fromClient
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.inmemory import connectInMemory
from rpmiddleware.testing.kit import PluginHarness, exampleCard
from tests.support.lanes import HeldLane
from tests.support.memory import settle

GAME = "game"
DAY = 86400.0


def build(path: str, clock: Clock, **settings: Any) -> Memory:
    services = PluginServices(clock, Settings(), CardHasher(None), Timeline())
    plugin = memory.buildPlugin({"path": path, **settings}, services)
    assert isinstance(plugin, Memory)
    return plugin


class Game:
    """The memory plugin in a harness, and a client that speaks to it."""

    def __init__(self, testCase: SynchronousTestCase, **settings: Any) -> None:
        self.clock = Clock()
        self.clock.advance(1_000_000)
        self.path = os.path.abspath(testCase.mktemp())
        self.plugin = build(self.path, self.clock, **settings)
        self.harness = PluginHarness(self.plugin, clock=self.clock)
        self.turns = 0

    def ask(self, **message: Any) -> dict[str, Any]:
        """A memory op from client c1, and its answer."""
        before = len(self.harness.sentToGame)
        self.harness.toEngine(
            fromClient("c1", {"type": "memory", "integrationId": GAME, **message})
        )
        answers = [e for e in self.harness.sentToGame[before:] if e.type == TO_CLIENT]
        assert answers, f"memory {message.get('op')} was not answered"
        answer: dict[str, Any] = answers[-1]["message"]
        return answer

    def request(self, characterId: str, text: str) -> str:
        """A typed turn of c1 to C{characterId}, sent toward RPEngine; its request id."""
        self.turns += 1
        requestId = f"r{self.turns}"
        envelope = self.harness.replyRequest(
            requestId, text=text, characterId=characterId, meta={"client": "c1"}
        )
        self.harness.toEngine(envelope)
        return requestId

    def reply(self, requestId: str, text: str) -> None:
        self.harness.toGame("reply.text.completed", requestId=requestId, text=text)
        self.harness.toGame("reply.completed", requestId=requestId)

    def turn(self, characterId: str, text: str, reply: str) -> None:
        self.reply(self.request(characterId, text), reply)

    def said(self, characterId: str, conversationId: str = "world-1") -> list[str]:
        return [e["text"] for e in self.plugin.read(characterId, conversationId, GAME)["entries"]]


class SaveOpsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.game = Game(self)
        self.assertEqual(self.game.ask(op="use", conversationId="world-1")["type"], "memory-result")

    def test_saveHoldsEveryCharacterOfTheConversation(self) -> None:
        game = self.game
        game.turn("mira", "I lost my sister in the war.", "I am sorry.")
        game.turn("garrick", "Sharpen my sword.", "Two coins.")
        game.ask(op="pin", characterId="mira", fact="The player is called Alex.")
        game.ask(op="use", conversationId="world-2")
        game.turn("mira", "Another world entirely.", "Hello there.")
        game.ask(op="use", conversationId="world-1")
        answer = game.ask(op="save", id=4, saveId="slot-1")
        self.assertEqual((answer["type"], answer["op"], answer["id"]), ("memory-result", "save", 4))
        brief = answer["save"]
        self.assertEqual(
            {k: brief[k] for k in ("saveId", "integrationId", "conversationId", "characters")},
            {
                "saveId": "slot-1",
                "integrationId": GAME,
                "conversationId": "world-1",
                "characters": ["garrick", "mira"],
            },
        )
        self.assertEqual(brief["entries"], 4)
        self.assertEqual(brief["created"], game.clock.seconds())
        # In the file, sealed: the body is what export gives of each.
        db = sqlite3.connect(game.path)
        (body,) = db.execute("SELECT body FROM saves").fetchone()
        db.close()
        saved = unseal(body)
        self.assertEqual(saved["format"], SAVE_FORMAT)
        documents = {d["characterId"]: d for d in saved["conversations"]}
        self.assertEqual(documents["mira"], game.plugin.export("mira", "world-1", GAME))
        self.assertEqual(brief["bytes"], len(body.encode("utf-8")))

    def test_listAndDrop(self) -> None:
        game = self.game
        game.turn("mira", "Hello.", "Welcome.")
        game.ask(op="save", saveId="a")
        game.clock.advance(10)
        game.ask(op="save", saveId="b")
        game.ask(op="use", conversationId="world-2")
        game.ask(op="save", saveId="c")
        mine = game.ask(op="saves")
        self.assertEqual(mine["conversationId"], "world-2")
        self.assertEqual([s["saveId"] for s in mine["saves"]], ["c"])
        everything = game.ask(op="saves", all=True)["saves"]
        self.assertEqual([s["saveId"] for s in everything], ["c", "b", "a"], "newest first")
        self.assertEqual(everything[2]["characters"], ["mira"])
        self.assertEqual(everything[0]["characters"], [], "a world where nobody was met yet")
        game.ask(op="use", conversationId="world-1")
        self.assertTrue(game.ask(op="drop-save", saveId="a")["dropped"])
        self.assertFalse(game.ask(op="drop-save", saveId="a")["dropped"])
        self.assertEqual([s["saveId"] for s in game.ask(op="saves")["saves"]], ["b"])

    def test_savingAgainUnderANameReplacesIt(self) -> None:
        game = self.game
        game.turn("mira", "First.", "One.")
        game.ask(op="save", saveId="quick")
        game.turn("mira", "Second.", "Two.")
        self.assertEqual(game.ask(op="save", saveId="quick")["save"]["entries"], 4)
        self.assertEqual(len(game.ask(op="saves")["saves"]), 1)

    def test_loadSaveRestoresAndForgetsWhatCameAfter(self) -> None:
        game = self.game
        game.turn("mira", "My sister is called Ilse.", "A fine name.")
        game.turn("garrick", "Sharpen my sword.", "Two coins.")
        game.ask(op="save", saveId="before-the-bridge")
        game.turn("mira", "I burned the bridge.", "You did what?")
        game.ask(op="pin", characterId="garrick", fact="The player burned the bridge.")
        game.turn("tomas", "I am new here.", "Welcome, stranger.")
        answer = game.ask(op="load-save", id=9, saveId="before-the-bridge")
        self.assertEqual((answer["type"], answer["id"]), ("memory-result", 9))
        self.assertEqual(answer["restored"], ["garrick", "mira"])
        self.assertEqual(answer["forgotten"], ["tomas"])
        self.assertEqual(game.said("mira"), ["My sister is called Ilse.", "A fine name."])
        self.assertEqual(game.plugin.read("garrick", "world-1", GAME)["facts"], [])
        self.assertEqual(game.said("tomas"), [])
        # Kept in the file too: a new daemon reads the save's world.
        game.plugin.store.close()
        again = build(game.path, Clock())
        texts = [e["text"] for e in again.read("mira", "world-1", GAME)["entries"]]
        self.assertEqual(texts, ["My sister is called Ilse.", "A fine name."])
        self.assertEqual(again.conversations(GAME, "tomas"), [])
        again.store.close()

    def test_loadingIsRefusedWhileATurnIsInFlight(self) -> None:
        game = self.game
        game.turn("mira", "Hello.", "Welcome.")
        game.ask(op="save", saveId="s")
        requestId = game.request("mira", "Tell me a story.")
        refused = game.ask(op="load-save", id=3, saveId="s")
        self.assertEqual((refused["type"], refused["code"]), ("error", "INVALID_MESSAGE"))
        self.assertIn(f"mira's turn {requestId}", refused["message"])
        self.assertIn("still in flight", refused["message"])
        game.reply(requestId, "Once upon a time.")
        self.assertEqual(len(game.said("mira")), 4, "nothing was restored")
        self.assertEqual(game.ask(op="load-save", saveId="s")["type"], "memory-result")
        self.assertEqual(game.said("mira"), ["Hello.", "Welcome."])

    def test_aSummaryInFlightIsCancelledAndNotKept(self) -> None:
        """
        RPEngine was condensing the conversation when the save is loaded:
        that request is cancelled, and its answer (of lines the save
        undoes) never becomes the restored conversation's summary.
        """
        game = Game(self, summarize_after_tokens=1, keep_recent_tokens=0, reflections=False)
        game.ask(op="use", conversationId="world-1")
        game.harness.startSession()
        game.turn("mira", "Hello.", "Welcome.")
        game.ask(op="save", saveId="s")
        game.turn("mira", "I burned the bridge.", "You did what?")
        game.clock.advance(game.plugin.settings.idle_seconds)
        summary = game.harness.sentToEngine[-1]
        self.assertTrue(isSummaryRequest(summary.requestId), game.harness.typesToEngine())
        game.ask(op="load-save", saveId="s")
        cancel = game.harness.sentToEngine[-1]
        self.assertEqual((cancel.type, cancel.requestId), ("request.cancel", summary.requestId))
        game.reply(str(summary.requestId), "Alex burned the bridge.")
        self.assertEqual(game.plugin.read("mira", "world-1", GAME)["summary"], "")
        self.assertEqual(game.said("mira"), ["Hello.", "Welcome."])

    def test_exportedAndReadOnTheStoresThread(self) -> None:
        """
        The op's call only copies: a save is exported and sealed, and a
        loaded save read and checked, in the work given to the store's
        writer thread, never in the reactor's call.
        """
        game = self.game
        game.turn("mira", "Hello.", "Welcome.")
        store = game.plugin.store
        exported: list[Any] = []
        parsed: list[Any] = []
        export = store.export

        lane = HeldLane()

        def exporting(conversation: Any) -> dict[str, Any]:
            exported.append(lane.running)
            return export(conversation)

        def parsing(key: Key, document: Any) -> Any:
            parsed.append(lane.running)
            return parseExport(key, document)

        self.patch(store, "export", exporting)
        self.patch(saves, "parseExport", parsing)
        store._writer = lane  # type: ignore[assignment]
        saved = game.plugin.save("s", "world-1", GAME)
        lane.release()
        self.assertEqual(self.successResultOf(saved)["entries"], 2)
        self.assertEqual(exported, [True], "exported in the writer's work")
        loaded = game.plugin.loadSave("s", "world-1", GAME)
        lane.release()
        self.assertEqual(self.successResultOf(loaded)["restored"], ["mira"])
        self.assertEqual(parsed, [True], "read in the writer's work")

    def test_aTurnSentRightAfterIsPlannedFromTheSave(self) -> None:
        """
        While the save is read (its thread slow), a turn the game sends
        after load-save waits, and is planned from the save once loaded.
        """
        game = self.game
        game.turn("mira", "My sister is called Ilse.", "A fine name.")
        game.ask(op="save", saveId="s")
        game.turn("mira", "I burned the bridge.", "You did what?")
        lane = HeldLane()
        game.plugin.store._writer = lane  # type: ignore[assignment]
        game.harness.toEngine(
            fromClient(
                "c1", {"type": "memory", "op": "load-save", "saveId": "s", "integrationId": GAME}
            )
        )
        sent = len(game.harness.sentToEngine)
        requestId = game.request("mira", "What do you know of me?")
        self.assertEqual(len(game.harness.sentToEngine), sent, "the turn waits for the load")
        lane.release()
        request = game.harness.sentToEngine[-1]
        self.assertEqual(request.requestId, requestId)
        planned = json.dumps(request["card"])
        self.assertIn("My sister is called Ilse.", planned)
        self.assertNotIn("burned the bridge", planned)

    def test_errorsSayWhatWasWrong(self) -> None:
        game = self.game
        cases: list[tuple[dict[str, Any], str]] = [
            ({"op": "save"}, "saveId must be a non-empty string"),
            ({"op": "load-save", "saveId": "nope"}, "no such save 'nope' of conversation"),
            ({"op": "prune"}, "prune needs olderThanDays, keepEntries, keepSaves or maxBytes"),
            (
                {"op": "prune", "keepEntries": -1},
                "keepEntries must be a whole number of at least 0",
            ),
            ({"op": "save", "saveId": "s", "conversationId": "session:x"}, "may not start"),
        ]
        for message, words in cases:
            answer = game.ask(**message)
            self.assertEqual((answer["type"], answer["code"]), ("error", "INVALID_MESSAGE"))
            self.assertIn(words, answer["message"])
        game.ask(op="use", conversationId=None)
        answer = game.ask(op="save", saveId="s")
        self.assertIn("no game conversation id", answer["message"])

    def test_loadingIsOneTransaction(self) -> None:
        """
        Every character of a save is replaced in one transaction: when the
        write fails on the second, the file keeps the first as it was too
        (a kill leaves the world before the load, or the save's).
        """
        game = self.game
        game.turn("garrick", "Sharpen my sword.", "Two coins.")
        game.turn("mira", "Hello.", "Welcome.")
        game.ask(op="save", saveId="s")
        game.turn("garrick", "Later.", "Aye.")
        game.turn("mira", "Later.", "Indeed.")
        store = game.plugin.store
        rowid = store._rowid

        def failing(db: sqlite3.Connection, key: Key, *rest: Any) -> int:
            if key.characterId == "mira":
                raise sqlite3.OperationalError("disk I/O error")
            return rowid(db, key, *rest)

        self.patch(store, "_rowid", failing)
        answer = game.ask(op="load-save", saveId="s")
        self.assertEqual((answer["type"], answer["code"]), ("error", "INTERNAL_ERROR"))
        self.assertIn("not kept: SQLite: disk I/O error", answer["message"])
        self.flushLoggedErrors()
        db = sqlite3.connect(game.path)
        texts = [
            row[0] for row in db.execute("SELECT text FROM entries ORDER BY conversation, seq")
        ]
        db.close()
        self.assertEqual(texts.count("Later."), 2, "garrick's was rolled back with mira's")

    def test_aDamagedSaveIsRefusedWhole(self) -> None:
        game = self.game
        game.turn("mira", "Hello.", "Welcome.")
        game.ask(op="save", saveId="s")
        game.turn("mira", "Later.", "Indeed.")
        db = sqlite3.connect(game.path)
        db.execute("UPDATE saves SET body = replace(body, 'Welcome.', 'Go away.')")
        db.commit()
        db.close()
        answer = game.ask(op="load-save", saveId="s")
        self.assertEqual(len(self.flushLoggedErrors(DamagedSave)), 1, "logged")
        self.assertEqual((answer["type"], answer["code"]), ("error", "INTERNAL_ERROR"))
        self.assertIn("save 's' is damaged", answer["message"])
        self.assertEqual(len(game.said("mira")), 4, "nothing was replaced")

    def test_aSaveSurvivesAKill(self) -> None:
        """
        A save answered is in the file: a process killed (SIGKILL) right
        after it, with no clean close, leaves it there.
        """
        path = os.path.abspath(self.mktemp())
        script = textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path[:0] = {sys.path!r}
            from twisted.internet.task import Clock
            from rpmiddleware.builtin.memory import memory
            from rpmiddleware.cards.hasher import CardHasher
            from rpmiddleware.config.settings import Settings
            from rpmiddleware.plugin import PluginServices
            from rpmiddleware.protocol.timeline import Timeline
            services = PluginServices(Clock(), Settings(), CardHasher(None), Timeline())
            plugin = memory.buildPlugin({{"path": {path!r}}}, services)
            plugin.pin("mira", "world-1", "Kept through a kill.", "game")
            answered = []
            plugin.save("slot", "world-1", "game").addCallback(answered.append)
            print(answered[0]["saveId"], flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
        child = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
        self.assertEqual(child.stdout.strip(), b"slot", child.stderr)
        self.assertEqual(child.returncode, -9)
        again = build(path, Clock())
        self.assertEqual(
            [s["saveId"] for s in self.successResultOf(again.listSaves("world-1", GAME))], ["slot"]
        )
        self.successResultOf(again.loadSave("slot", "world-1", GAME))
        self.assertEqual(
            again.read("mira", "world-1", GAME)["facts"][0]["text"], "Kept through a kill."
        )
        again.store.close()


class LongSaveTests(SynchronousTestCase):
    def test_aLongConversationRoundTrips(self) -> None:
        """
        A conversation longer than a line of a save's body (and than a
        piece of its checksum) comes back whole, its checksum the one a
        single JSON call gives.
        """
        game = Game(self)
        key = Key(GAME, "mira", "world-1")
        conversation = game.plugin.store.conversation(key)
        lines = [(PLAYER, "Ada", f"Line {i} \u00e9\n", COMPLETE) for i in range(3 * BATCH + 7)]
        game.plugin.store.append(conversation, *lines)
        document = game.plugin.export("mira", "world-1", GAME)
        self.patch(exports, "PIECE", 10**9)
        self.assertEqual(exports.checksum(document), document["checksum"])
        self.successResultOf(game.plugin.save("long", "world-1", GAME))
        game.plugin.store.append(conversation, (PLAYER, "Ada", "After.", COMPLETE))
        self.successResultOf(game.plugin.loadSave("long", "world-1", GAME))
        loaded = game.plugin.export("mira", "world-1", GAME)
        self.assertEqual(loaded["entries"], document["entries"])


class RequestPathTests(SynchronousTestCase):
    """
    The daemon's own path (the Python API, the chain, RPEngine's simulator,
    which assembles each prompt as RPEngine's core does): after a save is
    loaded, the model's next input holds the lines before the save and none
    after.
    """

    def test_theNextInvocationContinuesFromTheSave(self) -> None:
        clock = Clock()
        settings = Settings()
        settings.plugins["memory"] = {"path": os.path.abspath(self.mktemp())}
        middleware = Middleware.fromSettings(clock, settings)
        link = connectInMemory(middleware, clock)
        settle(clock, 0.1)
        plugin = middleware.plugin(IConversationMemory)
        assert isinstance(plugin, Memory)
        card = exampleCard()

        def say(text: str) -> None:
            middleware.requestReply(
                "mira",
                text=text,
                card=card,
                output={"modalities": ["text"], "language": "en"},
                player={"displayName": "Alex"},
                meta={"client": "api", "conversation": "world-1"},
            )
            settle(clock, 5)

        say("My sister is called Ilse.")
        say("She lives by the mill.")
        saved = self.successResultOf(plugin.save("before", "world-1"))
        self.assertEqual(saved["entries"], 4)
        say("I burned the bridge.")
        say("And I stole your horse.")
        loaded = self.successResultOf(plugin.loadSave("before", "world-1"))
        self.assertEqual(loaded["restored"], ["mira"])
        say("What do you know of me?")
        history = [content for _, content in link.engine.invocations[-1].history]
        self.assertIn("My sister is called Ilse.", history)
        self.assertIn("She lives by the mill.", history)
        self.assertNotIn("I burned the bridge.", history)
        self.assertNotIn("And I stole your horse.", history)
        self.assertEqual(link.engine.invocations[-1].user, "What do you know of me?")
        plugin.store.close()


class PruneTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.game = Game(self)
        self.game.ask(op="use", conversationId="world-1")

    def entries(self, characterId: str = "mira") -> list[str]:
        """The conversation's entries as the file holds them."""
        db = sqlite3.connect(self.game.path)
        try:
            return [
                row[0]
                for row in db.execute(
                    "SELECT text FROM entries JOIN conversations ON conversations.id = "
                    "entries.conversation WHERE character = ? ORDER BY seq",
                    (characterId,),
                )
            ]
        finally:
            db.close()

    def test_olderThanDaysKeepsTheSummaryAndTheNewest(self) -> None:
        game = self.game
        game.turn("mira", "Long ago.", "Yes.")
        game.ask(op="save", saveId="old")
        game.plugin.setSummary("mira", "world-1", "Alex came long ago.", GAME)
        game.clock.advance(3 * DAY)
        game.turn("mira", "Today.", "Indeed.")
        game.ask(op="save", saveId="new")
        answer = game.ask(op="prune", id=5, olderThanDays=2)
        self.assertEqual((answer["type"], answer["id"]), ("memory-result", 5))
        removed = answer["removed"]
        self.assertEqual(
            removed,
            {
                "entries": 2,
                "conversations": 1,
                "saves": [{"conversationId": "world-1", "saveId": "old"}],
            },
        )
        self.assertEqual(game.said("mira"), ["Today.", "Indeed."], "the loaded one too")
        self.assertEqual(self.entries(), ["Today.", "Indeed."])
        self.assertEqual(
            game.plugin.read("mira", "world-1", GAME)["summary"], "Alex came long ago."
        )
        self.assertEqual(answer["size"]["saves"], 1)
        self.assertEqual(answer["size"]["entries"], 2)
        # The conversation goes on, numbered after what was pruned.
        game.turn("mira", "Tomorrow.", "Perhaps.")
        seqs = [e["seq"] for e in game.plugin.read("mira", "world-1", GAME)["entries"]]
        self.assertEqual(seqs, [3, 4, 5, 6])

    def test_keepEntriesAndKeepSavesOfOneCharacter(self) -> None:
        game = self.game
        for i in range(3):
            game.turn("mira", f"Mira {i}.", f"Yes {i}.")
            game.turn("garrick", f"Garrick {i}.", f"Aye {i}.")
            game.ask(op="save", saveId=f"s{i}")
            game.clock.advance(1)
        answer = game.ask(op="prune", keepEntries=2, characterId="mira")
        self.assertEqual(answer["removed"]["entries"], 4)
        self.assertEqual(answer["removed"]["saves"], [], "saves hold every character: kept")
        self.assertEqual(self.entries("mira"), ["Mira 2.", "Yes 2."])
        self.assertEqual(len(self.entries("garrick")), 6)
        summarized = game.plugin.read("mira", "world-1", GAME)["summarizedThrough"]
        self.assertEqual(summarized, 4)
        answer = game.ask(op="prune", keepSaves=1)
        dropped = [s["saveId"] for s in answer["removed"]["saves"]]
        self.assertEqual(sorted(dropped), ["s0", "s1"])
        self.assertEqual([s["saveId"] for s in game.ask(op="saves")["saves"]], ["s2"])

    def test_maxBytesForgetsTheOldestAndShrinksTheFile(self) -> None:
        game = self.game
        for i in range(60):
            game.turn("mira", f"Line {i}: " + "words " * 150, f"Reply {i}: " + "more " * 150)
            game.clock.advance(60)
        # The -wal log counts in the size, and a compaction empties it:
        # half of the file as compacted is a limit only forgetting meets.
        self.successResultOf(game.plugin.store.compact())
        before = self.successResultOf(game.plugin.storeSize())
        limit = before["bytes"] // 2
        answer = game.ask(op="prune", maxBytes=limit)
        after = answer["size"]
        self.assertGreater(answer["removed"]["entries"], 0)
        self.assertLess(after["bytes"], before["bytes"])
        self.assertLessEqual(after["bytes"], limit * 1.2, (before, after))
        kept = self.entries()
        self.assertEqual(len(kept), after["entries"])
        self.assertTrue(kept[-1].startswith("Reply 59:"), "the newest stays")
        self.assertTrue(kept[0].startswith("Line "), "whole exchanges go, oldest first")
        self.assertEqual(game.said("mira"), kept)


class SizeMetricsTests(SynchronousTestCase):
    def test_sizeInMetricsIsMeasuredOffTheScrape(self) -> None:
        """
        A scrape reports the last measurement at once and asks the store's
        reader for a new one; it never reads the file itself.
        """
        game = Game(self)
        game.ask(op="use", conversationId="world-1")
        game.turn("mira", "Hello.", "Welcome.")
        game.ask(op="save", saveId="s")
        lane = HeldLane()
        game.plugin.store._reader = lane  # type: ignore[assignment]
        metrics = {m.name: m for m in game.plugin.collectMetrics()}
        self.assertEqual(lane.waiting, 1, "a measurement was asked of the reader")
        self.assertEqual(metrics["rpmiddleware_memory_store_entries"].samples[0].value, 0)
        lane.release()
        metrics = {m.name: m for m in game.plugin.collectMetrics()}
        self.assertEqual(lane.waiting, 0, "measured less than SIZE_EVERY ago: not again")
        self.assertEqual(metrics["rpmiddleware_memory_store_entries"].samples[0].value, 2)
        self.assertEqual(metrics["rpmiddleware_memory_store_saves"].samples[0].value, 1)
        self.assertEqual(
            metrics["rpmiddleware_memory_store_bytes"].samples[0].value,
            sum(os.path.getsize(p) for p in (game.path, game.path + "-wal") if os.path.exists(p)),
        )

    def test_inTheDaemonsMetrics(self) -> None:
        clock = Clock()
        settings = Settings()
        settings.plugins["memory"] = {"path": os.path.abspath(self.mktemp())}
        middleware = Middleware.fromSettings(clock, settings)
        plugin = middleware.plugin(IConversationMemory)
        assert isinstance(plugin, Memory)
        conversation = plugin.store.conversation(Key(GAME, "mira", "world-1"))
        plugin.store.append(
            conversation, (PLAYER, "Alex", "Hi.", COMPLETE), (CHARACTER, "Mira", "Hello.", COMPLETE)
        )
        metrics = MiddlewareMetrics(middleware)
        text = metrics.exposition().decode()
        self.assertIn("rpmiddleware_memory_store_entries 0.0", text, "measured at start")
        clock.advance(SIZE_EVERY)
        text = metrics.exposition().decode()
        self.assertIn("rpmiddleware_memory_store_entries 2.0", text)
        self.assertIn("rpmiddleware_memory_store_saves 0.0", text)
        self.assertRegex(text, r"rpmiddleware_memory_store_bytes [1-9]")
        plugin.store.close()
