"""
The memory plugin's parts: the plan, lorebook activation, the store, the
client's memory message, the settings.
"""

from __future__ import annotations

import copy
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from rpmiddleware.builtin.memory import (
    IConversationMemory,
    Memory,
    MemorySettings,
    buildMemory,
    lorebook,
    memory,
)
from rpmiddleware.builtin.memory.conversation import (
    CHARACTER,
    COMPLETE,
    PLAYER,
    Conversation,
    Key,
)
from rpmiddleware.builtin.memory.lorebook import EntryReader, activate, bookOf, entryFrom
from rpmiddleware.builtin.memory.planner import Limits, labels, lineOf, plan
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.builtin.memory.storeerrors import StoreError
from rpmiddleware.cards.hasher import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.clientext import FROM_CLIENT, TO_CLIENT, fromClient
from rpmiddleware.plugin.interfaces import IClientExtension, IEnvelopePlugin, IPluginFactory
from rpmiddleware.protocol.prompt import (
    PromptTooLarge,
    assemble,
    exampleMessages,
    promptRequest,
    renderMacros,
    speakerKey,
)
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import PluginHarness, exampleCard
from tests.support.memory import assertAssembledAsPlanned

KEY = Key("game", "mira", "save-1")


def conversationOf(*lines: str, key: Key = KEY) -> Conversation:
    conversation = Conversation(key)
    store = MemoryStore(":memory:", lambda: 0.0)
    store.append(
        conversation,
        *(
            (PLAYER if i % 2 == 0 else CHARACTER, "", line, COMPLETE)
            for i, line in enumerate(lines)
        ),
    )
    return conversation


def fields(text: str = "Hello", **extra: Any) -> dict[str, Any]:
    return {
        "event": {"text": text},
        "output": {"modalities": ["text"], "language": "en"},
        "player": {"displayName": "Alex"},
        **extra,
    }


def planned(conversation: Conversation, card: dict[str, Any] | None = None, **kw: Any) -> Any:
    card = card or exampleCard()
    book = bookOf(card)
    return plan(
        fields(), card, conversation, list(book.entries), Limits(**kw), False, 4, None, False
    )


class EnginePromptTests(SynchronousTestCase):
    def test_examplesAndRoles(self) -> None:
        messages = exampleMessages(
            "<START>\n{{user}}: Hi\r\nMíra: Hello: friend\nno colon\n<start>\nMIRA:  Bye ",
            "Mira",
            "Alex",
        )
        self.assertEqual(
            messages, [("user", "Hi"), ("assistant", "Hello: friend"), ("assistant", "Bye")]
        )

    def test_speakerKey(self) -> None:
        self.assertEqual(speakerKey("ÉLODIE"), "elodie")
        self.assertEqual(speakerKey("ΟΔΟΣ"), "οδοσ", "each character lower-cased alone")

    def test_tooLarge(self) -> None:
        request = promptRequest(fields("x" * 30_000), exampleCard())
        e = self.assertRaises(PromptTooLarge, assemble, request)
        self.assertEqual(e.limit, 6000)
        self.assertGreater(e.tokens, 7000)

    def test_examplesDroppedWhenFull(self) -> None:
        request = promptRequest(fields(), exampleCard(mes_example="A: " + "y" * 4000))
        request["maxInputTokens"] = 900
        result = assemble(request)
        self.assertEqual(result.droppedExamples, 1)
        self.assertEqual(result.history, ())


class PlanTests(SynchronousTestCase):
    def test_everythingFitsWhenSmall(self) -> None:
        made = planned(conversationOf("Hi.", "Hello, traveller."))
        self.assertEqual(made.report["history"], {**made.report["history"], "kept": 2})
        request = promptRequest(fields(), made.card)
        self.assertEqual(
            assemble(request).history[-2:], (("user", "Hi."), ("assistant", "Hello, traveller."))
        )

    def test_newestKeptAsAContiguousRun(self) -> None:
        lines = [f"{i} " + "w" * 396 for i in range(60)]
        made = planned(conversationOf(*lines))
        kept = made.report["history"]["kept"]
        self.assertLess(kept, 60)
        self.assertEqual(made.dropped, 60 - kept)
        history = assemble(promptRequest(fields(), made.card)).history
        said = [c for _, c in history if c[0].isdigit()]
        self.assertEqual(said, lines[60 - kept :])
        self.assertLessEqual(made.report["estimatedTokens"], 6000)

    def test_cardWithoutALabelIsLeftAlone(self) -> None:
        self.assertIsNone(labels("Dr: Who"))
        made = planned(conversationOf("Hi."), exampleCard(name="Dr: Who"))
        self.assertIsNone(made.card)

    def test_knowledgeGivesWayBeforeTheNewestExchange(self) -> None:
        book = {
            "entries": [
                {
                    "keys": [],
                    "constant": True,
                    "content": "z" * 4000,
                    "enabled": True,
                    "insertion_order": i,
                    "priority": i,
                    "extensions": {},
                }
                for i in range(6)
            ],
            "token_budget": 100_000,
            "extensions": {},
        }
        newest = "n" * 4000
        made = planned(
            conversationOf("old", newest), exampleCard(character_book=book), loreTokens=100_000
        )
        self.assertIsNotNone(made.card)
        self.assertIn(newest, [c for _, c in assemble(promptRequest(fields(), made.card)).history])
        self.assertGreater(len(made.report["lore"]["left"]), 0)


_piece = st.sampled_from(
    [
        "a",
        "b",
        " ",
        "X",
        ":",
        ".",
        "é",
        "{",
        "}",
        "<",
        ">",
        "\n",
        "\u00a0",
        "😀",
        "<START>",
        "{{user}}",
        "{{char}}",
        "<CHAR>",
        "word ",
    ]
)
_said = st.lists(_piece, max_size=120).map("".join)


class PlanHoldsProperties(SynchronousTestCase):
    """
    What the plugin plans, RPEngine's assembly takes whole: never
    C{prompt_too_large} because of memory, no chat message left out, the
    same estimate, and the newest entries as the last messages.  (Proved
    here, so the plugin need not assemble every request twice.)
    """

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(
        lines=st.lists(_said, max_size=40),
        name=st.sampled_from(["Mira", "Élodie", "{{user}}", "Player", "ΟΔΟΣ"]),
        description=st.integers(0, 30_000),
        summary=_said,
        facts=st.lists(_said, max_size=5),
        event=_said.filter(lambda t: t.strip() != ""),
        limit=st.integers(300, 6000),
        voice=st.booleans(),
    )
    def test_planFitsRPEngine(
        self,
        lines: list[str],
        name: str,
        description: int,
        summary: str,
        facts: list[str],
        event: str,
        limit: int,
        voice: bool,
    ) -> None:
        conversation = conversationOf(*lines)
        conversation.summary = summary
        store = MemoryStore(":memory:", lambda: 0.0)
        for fact in facts:
            if fact.strip():
                store.pin(conversation, fact)
        card = exampleCard(name=name, description="d" * description)
        request = fields(event)
        if voice:
            request["output"] = {"modalities": ["text", "audio"], "language": "en"}
        book = bookOf(card)
        made = plan(
            request, card, conversation, list(book.entries), Limits(limit), False, 4, None, False
        )
        if made.card is None:
            return
        result = assertAssembledAsPlanned(self, request, made.card, made.report, limit)
        kept = made.report["history"]["kept"]
        if kept:
            newest = lineOf(conversation.entries[-1], ("x", "y"))
            if newest is not None:
                self.assertEqual(result.history[-1][1], renderMacros(newest[1], name, "Alex"))


class LorebookTests(SynchronousTestCase):
    def entries(self, *raw: dict[str, Any]) -> list[Any]:
        made = [entryFrom({"enabled": True, "insertion_order": 0, **r}) for r in raw]
        return [e for e in made if e is not None]

    def test_rules(self) -> None:
        entries = self.entries(
            {"keys": ["tower"], "content": "T"},
            {"keys": ["tower"], "content": "S", "selective": True, "secondary_keys": ["night"]},
            {"keys": [], "content": "C", "constant": True},
            {"keys": ["tower"], "content": "D", "enabled": False},
            {"keys": ["Tower"], "content": "K", "case_sensitive": True},
            {"keys": ["tow"], "content": "W"},
            {"keys": ["/l[io]ghts?/i"], "content": "R"},
        )
        kept, _ = activate(entries, ["the TOWER has LIGHTS"], False, 1000)
        self.assertEqual(sorted(e.content for e in kept), ["C", "R", "T"])
        kept, _ = activate(entries, ["the Tower at night"], False, 1000)
        self.assertEqual(sorted(e.content for e in kept), ["C", "K", "S", "T"])

    def test_recursionAndBudget(self) -> None:
        entries = self.entries(
            {"keys": ["inn"], "content": "The inn is near the tower.", "insertion_order": 2},
            {"keys": ["tower"], "content": "x" * 400, "priority": 1, "insertion_order": 1},
        )
        kept, _ = activate(entries, ["the inn"], False, 1000)
        self.assertEqual(len(kept), 1)
        kept, _ = activate(entries, ["the inn"], True, 1000)
        self.assertEqual([e.insertionOrder for e in kept], [1, 2], "in insertion order")
        kept, left = activate(entries, ["the inn"], True, 105)
        self.assertEqual([e.priority for e in kept], [1])
        self.assertEqual(len(left), 1, "lower priority gives way")

    def test_readerRemembersUnchangedEntries(self) -> None:
        """
        An entry reader reads an edited book's changed entries only, and
        gives the same book as reading it afresh; it remembers at most its
        size.
        """
        card = exampleCard()
        card["data"]["character_book"] = {
            "entries": [
                {"keys": [f"place-{i}"], "content": f"Place {i}.", "insertion_order": i}
                for i in range(6)
            ]
        }
        read: list[dict[str, Any]] = []

        def counted(raw: Any, source: str = "card") -> Any:
            read.append(raw)
            return entryFrom(raw, source)

        self.patch(lorebook, "entryFrom", counted)
        reader = EntryReader(size=8)
        first = bookOf(card, reader)
        edited = copy.deepcopy(card)
        edited["data"]["character_book"]["entries"][2]["content"] = "Place 2, burnt down."
        read.clear()
        again = bookOf(edited, reader)
        self.assertEqual([r["content"] for r in read], ["Place 2, burnt down."])
        self.assertEqual(again, bookOf(edited))
        self.assertEqual(again.entries[0], first.entries[0])
        self.assertEqual(len(reader), 7)
        small = EntryReader(size=3)
        bookOf(card, small)
        self.assertEqual(len(small), 3)

    def test_plainKeysCompiledWhenNeeded(self) -> None:
        """
        A plain key's pattern is compiled only once a text holds its words;
        it still matches whole words only, in any case.
        """
        compiled: list[str] = []
        real = re.compile

        def counting(pattern: Any, flags: int = 0) -> Any:
            compiled.append(pattern)
            return real(pattern, flags)

        self.patch(lorebook.re, "compile", counting)
        entries = self.entries(
            {"keys": ["tower"], "content": "T"}, {"keys": ["mill"], "content": "M"}
        )
        self.assertEqual(compiled, [])
        kept, _ = activate(entries, ["the TOWER and the millstone"], False, 1000)
        self.assertEqual([e.content for e in kept], ["T"])
        self.assertEqual(len(compiled), 2, "the text holds both keys' words")
        activate(entries, ["nothing here"], False, 1000)
        self.assertEqual(len(compiled), 2)


class StoreTests(SynchronousTestCase):
    def test_persistsAndEdits(self) -> None:
        path = self.mktemp()
        store = MemoryStore(path, lambda: 5.0)
        conversation = store.conversation(KEY)
        store.append(
            conversation, (PLAYER, "Alex", "Hi", COMPLETE), (CHARACTER, "Mira", "Ho", COMPLETE)
        )
        store.edit(conversation, 2, "Hello")
        fact = store.pin(conversation, "The player is Alex.")
        store.summarize(conversation, "They met.", 1)
        store.close()
        again = MemoryStore(path, lambda: 6.0).conversation(KEY)
        self.assertEqual([e.text for e in again.entries], ["Hi", "Hello"])
        self.assertEqual([f.text for f in again.facts], ["The player is Alex."])
        self.assertEqual((again.summary, again.summarizedThrough), ("They met.", 1))
        self.assertEqual(again.facts[0].id, fact.id)

    def test_briefsCountWithoutLoading(self) -> None:
        path = self.mktemp()
        store = MemoryStore(path, lambda: 5.0)
        conversation = store.conversation(KEY)
        store.append(
            conversation, (PLAYER, "Alex", "Hi", COMPLETE), (CHARACTER, "Mira", "Ho", COMPLETE)
        )
        store.pin(conversation, "A fact.")
        store.close()
        again = MemoryStore(path, lambda: 6.0)
        self.assertEqual(
            again.briefs(characterId="mira"),
            [{**KEY.asDict(), "entries": 2, "facts": 1, "summarized": False, "updated": 5.0}],
        )
        self.assertEqual(again.briefs(characterId="someone else"), [])
        self.assertEqual(again.briefs(), [again.conversation(KEY).brief()])

    def test_exportImport(self) -> None:
        store = MemoryStore(self.mktemp(), lambda: 0.0)
        conversation = store.conversation(KEY)
        store.append(conversation, (PLAYER, "Alex", "Hi", COMPLETE))
        document = store.export(conversation)
        other = Key("game", "mira", "save-2")
        self.assertEqual(len(store.restore(other, document).entries), 1)
        e = self.assertRaises(
            StoreError, store.restore, other, {**document, "entries": [{"seq": 0}]}
        )
        self.assertIn("entries[0].seq", str(e))
        self.assertRaises(StoreError, store.restore, other, {"format": "nope"})
        # Importing over a stored conversation replaces it, on disk too.
        store.append(conversation, (CHARACTER, "Mira", "Ho", COMPLETE))
        store.restore(KEY, document)
        store.close()
        again = MemoryStore(store.path, lambda: 0.0)
        self.assertEqual([e.text for e in again.conversation(KEY).entries], ["Hi"])
        self.assertEqual([e.text for e in again.conversation(other).entries], ["Hi"])

    def test_killedWriterLeavesAWholeStore(self) -> None:
        """
        A process killed while it writes turns as fast as it can leaves a
        database that opens, passes SQLite's integrity check and holds a
        whole prefix of the turns (every turn is one transaction).
        """
        path = os.path.abspath(self.mktemp())
        script = textwrap.dedent(
            f"""
            import sys, time
            sys.path[:0] = {sys.path!r}
            from rpmiddleware.builtin.memory.store import MemoryStore
            from rpmiddleware.builtin.memory.conversation import Key
            store = MemoryStore({path!r}, time.time)
            c = store.conversation(Key("g", "c", "s"))
            for i in range(100000):
                store.append(c, ("player", "A", f"line {{i}}", "complete"),
                             ("character", "B", f"reply {{i}}", "complete"))
                if i == 50:
                    print("writing", flush=True)
            """
        )
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        assert child.stdout is not None
        self.assertEqual(child.stdout.readline().strip(), b"writing")
        child.kill()
        child.wait(30)
        child.stdout.close()
        db = sqlite3.connect(path)
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        db.close()
        entries = MemoryStore(path, lambda: 0.0).conversation(Key("g", "c", "s")).entries
        self.assertGreater(len(entries), 100)
        self.assertEqual(len(entries) % 2, 0, "never half a turn")
        self.assertEqual([e.seq for e in entries], list(range(1, len(entries) + 1)))


class ClientMessageTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        services = PluginServices(self.clock, Settings(), CardHasher(None), Timeline())
        plugin = buildMemory(MemorySettings(path=":memory:"), services)
        self.plugin = plugin
        self.harness = PluginHarness(plugin, clock=self.clock)

    def ask(self, **message: Any) -> dict[str, Any]:
        self.harness.toEngine(fromClient("c1", {"type": "memory", **message}))
        sent = self.harness.sentToGame[-1]
        self.assertEqual((sent.type, sent["clientId"]), (TO_CLIENT, "c1"))
        answer: dict[str, Any] = sent["message"]
        return answer

    def test_interfaces(self) -> None:
        self.assertTrue(verifyObject(IPluginFactory, memory))
        self.assertTrue(verifyObject(IEnvelopePlugin, self.plugin))
        self.assertTrue(verifyObject(IClientExtension, self.plugin))
        self.assertTrue(verifyObject(IConversationMemory, self.plugin))
        self.assertEqual(self.plugin.clientMessageTypes, ("memory",))

    def test_consumedNeverSent(self) -> None:
        self.ask(op="list")
        self.assertNotIn(FROM_CLIENT, self.harness.typesToEngine())

    def test_pinReadForget(self) -> None:
        self.assertEqual(self.ask(op="use", conversationId="slot")["conversationId"], "slot")
        pinned = self.ask(op="pin", id=7, characterId="mira", fact="The player is Alex.")
        self.assertEqual((pinned["type"], pinned["id"]), ("memory-result", 7))
        read = self.ask(op="read", characterId="mira")
        self.assertEqual(read["conversation"]["conversationId"], "slot")
        self.assertEqual(read["conversation"]["facts"][0]["text"], "The player is Alex.")
        exported = self.ask(op="export", characterId="mira")["document"]
        refused = self.ask(op="import", characterId="mira", conversationId="b", document=exported)
        self.assertEqual(
            (refused["code"], refused["id"] if "id" in refused else None), ("INVALID_MESSAGE", None)
        )
        self.assertIn("empty: true", refused["message"])
        imported = self.ask(
            op="import", characterId="mira", conversationId="b", document=exported, empty=True
        )
        self.assertEqual(imported["entries"], 0)
        self.assertTrue(self.ask(op="forget", characterId="mira")["forgotten"])

    def test_sessionEndedForgetsItsConversations(self) -> None:
        self.ask(op="pin", characterId="mira", fact="Kept for the session.")
        self.ask(op="pin", characterId="mira", conversationId="save", fact="Kept in the save.")
        self.ask(op="where", location="village")
        self.harness.endClientSession("c1")
        self.assertEqual(self.plugin.read("mira", "session:c1")["facts"], [])
        self.assertEqual(len(self.plugin.read("mira", "save")["facts"]), 1)
        self.assertNotIn("c1", self.plugin.where)

    def test_errorsSayWhatWasWrong(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"op": "bogus"}, "memory.op must be one of"),
            ({"op": "pin", "characterId": "mira"}, "fact must be a non-empty string"),
            ({"op": "edit", "characterId": "mira", "seq": 9, "text": "x"}, "no such"),
            ({"op": "know", "text": "x"}, "knowledge needs keys"),
            ({"op": "know", "text": "x", "keys": ["a"], "scope": "moon"}, "scope must be"),
            ({"op": "import", "characterId": "mira", "document": {}}, "format"),
        ]
        for message, words in cases:
            answer = self.ask(**message)
            self.assertEqual((answer["type"], answer["code"]), ("error", "INVALID_MESSAGE"))
            self.assertIn(words, answer["message"])


class SettingsTests(SynchronousTestCase):
    def services(self) -> PluginServices:
        return PluginServices(Clock(), Settings(), CardHasher(None), Timeline())

    def test_unknownAndWrong(self) -> None:
        build = memory.buildPlugin
        e = self.assertRaises(ValueError, build, {"pth": "x"}, self.services())
        self.assertIn("unknown setting plugins.memory.pth", str(e))
        e = self.assertRaises(ValueError, build, {"idle_seconds": "soon"}, self.services())
        self.assertIn("plugins.memory.idle_seconds must be a number", str(e))
        e = self.assertRaises(ValueError, build, {"idle_seconds": 0}, self.services())
        self.assertIn("plugins.memory.idle_seconds must be a number > 0", str(e))
        e = self.assertRaises(ValueError, build, {"cached": -1}, self.services())
        self.assertIn("plugins.memory.cached must be a whole number >= 0", str(e))
        e = self.assertRaises(ValueError, build, {"path": " "}, self.services())
        self.assertIn("plugins.memory.path must name a file", str(e))

    def test_badDatabaseSaidAtStart(self) -> None:
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(b"this is not a database" * 100)
        e = self.assertRaises(ValueError, memory.buildPlugin, {"path": path}, self.services())
        self.assertIn(path, str(e))

    def test_inTheDefaultChain(self) -> None:
        from rpmiddleware.builtin import DEFAULT_CHAIN

        self.assertLess(DEFAULT_CHAIN["playbook"], DEFAULT_CHAIN["memory"])
        self.assertLess(DEFAULT_CHAIN["memory"], DEFAULT_CHAIN["moderation"])
        self.assertIsInstance(memory.buildPlugin({"path": ":memory:"}, self.services()), Memory)
