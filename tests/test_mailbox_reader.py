"""
File mode learns that RPEngine is gone (issue 21, item 2): with the
simulated RPEngine in file mode on a L{Clock} and a temporary folder, a tab
that stops reading the mailbox ends the turns waiting on it within 10 s,
shows it in the status and /metrics, and is taken back when it reads again
or says hello; a tab that is merely busy (a full queue, a slow model) is
never taken for gone.
"""

from __future__ import annotations

import os

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.client.turns import Turn
from rpmiddleware.console.metrics import MiddlewareMetrics
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.engine.mailbox.files import TO_ENGINE
from rpmiddleware.engine.mailbox.watch import PROBE_PREFIX
from rpmiddleware.protocol.clienterrors import LLM_ERROR, LLM_TIMEOUT, engineErrorMessage
from rpmiddleware.testing.kit import captureLogEvents
from tests.support.mailbox import Rig, ending, transportOf
from tests.support.turns import Recorder, startedTurn

#: The bound the product promises.
BOUND = 10.0


def endedWithin(case: SynchronousTestCase, rig: Rig, stream: ReplyStream, seconds: float) -> float:
    """
    Run the clock until C{stream} ends, at most C{seconds}; how long it took.
    """
    started = rig.clock.seconds()
    while not stream.done.called and rig.clock.seconds() - started < seconds:
        rig.run(0.05, step=0.05)
    case.assertTrue(stream.done.called, f"not ended within {seconds} s")
    return rig.clock.seconds() - started


class GoneTests(SynchronousTestCase):
    def test_goneMidTurn(self) -> None:
        """
        The tab goes mid-reply (it had accepted the turn): the turn ends
        within 10 s with engine_not_reading (LLM_ERROR for a client, retryable,
        a sentence naming the folder); RPEngine counts as gone in the link,
        the status and /metrics; the log says it once.
        """
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=2.0)
        metrics = MiddlewareMetrics(rig.middleware)
        self.addCleanup(metrics.stop)
        turn = rig.ask()
        rig.run(1.0)
        self.assertTrue(any(e.type == "reply.text.delta" for e in turn.envelopes))
        events = captureLogEvents(self)
        transportOf(engine).disconnect(notify=False)
        self.assertLess(endedWithin(self, rig, turn, BOUND), BOUND)
        error = ending(turn)
        self.assertEqual((error["code"], error["retryable"]), ("engine_not_reading", True))
        self.assertIn("stopped reading the mailbox folder", error["message"])
        self.assertIn(rig.root, error["message"])
        client = engineErrorMessage(error.fields, turn.requestId)
        self.assertEqual((client["code"], client["retryable"]), (LLM_ERROR, True))
        link = rig.middleware.link
        self.assertIsNone(link.session)
        self.assertIn("stopped reading", str(link.problem))
        exposition = metrics.exposition().decode()
        self.assertIn("rpmiddleware_engine_connected 0.0", exposition)
        self.assertIn("rpmiddleware_engine_not_reading 1.0", exposition)
        gone = [e for e in events if "has not read the mailbox" in e.get("log_format", "")]
        self.assertEqual(len(gone), 1)
        rig.run(30.0)
        self.assertEqual(
            len([e for e in events if "has not read the mailbox" in e.get("log_format", "")]), 1
        )

    def test_goneBeforeReading(self) -> None:
        """
        The tab is gone before it reads the request: the turn ends within
        10 s, and the request is taken back from the folder (no tab plays it
        later).
        """
        rig = Rig(self)
        engine = rig.engine()
        transportOf(engine).disconnect(notify=False)
        turn = rig.ask()
        self.assertLess(endedWithin(self, rig, turn, BOUND), BOUND)
        self.assertEqual(ending(turn)["code"], "engine_not_reading")
        leftover = [n for n in rig.files(TO_ENGINE) if n.endswith(".json")]
        self.assertNotIn(turn.requestId, " ".join(_contents(rig, n) for n in leftover))

    def test_backWhenItReadsAgain(self) -> None:
        """
        The same tab wakes (it had been frozen): it reads the cancel of the
        turn it had accepted and the welcome offered meanwhile; the session
        is live again without a hello, the problem is gone, and the next
        turn plays.
        """
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=2.0)
        transport = transportOf(engine)
        first = rig.ask()
        rig.run(1.0)
        transport.disconnect(notify=False)
        endedWithin(self, rig, first, BOUND)
        waiting = rig.ask("Still there?")
        rig.run(20.0)
        self.assertFalse(waiting.done.called)  # waits for an RPEngine, as with none
        transport.connected = True
        transport.poll()
        rig.run(1.0)
        link = rig.middleware.link
        self.assertIsNotNone(link.session)
        self.assertIsNone(link.problem)
        # The cancel written when it was judged gone reached it (the
        # simulated model had finished meanwhile: not_active).
        self.assertIn(first.requestId, [r for r, _ in engine.cancellations])
        rig.run(20.0)
        self.assertEqual(ending(waiting).type, "reply.completed")

    def test_backAtANewHello(self) -> None:
        """
        Another tab opens and says hello: live again, its turn plays.
        """
        rig = Rig(self)
        engine = rig.engine()
        transportOf(engine).disconnect(notify=False)
        first = rig.ask()
        endedWithin(self, rig, first, BOUND)
        rig.engine()
        self.assertIsNone(rig.middleware.link.problem)
        second = rig.ask()
        rig.run(6.0)
        self.assertEqual(ending(second).type, "reply.completed")


class BusyTests(SynchronousTestCase):
    def test_busyIsNotGone(self) -> None:
        """
        RPEngine busy for minutes: a model that makes a token every 8 s and
        five requests queued behind each other.  It reads and acknowledges
        everything promptly (probes included), so none is ended; all
        complete, each once.
        """
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=0.125)
        turns = [rig.ask(f"Question {n}?") for n in range(5)]
        rig.run(60.0, step=0.05)
        self.assertEqual([t for t in turns if t.done.called], [])
        self.assertGreater(rig.endpoint.watch.probesSent, 0)
        self.assertIsNotNone(rig.middleware.link.session)
        for _ in range(200):
            if all(t.done.called for t in turns):
                break
            rig.run(10.0, step=0.05)
        self.assertEqual([ending(t).type for t in turns], ["reply.completed"] * 5)
        self.assertEqual({t.requestId: 1 for t in turns}, dict(engine.processed))
        self.assertIsNone(rig.middleware.link.problem)
        # The probes named no capture and changed nothing.
        probes = [
            m
            for m in engine.receivedMessages
            if str(m.get("requestId", "")).startswith(PROBE_PREFIX)
        ]
        self.assertEqual({m["type"] for m in probes}, {"voice.capture.stop"})

    def test_idleIsNotJudged(self) -> None:
        """
        With nothing waiting on RPEngine, a tab that does not read is not
        judged (nothing to end, nothing probed).
        """
        rig = Rig(self)
        engine = rig.engine()
        transportOf(engine).disconnect(notify=False)
        rig.run(60.0, step=0.05)
        self.assertIsNotNone(rig.middleware.link.session)
        self.assertEqual(rig.endpoint.watch.probesSent, 0)


def _contents(rig: Rig, name: str) -> str:
    with open(os.path.join(rig.root, TO_ENGINE, name), encoding="utf-8") as f:
        return f.read()


class StallInFileModeTests(SynchronousTestCase):
    def test_modelFrozenAfterAcceptance(self) -> None:
        """
        File mode, RPEngine alive (it reads and acks, probes included) but
        its model frozen after accepting: the client turn ends with
        LLM_TIMEOUT 60 s after acceptance, RPEngine gets request.cancel, and
        the session is never judged gone; a second turn queued behind it
        was not timed meanwhile.
        """
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=0.001)
        sends: list[Recorder] = []
        turns: list[Turn] = []
        for text in ("First?", "Second?"):
            stream = rig.ask(text)
            turn, send = startedTurn(stream, rig.clock, rig.middleware.engineQueue, text)
            sends.append(send)
            turns.append(turn)
        rig.run(1.0, step=0.05)
        self.assertTrue(all(turn.accepted for turn in turns))
        rig.run(58.0, step=0.05)
        self.assertEqual([s.of("error") for s in sends], [[], []])
        rig.run(2.0, step=0.05)
        self.assertEqual([e["code"] for e in sends[0].of("error")], [LLM_TIMEOUT])
        self.assertEqual(sends[1].of("error"), [])
        self.assertIn(turns[0].id, engine.cancelled)
        self.assertIsNone(rig.middleware.link.problem)
        self.assertIsNotNone(rig.middleware.link.session)
