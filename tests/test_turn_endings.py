"""
No turn waits forever (issue 21): a malformed terminal answer from RPEngine,
a stream that stalls after acceptance, each ended within its bound on a
L{Clock}.  (RPEngine's tab leaving the file mailbox: test_mailbox_reader.)
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.client.turns import TEXT, Turn
from rpmiddleware.config.settings import ConfigError, check, parseSettings
from rpmiddleware.core.replystream import ReplyFailed, ReplyStream
from rpmiddleware.engine.queue import EngineQueue
from rpmiddleware.protocol.clienterrors import LLM_ERROR, LLM_TIMEOUT, engineErrorMessage
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import captureLogEvents
from tests.support.engine import Harness
from tests.support.turns import Recorder, startedTurn


def hostileError(session: Any, requestId: str, messageId: str | None = None) -> dict[str, Any]:
    fields = Envelope.build(
        "request.error",
        session.sessionId,
        requestId=requestId,
        code="request_failed",
        retryable="yes",
        message="x" * 100_000,
    ).fields
    if messageId is not None:
        fields["messageId"] = messageId
    return fields


class MalformedEndingTests(SynchronousTestCase):
    def accepted(self) -> tuple[Harness, Any, Any]:
        h = Harness()
        session, writer = h.connect()
        stream = h.middleware.requestReply("mira", text="Hello")
        h.ack(session, writer, "reply.request")
        h.engineSays(session, "reply.accepted", requestId=stream.requestId, queueDepth=1)
        return h, session, stream

    def test_hostileRequestErrorEndsTheTurnAtOnce(self) -> None:
        """
        request.error with retryable "yes" and a 100,000-character message
        for a live request ends it in the same call (no clock advance), with
        an error naming the invalid field; the log says it once, short.
        """
        events = captureLogEvents(self)
        h, session, stream = self.accepted()
        fields = hostileError(session, stream.requestId)
        for _ in range(3):  # the same copy again and again
            session.received(dict(fields))
        failure = self.failureResultOf(stream.done, ReplyFailed)
        self.assertEqual(failure.value.code, "engine_protocol_error")
        self.assertTrue(failure.value.retryable)
        ending = failure.value.envelope
        self.assertIn("request.error.retryable must be boolean", ending["message"])
        self.assertLess(len(ending["message"]), 700)
        self.assertEqual(h.middleware.link.openRequests(), [])
        dropped = [e for e in events if "dropped invalid envelope" in e.get("log_format", "")]
        self.assertEqual(len(dropped), 1)
        self.assertLess(len(str(dropped[0]["reason"])), 400)
        self.assertEqual(session.duplicatesDropped, 2)
        client = engineErrorMessage(ending.fields, stream.requestId)
        self.assertEqual((client["code"], client["retryable"]), (LLM_ERROR, True))
        self.assertEqual(client["engineCode"], "engine_protocol_error")
        self.assertIn("retryable", client["message"])

    def test_otherTerminalTypes(self) -> None:
        """
        A malformed reply.completed or reply.cancelled ends its request too,
        naming the field.
        """
        for kind, bad in (
            ("reply.completed", {"modalities": "text"}),
            ("reply.cancelled", {"reason": 7}),
        ):
            h, session, stream = self.accepted()
            session.received(
                Envelope.build(kind, session.sessionId, requestId=stream.requestId, **bad).fields
            )
            failure = self.failureResultOf(stream.done, ReplyFailed)
            self.assertEqual(failure.value.code, "engine_protocol_error")
            self.assertIn(f"{kind}.", failure.value.envelope["message"])

    def test_nonTerminalDropped(self) -> None:
        """
        A malformed envelope that is not terminal by type ends nothing.
        """
        h, session, stream = self.accepted()
        session.received(
            Envelope.build(
                "reply.text.delta",
                session.sessionId,
                requestId=stream.requestId,
                sequence="0",
                delta="x",
            ).fields
        )
        self.assertNoResult(stream.done)
        self.assertEqual(h.middleware.link.openRequests(), [stream.requestId])

    def test_unknownRequestDropped(self) -> None:
        """
        One naming no open request (finished, another session's, made up)
        reaches nobody, and a later valid ending still counts.
        """
        h, session, stream = self.accepted()
        session.received(hostileError(session, "not-a-request"))
        self.assertNoResult(stream.done)
        h.engineSays(session, "reply.completed", requestId=stream.requestId)
        self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        session.received(hostileError(session, stream.requestId))
        self.assertEqual(h.middleware.link.openRequests(), [])


def engine(kind: str, requestId: str, **fields: Any) -> Envelope:
    return Envelope.build(kind, "s", requestId=requestId, **fields)


class EngineQueueTests(SynchronousTestCase):
    def test_orderOfAcceptance(self) -> None:
        """
        The oldest accepted open reply is active; the others wait; when it
        ends the next one is; a started stream is active whatever its place.
        """
        queue = EngineQueue()
        for depth, r in enumerate(("a", "b", "c"), 1):
            queue.received(engine("reply.accepted", r, queueDepth=depth))
        self.assertEqual([queue.isActive(r) for r in "abc"], [True, False, False])
        self.assertEqual(queue.position("c"), 2)
        became: list[str] = []
        queue.whenActive("b", lambda: became.append("b"))
        queue.whenActive("c", lambda: became.append("c"))
        queue.received(engine("reply.completed", "a"))
        self.assertEqual((became, queue.isActive("b"), queue.isActive("c")), (["b"], True, False))
        queue.received(engine("reply.text.delta", "c", sequence=0, delta="x"))
        self.assertEqual(became, ["b", "c"])
        self.assertFalse(queue.isActive("unknown"))

    def test_captureBesideTheQueue(self) -> None:
        """
        A capture at the microphone does not hold up the reply queue; its
        words put it at the back (app.rs stt_completed).
        """
        queue = EngineQueue()
        queue.received(engine("reply.accepted", "v", queueDepth=1))
        queue.received(engine("voice.capture.state", "v", state="listening"))
        queue.received(engine("reply.accepted", "a", queueDepth=2))
        self.assertTrue(queue.isActive("v") and queue.isActive("a"))
        queue.received(engine("reply.text.delta", "a", sequence=0, delta="x"))
        queue.received(engine("voice.capture.transcript", "v", text="hi"))
        self.assertFalse(queue.isActive("v"))
        queue.received(engine("reply.completed", "a"))
        self.assertTrue(queue.isActive("v"))

    def test_emptyQueueSaysNothingWaits(self) -> None:
        """
        capacity.update with queueDepth 0 while a request is open here:
        RPEngine holds nothing of it, so it is not waiting its turn.
        """
        queue = EngineQueue()
        queue.received(engine("reply.accepted", "a", queueDepth=1))
        queue.received(engine("reply.accepted", "b", queueDepth=2))
        self.assertFalse(queue.isActive("b"))
        queue.received(
            Envelope.build(
                "capacity.update", "s", queueDepth=0, queueLimit=20, acceptingRequests=True
            )
        )
        self.assertTrue(queue.isActive("b"))
        queue.reset()
        self.assertFalse(queue.isActive("a"))

    def test_acceptedAloneForgetsStaleOnes(self) -> None:
        """
        reply.accepted with queueDepth 1: RPEngine holds nothing else, so a
        request whose end we never heard no longer keeps this one waiting.
        """
        queue = EngineQueue()
        queue.received(engine("reply.accepted", "lost", queueDepth=1))
        queue.received(engine("reply.accepted", "b", queueDepth=2))
        self.assertFalse(queue.isActive("b"))
        queue.received(engine("reply.accepted", "c", queueDepth=1))
        self.assertTrue(queue.isActive("c"))
        self.assertIsNone(queue.position("lost"))


class StallTests(SynchronousTestCase):
    """
    client.stall_timeout on a Clock: RPEngine's active request, silent for
    the timeout, is cancelled upstream with LLM_TIMEOUT; a queued one is not
    timed until it is active.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.queue = EngineQueue()
        self.cancels: list[str] = []

    def turn(self, requestId: str, stall: float = 60.0) -> tuple[Turn, ReplyStream, Recorder]:
        stream = ReplyStream(requestId, lambda s: self.cancels.append(s.requestId))
        turn, send = startedTurn(stream, self.clock, self.queue, stall=stall)
        return turn, stream, send

    def say(self, stream: ReplyStream, kind: str, **fields: Any) -> None:
        envelope = engine(kind, stream.requestId, **fields)
        self.queue.received(envelope)  # the router's observers come first
        stream.received(envelope)

    def test_activeSilentTurnEnds(self) -> None:
        """
        Accepted as the only request, then a delta, then nothing: at 60 s
        after the delta (not before) LLM_TIMEOUT, tts-cancelled, and
        request.cancel upstream.
        """
        turn, stream, send = self.turn("a")
        self.say(stream, "reply.accepted", queueDepth=1)
        self.clock.advance(50)
        self.say(stream, "reply.text.delta", sequence=0, delta="Well")
        self.clock.advance(59.9)
        self.assertIsNone(turn.outcome)
        self.assertEqual(send.of("error"), [])
        self.clock.advance(0.1)
        [error] = send.of("error")
        self.assertEqual(
            (error["code"], error["retryable"], error["turnId"]), (LLM_TIMEOUT, True, "a")
        )
        self.assertIn("60 s", error["message"])
        self.assertEqual(send.types()[-1], "tts-cancelled")
        self.assertEqual(self.cancels, ["a"])

    def test_firstTokenWithinTheTimeout(self) -> None:
        """
        A slow first token (59 s after acceptance) and a steady stream do
        not trip it; the turn completes.
        """
        turn, stream, send = self.turn("a")
        self.say(stream, "reply.accepted", queueDepth=1)
        self.clock.advance(59)
        for n in range(10):
            self.say(stream, "reply.text.delta", sequence=n, delta="w ")
            self.clock.advance(30)
        self.say(stream, "reply.completed")
        self.clock.advance(600)
        self.assertEqual(turn.outcome, "completed")
        self.assertEqual((send.of("error"), self.cancels), ([], []))

    def test_queuedTurnWaitsItsTurn(self) -> None:
        """
        Behind another request for ten minutes, untimed; timed from when the
        one ahead ends: LLM_TIMEOUT 60 s later if it then stays silent.
        """
        ahead, aheadStream, _ = self.turn("a", stall=0)
        turn, stream, send = self.turn("b")
        self.say(aheadStream, "reply.accepted", queueDepth=1)
        self.say(stream, "reply.accepted", queueDepth=2)
        for n in range(20):
            self.clock.advance(30)
            self.say(aheadStream, "reply.text.delta", sequence=n, delta="w ")
        self.assertEqual(send.of("error"), [])
        self.say(aheadStream, "reply.completed")
        self.clock.advance(59)
        self.assertIsNone(turn.outcome)
        self.clock.advance(1)
        self.assertEqual([e["code"] for e in send.of("error")], [LLM_TIMEOUT])
        self.assertEqual(self.cancels, ["b"])

    def test_zeroWaitsForever(self) -> None:
        turn, stream, send = self.turn("a", stall=0)
        self.say(stream, "reply.accepted", queueDepth=1)
        self.clock.advance(3600)
        self.assertEqual((turn.outcome, send.of("error")), (None, []))

    def test_configured(self) -> None:
        """
        client.stall_timeout is a setting (default 60 s); a negative one is
        refused by name.
        """
        self.assertEqual(parseSettings({}).client.stall_timeout, 60.0)
        self.assertEqual(parseSettings({"client": {"stall_timeout": 5}}).client.stall_timeout, 5)
        with self.assertRaises(ConfigError) as e:
            check(parseSettings({"client": {"stall_timeout": -1.0}}))
        self.assertIn("client.stall_timeout", str(e.exception))


class StallOverTheProductTests(SynchronousTestCase):
    """
    The stall rule with the middleware's own queue tracker, over an engine
    session (the WebSocket's; the mailbox's is in test_mailbox_reader).
    """

    def test_silentAfterAcceptance(self) -> None:
        h = Harness()
        session, writer = h.connect()
        stream = h.middleware.requestReply("mira", text="Hello")
        turn, send = startedTurn(stream, h.clock, h.middleware.engineQueue, "Hello")
        h.ack(session, writer, "reply.request")
        h.engineSays(session, "reply.accepted", requestId=stream.requestId, queueDepth=1)
        h.clock.advance(59.0)
        self.assertEqual(send.of("error"), [])
        h.clock.advance(1.0)
        self.assertEqual([e["code"] for e in send.of("error")], [LLM_TIMEOUT])
        cancels = [m for m in writer.sent if m["type"] == "request.cancel"]
        self.assertEqual([m["requestId"] for m in cancels], [stream.requestId])

    def test_malformedEndingReachesTheClient(self) -> None:
        """
        The hostile request.error, through the session and the link, is an
        error and tts-cancelled for the client in the same call.
        """
        h = Harness()
        session, writer = h.connect()
        stream = h.middleware.requestReply("mira", text="Hello")
        send = Recorder()
        turn = Turn(TEXT, stream, send, None, h.clock, 300.0, lambda t: None, "Hello")
        turn.start()
        h.ack(session, writer, "reply.request")
        h.engineSays(session, "reply.accepted", requestId=stream.requestId, queueDepth=1)
        session.received(hostileError(session, stream.requestId))
        self.assertEqual(turn.outcome, "failed")
        [error] = send.of("error")
        self.assertEqual(
            (error["code"], error["engineCode"], error["retryable"]),
            (LLM_ERROR, "engine_protocol_error", True),
        )
        self.assertIn("request.error.retryable must be boolean", error["message"])
        self.assertEqual(send.types()[-1], "tts-cancelled")
