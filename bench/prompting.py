"""
Benchmark 8: what the memory plugin costs per turn.

Planning a request with a 500-turn conversation (none of it summarized: the
worst case) and a 200-entry lorebook, against the floor measured in the same
run: RPEngine's own assembly of the same card (rpmiddleware.protocol.prompt),
which any faithful planner has to do at least once.  Then the whole plugin
step (plan, the check with RPEngine's assembly, the card's hash), and the
store's write of one turn (one WAL transaction) against a bare sqlite3
insert and commit with the same settings.  Ratios, since the machine is
shared; tests never time anything.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from typing import Any

from bench.common import Section, percentileMs, table
from bench.memorybench import memoryBench
from rpmiddleware.builtin.memory.conversation import CHARACTER, COMPLETE, PLAYER, Key
from rpmiddleware.builtin.memory.lorebook import bookOf
from rpmiddleware.builtin.memory.planner import Limits, plan
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.protocol.prompt import assemble, promptRequest
from rpmiddleware.protocol.rules import SPEECH_MODEL
from rpmiddleware.testing.kit import exampleCard

TURNS = 500
ENTRIES = 200


def _card() -> dict[str, Any]:
    entries = [
        {
            "keys": [f"place{i}", f"person{i}"],
            "content": f"Place {i} is where person {i} lives; " + "lore " * 30,
            "enabled": True,
            "insertion_order": i,
            "priority": i % 7,
            "extensions": {},
        }
        for i in range(ENTRIES)
    ]
    return exampleCard(character_book={"entries": entries, "extensions": {}, "token_budget": 800})


def _fields(i: int) -> dict[str, Any]:
    return {
        "event": {"text": f"Tell me about place{i % ENTRIES} and person{(i * 7) % ENTRIES}."},
        "output": {
            "modalities": ["text", "audio"],
            "language": "en",
            "audio": {"model": SPEECH_MODEL, "voice": "F4"},
        },
        "player": {"displayName": "Alex"},
    }


def _timed(call: Any, runs: int) -> list[float]:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - start)
    return times


async def run(reactor: Any, quick: bool) -> Section:
    runs = 100 if quick else 400
    card = _card()
    book = bookOf(card)
    store = MemoryStore(":memory:", time.time)
    conversation = store.conversation(Key("bench", "mira", "save"))
    for i in range(TURNS):
        store.append(
            conversation,
            (PLAYER, "Alex", f"Line {i}: what about the north road and the mill?", COMPLETE),
            (
                CHARACTER,
                "Mira",
                f"Reply {i}: the road is long, the mill is old, stay a while.",
                COMPLETE,
            ),
        )

    def planOnly(i: int) -> Any:
        return plan(
            _fields(i), card, conversation, list(book.entries), Limits(), False, 4, 800, False
        )

    planned = planOnly(0).card

    def floor(i: int) -> Any:
        return assemble(promptRequest(_fields(i), planned))

    # The whole plugin step, as the chain runs it: the card's lorebook (read
    # once for an owned card), the game's knowledge, the plan, the hash.
    bench = memoryBench(":memory:", card)
    bench.plugin.sessions.restore(Key("bench", "mira", "session:c1"), store.export(conversation))

    refused: list[str] = []

    def step(i: int) -> Any:
        sent = bench.harness.toEngine(bench.request(f"r{i}", **_fields(i)))
        # A request RPEngine would refuse times the refusal, not the step.
        sent.addErrback(lambda failure: refused.append(str(failure.value)))
        return sent

    rounds: dict[str, list[float]] = {"floor": [], "plan": [], "step": []}
    for _ in range(3):  # interleaved, so a noisy moment hits all three
        rounds["floor"] += _timed(floor, runs // 3)
        rounds["plan"] += _timed(planOnly, runs // 3)
        rounds["step"] += _timed(step, runs // 3)
    if refused:
        raise RuntimeError(f"{len(refused)} benchmark requests were refused: {refused[0]}")

    folder = tempfile.mkdtemp(prefix="rpm-bench-")
    # Without a reactor the store writes on the caller's thread: this is the
    # work the plugin's store does on its own writer thread, timed alone.
    disk = MemoryStore(os.path.join(folder, "memory.sqlite3"), time.time)
    # Opened first (the schema made), as a daemon whose file exists does at start-up.
    disk.check()
    saved = disk.conversation(Key("bench", "mira", "save"))
    bare = sqlite3.connect(os.path.join(folder, "bare.sqlite3"), isolation_level=None)
    bare.execute("PRAGMA journal_mode=WAL")
    bare.execute("PRAGMA synchronous=NORMAL")
    bare.execute("CREATE TABLE t (a INTEGER, b TEXT)")

    def write(i: int) -> None:
        disk.append(
            saved,
            (PLAYER, "Alex", f"line {i}", COMPLETE),
            (CHARACTER, "Mira", f"reply {i}", COMPLETE),
        )

    def bareWrite(i: int) -> None:
        bare.execute("BEGIN IMMEDIATE")
        bare.execute("INSERT INTO t VALUES (?, ?)", (i, f"line {i}"))
        bare.execute("COMMIT")

    writes: dict[str, list[float]] = {"store": [], "bare": []}
    for _ in range(3):
        writes["bare"] += _timed(bareWrite, runs // 3)
        writes["store"] += _timed(write, runs // 3)
    disk.close()
    bare.close()

    p50 = {k: percentileMs(v, 50) for k, v in rounds.items()}
    worst = max(max(v) for v in rounds.values()) * 1000
    w50 = {k: percentileMs(v, 50) for k, v in writes.items()}

    def row(name: str, values: list[float], floor: float) -> list[str]:
        return [
            name,
            f"{percentileMs(values, 50):.3f} ms",
            f"{percentileMs(values, 99):.3f} ms",
            f"{max(values) * 1000:.2f} ms",
            f"{percentileMs(values, 50) / floor:.2f}x",
        ]

    planning = table(
        ["what", "p50", "p99", "max", "vs. RPEngine's assembly"],
        [
            row(
                "RPEngine's own assembly of the planned card (floor)", rounds["floor"], p50["floor"]
            ),
            row("plan (conversation, lorebook scan, budget)", rounds["plan"], p50["floor"]),
            row(
                "whole plugin step (lorebook, knowledge, plan, card hash)",
                rounds["step"],
                p50["floor"],
            ),
        ],
    )
    storing = table(
        ["store write of one turn", "p50", "p99", "max", "vs. bare sqlite3 insert + commit"],
        [
            row("bare sqlite3, WAL, synchronous=NORMAL (floor)", writes["bare"], w50["bare"]),
            row("MemoryStore.append (two entries, one transaction)", writes["store"], w50["bare"]),
        ],
    )
    body = f"""
A {TURNS}-turn conversation ({2 * TURNS} entries, none summarized), a {ENTRIES}-entry lorebook
(token_budget 800), a spoken reply; {runs // 3 * 3} runs of each, interleaved.

{planning}

{storing}

How it grows: the plan reads the conversation not yet summarized (bounded by the summarizer to
about `summarize_after_tokens` in steady state) and scans the lorebook once per entry key over the
new line and `scan_depth` messages, so it is linear in both; the check and the hash are linear in
the planned card (at most RPEngine's 6000 tokens, about 24 KB, plus the card itself).
"""
    goals = [
        (
            "memory plan p50 < 2 ms (500 turns, 200 lore entries)",
            f"{p50['step']:.2f} ms whole step",
            p50["step"] < 2.0,
        ),
        ("no planning turn over 10 ms", f"{worst:.2f} ms longest", worst < 10.0),
    ]
    return Section("Memory: planning a prompt and storing a turn (benchmark 8)", body, goals)
