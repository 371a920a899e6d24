"""
Benchmark 5: character cards.

  - RFC 8785 hash time for a 5 KB and a 200 KB card: the pure-Python
    rfc8785 encoder, cold (canonicalHash, the C encoder when it applies), a
    game's dict read again (CardHasher on a document it does not own) and
    cached (CardHasher on a card the middleware owns: found by identity);
  - diff time on a 200 KB card, jsonpatch.make_patch against
    rpmiddleware.cards.diff.diff, for three kinds of edit;
  - card bytes on the wire over a 20-turn session with small edits: what
    card-cache sends (snapshot, patch, reference) against a snapshot every
    turn, RPEngine's side played by the simulator's own card store;
  - the longest reactor turn while 200 KB cards are hashed and diffed: a
    1 ms heartbeat on the middleware's reactor while the Python API plays
    turns with an edited 200 KB card each time, RPEngine simulated in
    another process; against the same heartbeat with the middleware idle,
    and with all card work in the turn that brings the card (what the
    separate diff turn buys).
"""

from __future__ import annotations

import copy
import gc
import json
import time
from typing import Any

import jsonpatch
import rfc8785
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall, deferLater

from bench.common import Section, benchSettings, median, percentile, pin, table
from bench.peers import Peer
from rpmiddleware.builtin.card_cache import CardCache, jsonSize
from rpmiddleware.cards.diff import diff
from rpmiddleware.cards.validation import CardHasher, canonicalHash, snapshotTransfer
from rpmiddleware.core.discovery import buildChain, discoverPlugins
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.cardstore import SessionCardStore
from rpmiddleware.testing.kit import PluginHarness, exampleCard
from rpmiddleware.testing.live import startMiddleware

TEXT_ONLY = {"modalities": ["text"], "language": "en"}


def cardOfSize(size: int) -> dict[str, Any]:
    """
    The example card with a lorebook grown to about C{size} bytes of JSON.
    """
    card = exampleCard()
    book = card["data"].setdefault(
        "character_book", {"name": "Lore", "extensions": {}, "entries": []}
    )
    i = 0
    while len(json.dumps(card)) < size:
        book["entries"].append(
            {
                "keys": [f"place-{i}", f"person-{i}"],
                "content": f"Entry {i}: the old mill by the river grinds the village's grain; "
                "its keeper remembers every traveller who ever crossed the ford.",
                "extensions": {},
                "enabled": True,
                "insertion_order": i,
            }
        )
        i += 1
    return card


def edit(card: dict[str, Any], turn: int) -> dict[str, Any]:
    """
    A small edit a game makes between turns: a new sentence, a tag, a
    lorebook entry changed, an extension value.
    """
    card = copy.deepcopy(card)
    data = card["data"]
    kind = turn % 4
    if kind == 0:
        data["description"] = data["description"].split(" Today:")[0] + f" Today: day {turn}."
    elif kind == 1:
        data["tags"] = [*data["tags"], f"met-{turn}"]
    elif kind == 2:
        entries = data.get("character_book", {}).get("entries") or []
        if entries:
            entries[turn % len(entries)]["content"] += f" (visited on turn {turn})"
        else:
            data["scenario"] += f" Turn {turn}."
    else:
        data["extensions"]["mood"] = ["calm", "wary", "merry"][turn % 3]
    return card


def _timeit(work: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return median(times)


def hashTimes(runs: int) -> list[tuple[str, int, float, float, float, float]]:
    """
    (card, JSON bytes, rfc8785, cold, unowned, cached) seconds per hash.
    """
    rows = []
    for label, size in (("5 KB", 5 * 1024), ("200 KB", 200 * 1024)):
        card = cardOfSize(size)
        reference = _timeit(lambda c=card: rfc8785.dumps(c), runs)
        cold = _timeit(lambda c=card: canonicalHash(c), runs)
        hasher = CardHasher(None)
        unowned = _timeit(lambda c=card, h=hasher: h.hashNow(c), runs)
        owned = hasher.canonicalNow(card).document
        cached = _timeit(lambda c=owned, h=hasher: h.hashNow(c), runs)
        rows.append((label, len(json.dumps(card).encode()), reference, cold, unowned, cached))
    return rows


def _entries(card: dict[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = card["data"]["character_book"]["entries"]
    return entries


def diffTimes(runs: int) -> list[tuple[str, float, float, int | None]]:
    """
    (edit, make_patch seconds, diff seconds, diff's operation count or None
    past its limit) on a 200 KB card.
    """
    base = cardOfSize(200 * 1024)
    one, front, every = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    _entries(one)[len(_entries(one)) // 2]["content"] += " (changed)"
    _entries(front).insert(0, {"keys": ["new"], "content": "A new entry.", "extensions": {}})
    for entry in _entries(every):
        entry["content"] += "!"
    rows = []
    for label, target in (
        ("one lorebook entry changed", one),
        ("one entry inserted at the front", front),
        ("every entry changed", every),
    ):
        slow = _timeit(lambda t=target: jsonpatch.make_patch(base, t), max(3, runs // 5))
        fast = _timeit(lambda t=target: diff(base, t), runs)
        operations = diff(base, target)
        rows.append((label, slow, fast, None if operations is None else len(operations)))
    return rows


def sessionBytes(size: int, turns: int = 20) -> dict[str, Any]:
    """
    Card bytes of a session of C{turns} turns, editing the card on every
    other turn: card-cache's choice against a snapshot each time.
    """
    harness = PluginHarness(CardCache(CardHasher(None), Timeline()))
    harness.startSession()
    engine = SessionCardStore()
    card = cardOfSize(size)
    snapshots = 0
    for turn in range(turns):
        if turn and turn % 2 == 0:
            card = edit(card, turn)
        requestId = f"t{turn}"
        transfer0 = snapshotTransfer(copy.deepcopy(card), "0" * 64)
        harness.toEngine(harness.replyRequest(requestId, card=transfer0))
        # card-cache diffs a large card in a reactor turn of its own.
        harness.clock.advance(0)
        request = harness.sentToEngine[-1]
        assert request.requestId == requestId, f"{requestId} did not reach RPEngine"
        transfer = request["card"]
        targetHash, _ = engine.resolve(transfer)
        assert targetHash == canonicalHash(card)
        snapshots += jsonSize(snapshotTransfer(card, targetHash))
        harness.toGame("reply.accepted", requestId=requestId)
        harness.toGame("reply.completed", requestId=requestId)
    modes: dict[str, int] = {}
    for mode, _ in engine.transfers:
        modes[mode] = modes.get(mode, 0) + 1
    sent = sum(n for _, n in engine.transfers)
    return {"modes": modes, "sent": sent, "snapshots": snapshots}


async def longestTurn(reactor: Any, split: bool, idle: bool, turns: int = 20) -> dict[str, float]:
    """
    The longest gap between beats of a 1 ms heartbeat on this reactor while
    the Python API plays C{turns} turns with a 200 KB card edited each time
    (or, with C{idle}, while nothing happens for as long).
    """
    settings = benchSettings()
    settings.plugins["card-cache"] = {"defer_threshold": 32 * 1024 if split else 10**9}
    services = PluginServices(reactor, settings, CardHasher(reactor), Timeline())
    plugins = buildChain(settings, discoverPlugins(), services)
    middleware = Middleware(reactor, settings, plugins, services=services)
    live = startMiddleware(reactor, settings, middleware=middleware)
    # RPEngine's simulator checks and hashes every card (milliseconds for 200 KB):
    # on the other CPU, as RPEngine would be in its own browser process.
    pin(1)
    engine = Peer(reactor, "engine", "--port", str(live.port), "--pin", "0")
    try:
        await engine.line("CONNECTED")
        await deferLater(reactor, 0.3, lambda: None)
        # Edited copies made beforehand: the copying is the game's work, not ours.
        cards = [cardOfSize(200 * 1024)]
        for turn in range(turns):
            cards.append(edit(cards[-1], turn))
        # The benchmark's own copies are the game's memory, not the
        # middleware's: keep them out of the collector's full passes.
        gc.collect()
        gc.freeze()
        gaps: list[float] = []
        last = [time.perf_counter()]

        def beat() -> None:
            now = time.perf_counter()
            gaps.append(now - last[0])
            last[0] = now

        heart = LoopingCall(beat)
        heart.clock = reactor
        heart.start(0.001, now=True)
        started = time.perf_counter()
        if idle:
            await deferLater(reactor, 2.0, lambda: None)
        else:
            for turn in range(turns):
                stream = middleware.requestReply(
                    "mira", text=f"turn {turn}", card=cards[turn + 1], output=TEXT_ONLY
                )
                await stream.done
        elapsed = time.perf_counter() - started
        heart.stop()
        gc.unfreeze()
        deferred = sum(getattr(p, "deferred", 0) for p in middleware.chain.plugins)
        return {
            "max": max(gaps),
            "p99": percentile(gaps, 99),
            "seconds": elapsed,
            "deferred": float(deferred),
        }
    finally:
        await engine.stop()
        await live.stop()


async def run(reactor: Any, quick: bool = False) -> Section:
    runs = 5 if quick else 15
    hashes = hashTimes(runs)
    hashRows = [
        (
            label,
            f"{size:,}",
            f"{reference * 1000:.2f} ms",
            f"{cold * 1000:.2f} ms",
            f"{unowned * 1000:.2f} ms",
            f"{cached * 1e6:.1f} us",
            f"{cached / cold:.2%}",
        )
        for label, size, reference, cold, unowned, cached in hashes
    ]
    diffRows = [
        (
            label,
            f"{slow * 1000:.2f} ms",
            f"{fast * 1000:.2f} ms",
            f"{slow / fast:.0f}x",
            "over the limit: snapshot" if count is None else str(count),
        )
        for label, slow, fast, count in diffTimes(runs)
    ]
    bytesRows = []
    sessions = {}
    for label, size in (("5 KB", 5 * 1024), ("200 KB", 200 * 1024)):
        result = sessionBytes(size)
        sessions[label] = result
        modes = ", ".join(f"{n} {m}" for m, n in sorted(result["modes"].items()))
        bytesRows.append(
            (
                label,
                modes,
                f"{result['sent']:,}",
                f"{result['snapshots']:,}",
                f"{result['sent'] / result['snapshots']:.1%}",
            )
        )
    turnsRuns = 1 if quick else 3
    idle, split, together = [], [], []
    for _ in range(turnsRuns):
        idle.append(await longestTurn(reactor, split=True, idle=True))
        split.append(await longestTurn(reactor, split=True, idle=False))
        together.append(await longestTurn(reactor, split=False, idle=False))

    def row(label: str, results: list[dict[str, float]]) -> tuple[str, ...]:
        return (
            label,
            f"{median([r['max'] for r in results]) * 1000:.2f} ms",
            f"{median([r['p99'] for r in results]) * 1000:.2f} ms",
            f"{median([r['deferred'] for r in results]):.0f}",
        )

    turnRows = [
        row("idle middleware (baseline)", idle),
        row("20 turns, 200 KB card edited each turn (default: diff in its own turn)", split),
        row("the same with the diff in the turn that hashed the card", together),
    ]
    cached200 = hashes[1][5] / hashes[1][3]
    bytes20 = sessions["200 KB"]["sent"] / sessions["200 KB"]["snapshots"]
    bytes5 = sessions["5 KB"]["sent"] / sessions["5 KB"]["snapshots"]
    longest = median([r["max"] for r in split])
    body = f"""
Hash time: median of {runs} runs. *rfc8785* is the pure-Python RFC 8785 encoder plus nothing
else (for these cards, which hold no floats, the same bytes as RPEngine's canonical form);
*cold* is `rpmiddleware.cards.validation.canonicalHash`, RPEngine's canonical form from the C `json`
encoder after one walk checks the card has nothing the two would spell differently (floats,
unusual keys); *unowned* is `CardHasher.hashNow` on a game's dict, which may have changed in place
since the last turn, so it is read again (and a private copy made); *cached* is `CardHasher.hashNow`
on a card the middleware owns (a client's `character`, a registered character, the copy that
travels in a request), found by identity. Ratio: cached / cold.

{table(["card", "JSON bytes", "rfc8785", "cold", "unowned", "cached", "cached / cold"], hashRows)}

Diff time on the 200 KB card (median; `make_patch` over fewer runs): `jsonpatch.make_patch`
looks for moves in arrays and is quadratic in them (reversing the lorebook took it 21 s when
measured once, so it is not run here); `rpmiddleware.cards.diff.diff` trims arrays by common prefix
and suffix and gives up past 128 operations, when a snapshot is sent instead.

{table(["edit", "make_patch", "cards.diff.diff", "speed-up", "operations"], diffRows)}

Card bytes over a 20-turn session (the `card` field as it goes on the wire, compact JSON), the
card edited a little on every other turn (a sentence, a tag, a lorebook entry, an extension
value); RPEngine's cache is the simulator's card store, which recomputes every hash itself.
Baseline: a snapshot every turn.

{table(["card", "transfers sent", "bytes sent", "bytes as snapshots", "ratio"], bytesRows)}

Longest reactor turn: a 1 ms `LoopingCall` heartbeat on the middleware's reactor (this process,
pinned to CPU 1) records the largest gap between beats while the Python API plays 20 text turns,
each with the 200 KB card edited (a game's dict: written as sorted JSON in the turn it is given,
parsed in the next, checked and hashed in the one after, diffed against the last one in a fourth
and the patch checked in a fifth), RPEngine simulated in another process pinned to CPU 0 so its
own card checks do not land on this reactor; the benchmark's own copies of
the cards are frozen out of the garbage collector's view (`gc.freeze`), as a game's would be in
its own process. Median of {turnsRuns} runs; the last column counts the diffs and patch checks
card-cache ran in a reactor turn of their own, and the last row turns that off (the hash still
takes its own turns). No thread is used: this work holds the GIL, and a thread holding it made
the reactor wait longer than the work itself (23 ms turns when threads did this work).

{table(["scenario", "longest gap", "p99 gap", "turns of their own"], turnRows)}
"""
    section = Section("Cards (benchmark 5)", body)
    section.goals = [
        ("cached 200 KB hash <= 1% of cold", f"{cached200:.2%}", cached200 <= 0.01),
        (
            "no reactor turn over 10 ms while 200 KB cards are hashed/diffed",
            f"{longest * 1000:.1f} ms",
            longest <= 0.010,
        ),
        (
            "card bytes over 20 turns with small edits <= 10% of snapshots",
            f"{bytes20:.1%} (200 KB), {bytes5:.1%} (5 KB)",
            bytes20 <= 0.10 and bytes5 <= 0.10,
        ),
    ]
    return section


def main() -> None:
    from twisted.internet import task

    async def go(reactor: Any) -> None:
        section = await run(reactor, quick=True)
        print(section.markdown())
        for goal in section.goals:
            print(goal)

    task.react(lambda reactor: Deferred.fromCoroutine(go(reactor)))


if __name__ == "__main__":
    main()
