"""
Benchmark 9: scenes and actions.

  - The gap between two characters' lines.  The scene plugin sends the next
    character's request as soon as the line it answers is complete as text,
    so it waits in RPEngine's queue (FIFO, one reply at a time) while that
    line is still synthesised and played.  In the simulated RPEngine's time
    (RPEngine's pacing: text at 20 tokens a second, speech synthesised as
    long as it plays), the gap from the guard's last speech to the
    innkeeper's first is compared with the innkeeper's own time to first
    speech when asked alone (the model's time, the floor), and with what a
    middleware that waits for the guard's line to end would add.
  - Our part of that gap in wall-clock time: from the guard's
    reply.text.completed entering the middleware to the innkeeper's
    reply.request leaving it (the scene plugin, memory's plan, the chain),
    against a plain request's way through the same chain, measured in the
    same run.
  - What buffering costs: a turn offered actions is buffered (RPEngine
    holds text and speech until generation completes, docs/protocol-v3.md),
    so its first speech waits for the whole reply; in the simulator's time,
    against the same reply unbuffered.
"""

from __future__ import annotations

import json
import time
from typing import Any

from twisted.internet.task import Clock

from bench.common import Section, median, percentile, table
from rpmiddleware.builtin.actions import IActions
from rpmiddleware.builtin.scene import IScenes
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import DEFAULT_OUTPUT, Middleware
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.inmemory import InMemoryEngine, connectInMemory
from rpmiddleware.testing.kit import exampleAction, exampleCard
from rpmiddleware.testing.simoptions import SimulatorOptions

GUARD = (
    "Halt, traveller. The north gate stays shut after dark, by order of the captain. "
    "If you have business in town, state it plainly and quickly."
)
INNKEEPER = "Oh, let the poor soul through, Garrick. It is pouring out there."
OPEN_GATE = exampleAction()


def _card(name: str) -> dict[str, Any]:
    return exampleCard(name=name, mes_example="", first_mes="")


class _Run:
    """A middleware with the default chain and the simulator on a Clock."""

    def __init__(self, realtime: bool, lines: dict[str, str]) -> None:
        self.clock = Clock()
        settings = Settings()
        settings.plugins["memory"] = {"path": ":memory:", "summaries": False}
        self.middleware = Middleware.fromSettings(self.clock, settings)
        options = SimulatorOptions(
            tokensPerSecond=20.0 if realtime else None,
            audioRealtime=realtime,
            replyText=lambda request: lines.get(str(request.get("characterId")), "Yes."),
        )
        self.link: InMemoryEngine = connectInMemory(self.middleware, self.clock, options)
        # Past the handshake and RPEngine's first capacity report.
        self.advance(6)
        self.cards = {"garrick": _card("Garrick"), "mara": _card("Mara")}
        self.cast: list[dict[str, Any]] = [
            {"characterId": "garrick", "card": self.cards["garrick"], "voice": "M2"},
            {"characterId": "mara", "card": self.cards["mara"], "voice": "F3"},
        ]

    def advance(self, seconds: float) -> None:
        """Run every call due in the next C{seconds}, in order (bounded)."""
        end = self.clock.seconds() + seconds
        for _ in range(100_000):
            due = [c.getTime() for c in self.clock.getDelayedCalls() if c.getTime() <= end]
            if not due:
                break
            self.clock.advance(max(0.0, min(due) - self.clock.seconds()))
        self.clock.advance(max(0.0, end - self.clock.seconds()))

    def ask(self, characterId: str, text: str) -> Any:
        return self.middleware.requestReply(
            characterId,
            text=text,
            card=self.cards[characterId],
            output=DEFAULT_OUTPUT,
            player={"displayName": "Alex"},
        )


def _speech(stream: Any, clock: Clock) -> list[tuple[str, float]]:
    """(speaker, simulated time) of each speech chunk, as the turn got it."""
    seen: list[tuple[str, float]] = []

    def observe(envelope: Envelope) -> None:
        if envelope.type == "reply.audio.chunk":
            speaker = envelope.meta.get("speaker", {}).get("characterId", "")
            seen.append((speaker, clock.seconds()))

    stream.subscribe(observe)
    return seen


def lineGap() -> dict[str, float]:
    """
    Simulated seconds: the gap between the guard's last speech and the
    innkeeper's first; the model's own part of it (from RPEngine taking up
    the innkeeper's request, when the guard's reply completed there, to her
    first speech); and the guard's speech, which a middleware that waits
    for a line to be played before asking for the next would add.
    """
    run = _Run(True, {"garrick": GUARD, "mara": INNKEEPER})
    run.middleware.plugin(IScenes).openScene({"sceneId": "gate", "cast": run.cast})
    completed: list[float] = []
    session = run.link.session
    received = session.received

    def watch(fields: dict[str, Any]) -> None:
        if fields.get("type") == "reply.completed":
            completed.append(run.clock.seconds())
        received(fields)

    setattr(session, "received", watch)  # noqa: B010 (wraps what the link calls)
    seen = _speech(run.ask("garrick", "Garrick, may I pass?"), run.clock)
    run.advance(60)
    guard = [t for who, t in seen if who == "garrick"]
    mara = [t for who, t in seen if who == "mara"]
    return {
        "gap": mara[0] - guard[-1],
        "floor": mara[0] - completed[0],
        "guardSpeech": guard[-1] - guard[0],
    }


def bufferingCost() -> tuple[float, float]:
    """Simulated seconds to first speech of the guard's reply: (unbuffered, buffered)."""
    firsts = []
    for offered in (False, True):
        run = _Run(True, {"garrick": GUARD})
        if offered:
            run.middleware.plugin(IActions).declare([OPEN_GATE])
        began = run.clock.seconds()
        seen = _speech(run.ask("garrick", "Open the gate."), run.clock)
        run.advance(30)
        firsts.append(seen[0][1] - began)
    return firsts[0], firsts[1]


def _handoff() -> tuple[float, float]:
    """
    One run, wall clock: the guard's reply.text.completed to the
    innkeeper's request reaching RPEngine, and the guard's own request from
    C{requestReply} to RPEngine (a plain request's way through the chain).
    """
    run = _Run(False, {"garrick": GUARD, "mara": INNKEEPER})
    run.middleware.plugin(IScenes).openScene({"sceneId": "gate", "cast": run.cast})
    marks: dict[str, float] = {}
    engine, session = run.link.engine, run.link.session
    receivedFrame, received = engine.receivedFrame, session.received

    def arrived(payload: bytes) -> None:
        # RPEngine reads an envelope of ours: the chain is behind it.
        if b'"reply.request"' in payload:
            marks.setdefault(json.loads(payload)["characterId"], time.perf_counter())
        receivedFrame(payload)

    def entered(fields: dict[str, Any]) -> None:
        # RPEngine's envelope enters the middleware.
        if fields.get("type") == "reply.text.completed":
            marks.setdefault("textCompleted", time.perf_counter())
        received(fields)

    setattr(engine, "receivedFrame", arrived)  # noqa: B010 (wraps what the link calls)
    setattr(session, "received", entered)  # noqa: B010
    asked = time.perf_counter()
    run.ask("garrick", "Garrick, may I pass?")
    run.advance(0)
    plain = marks["garrick"] - asked
    run.advance(5)
    return marks["mara"] - marks["textCompleted"], plain


def ourPart(runs: int) -> tuple[list[float], list[float]]:
    measured = [_handoff() for _ in range(runs)]
    return [m[0] for m in measured], [m[1] for m in measured]


async def run(reactor: Any, quick: bool) -> Section:
    gap = lineGap()
    unbuffered, buffered = bufferingCost()
    handoffs, plain = ourPart(20 if quick else 100)
    ms = 1000.0
    body = "\n\n".join(
        [
            "The guard answers the player and the innkeeper reacts, with RPEngine's pacing in "
            "the simulated RPEngine's time (20 tokens a second, speech synthesised as long as "
            "it plays, one reply at a time):",
            table(
                ["what", "simulated seconds"],
                [
                    ["gap: the guard's last speech to the innkeeper's first", f"{gap['gap']:.2f}"],
                    [
                        "the model's part: RPEngine taking up her request to her first speech",
                        f"{gap['floor']:.2f}",
                    ],
                    [
                        "the guard's speech, which waiting for his line to be played would add",
                        f"{gap['guardSpeech']:.2f}",
                    ],
                ],
            ),
            "Our part of the gap, wall clock: the guard's `reply.text.completed` entering the "
            "middleware to the innkeeper's `reply.request` leaving the chain (scene, actions, "
            "memory's plan, the rest of the chain), against a plain request's way from "
            "`requestReply` through the same chain, in the same run:",
            table(
                ["path", "p50 ms", "p95 ms", "ratio p50"],
                [
                    [
                        "line complete -> next character's request",
                        f"{median(handoffs) * ms:.3f}",
                        f"{percentile(handoffs, 95) * ms:.3f}",
                        f"{median(handoffs) / median(plain):.2f}x",
                    ],
                    [
                        "a plain request through the chain (floor)",
                        f"{median(plain) * ms:.3f}",
                        f"{percentile(plain, 95) * ms:.3f}",
                        "1.00x",
                    ],
                ],
            ),
            "What buffering costs: a turn offered actions is buffered (RPEngine holds text and "
            "speech until the whole reply is generated), so its first speech waits for the "
            f"whole reply: {buffered:.2f} s against {unbuffered:.2f} s unbuffered for the "
            f"guard's {len(GUARD.split())}-word line ({buffered / unbuffered:.1f}x), in "
            "simulated time. Turns offered no action stay unbuffered.",
        ]
    )
    goals = [
        (
            "scene: the gap between two lines is the model's time (<= 1.1x the floor)",
            f"{gap['gap']:.2f} s vs {gap['floor']:.2f} s ({gap['gap'] / gap['floor']:.2f}x)",
            gap["gap"] <= 1.1 * gap["floor"],
        )
    ]
    return Section("Scenes: the gap between lines, and buffering (benchmark 9)", body, goals)
