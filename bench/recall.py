"""
Recall (issue 33): does a detail told long ago reach the model when the
player asks about it?

A character is told C{details} distinct details ("Remember this: my sister
is called Jolene.") spread over C{turns} turns of long lines, with the
simulated RPEngine's summaries as lossy as a small model's (each keeps only
the newest few details: L{rpmiddleware.testing.simsummaries}); then the
player asks about each old detail by its topic ("What do you know of my
sister?"), and we count the asks whose model input holds the detail's value
(C{Jolene}), with recall off (the product before issue 33) and on.  Every
turn is checked too: none is refused (C{prompt_too_large}), every invocation
fits RPEngine's limit, and each keeps the newest exchange.  All on a Clock,
with the simulator: the same run is a trial test
(C{tests.test_memory_recall.MeasuredTests}).

Then what recall costs with 10,000 entries in the conversation: the
reactor's part of a turn (finding what to search, then ranking and planning
with what was found), the search itself on the store's reader thread, and
how the file grows per entry with the index.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.task import Clock

from bench.common import Section, percentileMs, table
from bench.memorybench import memoryBench
from rpmiddleware.builtin.memory import IConversationMemory, Memory
from rpmiddleware.builtin.memory.conversation import CHARACTER, COMPLETE, PLAYER, Key
from rpmiddleware.builtin.memory.recall import Found
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.protocol.prompt import AssembledPrompt
from rpmiddleware.testing.inmemory import connectInMemory
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.simoptions import SimulatorOptions

#: Topic (what the player asks about) and detail (what is told), each value
#: a word found nowhere else.
DETAILS: tuple[tuple[str, str, str], ...] = (
    ("sister", "my sister is called Jolene", "Jolene"),
    ("horse", "my horse is named Thistle", "Thistle"),
    ("sword", "my sword was forged in Karrowdeep", "Karrowdeep"),
    ("village", "my home village is Ambermoor", "Ambermoor"),
    ("mother", "my mother sings in Velloran", "Velloran"),
    ("ship", "my ship is the Gullwing", "Gullwing"),
    ("dog", "my dog is called Pepperidge", "Pepperidge"),
    ("ring", "my ring came from Ostravel", "Ostravel"),
    ("teacher", "my teacher was Master Quillon", "Quillon"),
    ("debt", "my debt is owed to Brannoc", "Brannoc"),
    ("brother", "my brother is called Tomasz", "Tomasz"),
    ("pie", "my favourite pie is quince and Marrowfig", "Marrowfig"),
    ("scar", "my scar came from Gristleback", "Gristleback"),
    ("father", "my father mends nets in Saltmere", "Saltmere"),
    ("cat", "my cat is called Wimbleton", "Wimbleton"),
    ("song", "my favourite song is The Lantern of Corrib", "Corrib"),
    ("cousin", "my cousin is called Ysolde", "Ysolde"),
    ("boots", "my boots were made by Hobbering", "Hobbering"),
    ("key", "my key opens the vault of Durnhollow", "Durnhollow"),
    ("friend", "my best friend is called Pellam", "Pellam"),
    ("grandmother", "my grandmother lives in Fennick", "Fennick"),
    ("map", "my map shows the pass of Calderwy", "Calderwy"),
    ("hawk", "my hawk is named Skerrow", "Skerrow"),
    ("oath", "my oath was sworn to Lady Ormenel", "Ormenel"),
    ("wife", "my wife is called Rosamund", "Rosamund"),
    ("enemy", "my enemy is the knight Varragh", "Varragh"),
    ("book", "my book is the Codex of Thraine", "Thraine"),
    ("uncle", "my uncle brews ale in Tollbury", "Tollbury"),
    ("lute", "my lute was carved by Emberlin", "Emberlin"),
    ("dream", "my dream is to sail to Isvalla", "Isvalla"),
    ("daughter", "my daughter is called Merriwen", "Merriwen"),
    ("shield", "my shield bears the crest of Harrowgate", "Harrowgate"),
    ("garden", "my garden grows blue Sorrelwort", "Sorrelwort"),
    ("goat", "my goat is named Buttercask", "Buttercask"),
    ("lantern", "my lantern burns Gravemoss oil", "Gravemoss"),
    ("coin", "my lucky coin is from Quenhithe", "Quenhithe"),
    ("apprentice", "my apprentice is called Dobbin Hale", "Dobbin"),
    ("tower", "my tower stands at Windle Cross", "Windle"),
    ("cloak", "my cloak was woven in Mistral Vale", "Mistral"),
    ("wager", "my wager is with the miller Abelard", "Abelard"),
)
#: What the player's other lines say: long, and about nothing in particular.
PADDING = (
    "The rain keeps falling on the old roads and the fields beyond them, "
    "and the carts come in late from the market with their wheels caked in mud. "
) * 2
TEXT_ONLY = {"modalities": ["text"], "language": "en"}


@dataclass
class Measure:
    """One run: what reached the model, and what was checked of every turn."""

    recall: bool
    turns: int
    told: int
    asked: list[str] = field(default_factory=list)
    #: Topics whose detail reached the model's input when asked.
    reached: list[str] = field(default_factory=list)
    refused: int = 0
    overLimit: int = 0
    #: Invocations that did not end with the newest exchange.
    newestMissing: int = 0
    invocations: int = 0

    @property
    def share(self) -> float:
        return len(self.reached) / len(self.asked) if self.asked else 0.0


def _input(invocation: AssembledPrompt) -> str:
    """All the model is given: the system prompt, the chat turns, the user message."""
    return "\n".join([invocation.system, *(t for _, t in invocation.history), invocation.user])


def measure(
    turns: int = 500,
    details: int = 40,
    keptDetails: int = 3,
    recall: bool = True,
    **memory: Any,
) -> Measure:
    """
    Tell C{details} details over C{turns} turns (summaries keeping the
    newest C{keptDetails}), then ask about each detail but the newest
    C{keptDetails}, oldest first.
    """
    clock = Clock()
    config = Settings()
    config.plugins["memory"] = {"path": ":memory:", "recall": recall, **memory}
    middleware = Middleware.fromSettings(clock, config)
    options = SimulatorOptions(summaryDetails=keptDetails)
    link = connectInMemory(middleware, clock, options)
    _settle(clock, 0.1)
    plugin = middleware.plugin(IConversationMemory)
    assert isinstance(plugin, Memory)
    card = exampleCard()
    told = DETAILS[:details]
    every = max(1, turns // max(1, len(told)))
    result = Measure(recall, turns, len(told))
    previous: tuple[str, str] | None = None

    def say(text: str) -> AssembledPrompt | None:
        nonlocal previous
        before = len(link.engine.invocations)
        stream = middleware.requestReply(
            "mira",
            text=text,
            card=card,
            output=TEXT_ONLY,
            player={"displayName": "Alex"},
            meta={"client": "c1", "conversation": "bench-save"},
        )
        _settle(clock, 3.0)
        done = stream.done.result if stream.done.called else None
        if getattr(done, "type", None) != "reply.completed":
            result.refused += 1
            if hasattr(done, "trap"):
                done.trap(Exception)  # handled: counted as refused
            return None
        invocation = link.engine.invocations[before]
        result.invocations += 1
        if invocation.tokens > invocation.limit:
            result.overLimit += 1
        if previous is not None and [
            (role, " ".join(text.split())) for role, text in invocation.history[-2:]
        ] != [
            ("user", " ".join(previous[0].split())),
            ("assistant", " ".join(previous[1].split())),
        ]:
            result.newestMissing += 1
        previous = (text, stream.text())
        return invocation

    for turn in range(turns):
        index = turn // every
        if turn % every == 0 and index < len(told):
            say(f"Remember this: {told[index][1]}. {PADDING}")
        else:
            say(f"Line {turn}. {PADDING}")
    for topic, _, value in told[: len(told) - keptDetails]:
        invocation = say(f"Tell me, what do you know of my {topic}?")
        result.asked.append(topic)
        if invocation is not None and value in _input(invocation):
            result.reached.append(topic)
    plugin.store.close()
    return result


def _settle(clock: Clock, seconds: float) -> None:
    end = clock.seconds() + seconds
    for _ in range(100_000):
        due = [c.getTime() for c in clock.getDelayedCalls() if c.getTime() <= end]
        if not due:
            break
        clock.advance(max(0.0, min(due) - clock.seconds()))
    clock.advance(max(0.0, end - clock.seconds()))


# What it costs with 10,000 entries.

ENTRIES = 10_000


def _long(i: int) -> str:
    _, detail, _ = DETAILS[i % len(DETAILS)]
    return f"Line {i}: {detail}, and {PADDING}"


def costs(entries: int = ENTRIES, runs: int = 200) -> dict[str, Any]:
    """
    Times (seconds) of the reactor's part of a turn and of the search, with
    C{entries} entries in a file store; and the file's bytes per entry with
    and without the recall index.
    """
    folder = tempfile.mkdtemp(prefix="rpm-bench-recall-")
    path = os.path.join(folder, "memory.sqlite3")
    key = Key("bench", "mira", "save")
    store = MemoryStore(path, time.time)
    conversation = store.conversation(key)
    for i in range(0, entries, 2):
        store.append(
            conversation,
            (PLAYER, "Alex", _long(i // 2), COMPLETE),
            (CHARACTER, "Mira", f"Reply {i}: the road is long, {PADDING}", COMPLETE),
        )
    store.summarize(conversation, "They talked at length.", entries - 40)
    store.close()
    withIndex = os.path.getsize(path)
    bare = os.path.join(folder, "bare.sqlite3")
    db = sqlite3.connect(path)
    db.execute("VACUUM INTO ?", (bare,))
    db.close()
    db = sqlite3.connect(bare)
    db.execute("DROP TABLE recall")
    db.execute("VACUUM")
    db.close()
    withoutIndex = os.path.getsize(bare)

    bench = memoryBench(path, exampleCard())
    plugin = bench.plugin
    loaded = plugin.store.conversation(key)
    assert len(loaded.entries) == entries
    reactorPart: list[float] = []
    search: list[float] = []
    recalled = 0
    for i in range(runs):
        topic = DETAILS[i % len(DETAILS)][0]
        envelope = bench.request(
            f"r{i}",
            event={"text": f"Tell me, what do you know of my {topic}?"},
            output={"modalities": ["text", "audio"], "language": "en"},
            player={"displayName": "Alex"},
        )
        envelope.meta["conversation"] = "save"
        started = time.perf_counter()
        prepared = plugin.recallQuery(envelope, loaded)
        prepTime = time.perf_counter() - started
        assert prepared is not None
        started = time.perf_counter()
        matches: list[Found] = []
        plugin.store.searchLater(key, *prepared).addCallback(matches.extend)
        search.append(time.perf_counter() - started)
        plugin._recalled[envelope.requestId or ""] = plugin.recalledOf(matches)
        started = time.perf_counter()
        planned = plugin._request(envelope)
        reactorPart.append(prepTime + time.perf_counter() - started)
        plugin._turns.clear()
        recalled += "remembers]" in str(planned.fields["card"])
    plugin.store.close()
    return {
        "reactor": reactorPart,
        "search": search,
        "bytesWith": withIndex / entries,
        "bytesWithout": withoutIndex / entries,
        "recalled": recalled,
    }


async def run(reactor: Any, quick: bool) -> Section:
    turns = 500
    off = measure(turns, recall=False)
    on = measure(turns, recall=True)
    cost = costs(runs=60 if quick else 200)

    def row(m: Measure) -> list[str]:
        return [
            "on" if m.recall else "off (before issue 33)",
            f"{len(m.reached)} / {len(m.asked)} = {m.share:.0%}",
            str(m.refused),
            str(m.overLimit),
            str(m.newestMissing),
            str(m.invocations),
        ]

    shares = table(
        [
            "recall",
            "old details in the model's input when asked",
            "refused",
            "over the limit",
            "newest exchange missing",
            "turns planned",
        ],
        [row(off), row(on)],
    )
    timing = table(
        ["with 10,000 entries", "p50", "p99", "max"],
        [
            [
                "reactor's part of a turn (what to search; rank, plan, hash)",
                f"{percentileMs(cost['reactor'], 50):.2f} ms",
                f"{percentileMs(cost['reactor'], 99):.2f} ms",
                f"{max(cost['reactor']) * 1000:.2f} ms",
            ],
            [
                "the search (FTS5, BM25), on the store's reader thread",
                f"{percentileMs(cost['search'], 50):.2f} ms",
                f"{percentileMs(cost['search'], 99):.2f} ms",
                f"{max(cost['search']) * 1000:.2f} ms",
            ],
        ],
    )
    growth = (
        f"The file: {cost['bytesWith']:.0f} bytes per entry with the recall index, "
        f"{cost['bytesWithout']:.0f} without it (entries of about 330 characters), so the "
        f"index adds {cost['bytesWith'] - cost['bytesWithout']:.0f} bytes per entry."
    )
    body = f"""
{on.told} details told over {turns} turns of long lines, the simulator's summaries keeping only
the newest 3; then each of the {len(on.asked)} older ones asked about by its topic. All on a Clock
with the simulated RPEngine, which assembles each prompt as RPEngine's core does.

{shares}

{timing}

{growth}

How it grows: the search counts each word of the line in at most 301 of the conversation's rows
and ranks at most 600 rows' worth of words, so it costs what the line's distinctive words cost,
not what the conversation holds; the reactor's part reads back only as far as RPEngine's limit
and ranks at most `4 x recall_moments + 200 + 2 x recall_moments` matches. The index keeps no
copy of the text (external content: it reads the entries' own), so the file grows by its word
lists alone.
"""
    goals = [
        (
            "old details reaching the model with recall >= 90%",
            f"{on.share:.0%} (off: {off.share:.0%})",
            on.share >= 0.9,
        ),
        (
            "no prompt_too_large, nothing over the limit, newest exchange always kept",
            f"{on.refused} refused, {on.overLimit} over, {on.newestMissing} missing",
            not (on.refused or on.overLimit or on.newestMissing),
        ),
        (
            "reactor's part p50 < 2 ms with 10,000 entries",
            f"{percentileMs(cost['reactor'], 50):.2f} ms",
            percentileMs(cost["reactor"], 50) < 2.0,
        ),
        (
            "no reactor turn over 10 ms",
            f"{max(cost['reactor']) * 1000:.2f} ms longest",
            max(cost["reactor"]) < 0.010,
        ),
    ]
    return Section("Memory: recall of old details (issue 33)", body, goals)
