"""
One RPEngine session: handshake, validation, duplicates and acknowledgements,
driven with a Clock and a list instead of a socket.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from rpmiddleware.engine.session import (
    CLOSE_HELLO_TIMEOUT,
    EngineSession,
    SessionOptions,
    decodeText,
)
from rpmiddleware.plugin.interfaces import IEngineSessionInfo
from rpmiddleware.protocol.envelope import PROTOCOL, Envelope
from rpmiddleware.protocol.messages import ProtocolViolation
from rpmiddleware.testing.kit import captureLogEvents
from tests.support.engine import FakeWriter


class SessionHarness:
    def __init__(self, **options: Any) -> None:
        self.clock = Clock()
        self.writer = FakeWriter()
        self.welcomed: list[EngineSession] = []
        self.delivered: list[Envelope] = []
        self.acked: list[Envelope] = []
        self.closed: list[EngineSession] = []
        self.session = EngineSession(
            self.writer,
            self.clock,
            SessionOptions(serverVersion="test-1.0", **options),
            onWelcome=self.welcomed.append,
            onEnvelope=lambda s, e: self.delivered.append(e),
            onClosed=self.closed.append,
            onAcked=lambda s, e: self.acked.append(e),
            peer="tcp4:127.0.0.1:1",
        )

    def hello(self) -> dict[str, Any]:
        self.session.received(Envelope.build("hello", clientVersion="rpengine-test").fields)
        return self.writer.sent[-1]

    def fromEngine(self, type: str, **fields: Any) -> dict[str, Any]:
        envelope = Envelope.build(type, self.session.sessionId, **fields).fields
        self.session.received(envelope)
        return envelope


class HandshakeTests(SynchronousTestCase):
    def test_welcome(self) -> None:
        """
        hello is answered at once with welcome: a new sessionId, our
        serverVersion, and every envelope field the seed lists.
        """
        h = SessionHarness()
        welcome = h.hello()
        self.assertEqual(welcome["type"], "welcome")
        self.assertEqual(welcome["protocol"], PROTOCOL)
        self.assertEqual(welcome["protocolVersion"], 3)
        self.assertEqual(welcome["serverVersion"], "test-1.0")
        self.assertTrue(welcome["sessionId"])
        self.assertTrue(welcome["messageId"])
        self.assertTrue(welcome["timestamp"].endswith("Z"))
        self.assertEqual(h.welcomed, [h.session])
        self.assertEqual(h.session.sessionId, welcome["sessionId"])

    def test_newSessionEachHandshake(self) -> None:
        self.assertNotEqual(
            SessionHarness().hello()["sessionId"], SessionHarness().hello()["sessionId"]
        )

    def test_helloTimeout(self) -> None:
        """
        No hello within five seconds: the connection is closed.
        """
        h = SessionHarness()
        h.clock.advance(4.9)
        self.assertIsNone(h.writer.closedWith)
        h.clock.advance(0.2)
        self.assertEqual(h.writer.closedWith[0], CLOSE_HELLO_TIMEOUT)  # type: ignore[index]

    def test_helloInTime(self) -> None:
        h = SessionHarness()
        h.clock.advance(4)
        h.hello()
        h.clock.advance(10)
        self.assertIsNone(h.writer.closedWith)

    def test_messageBeforeHello(self) -> None:
        h = SessionHarness()
        h.session.received(Envelope.build("reply.completed", requestId="r").fields)
        self.assertEqual(h.delivered, [])
        self.assertEqual(h.session.invalidDropped, 1)

    def test_repeatedHello(self) -> None:
        h = SessionHarness()
        first = h.hello()
        h.session.received(Envelope.build("hello").fields)
        self.assertEqual(h.writer.types(), ["welcome"])
        self.assertEqual(h.session.sessionId, first["sessionId"])

    def test_verify(self) -> None:
        h = SessionHarness()
        h.hello()
        self.assertTrue(verifyObject(IEngineSessionInfo, h.session))


class ValidationTests(SynchronousTestCase):
    def test_invalidDroppedAndLogged(self) -> None:
        """
        Each invalid envelope is logged with its reason and dropped; the
        session goes on and valid envelopes still arrive.
        """
        h = SessionHarness()
        h.hello()
        events = captureLogEvents(self)
        bad = [
            "not an object",
            {"type": "reply.completed"},
            dict(Envelope.build("reply.completed", "wrong-session", requestId="r").fields),
            {**Envelope.build("reply.completed", h.session.sessionId, requestId="r").fields,
             "protocolVersion": 2},
            {k: v for k, v in Envelope.build("reply.completed", h.session.sessionId,
                                             requestId="r").fields.items() if k != "messageId"},
        ]  # fmt: skip
        for fields in bad:
            h.session.received(fields)
        # The two of this session that name request r end it, if the link
        # knows it (issue 21); nothing else goes on.
        self.assertEqual(
            [(e.type, e.requestId, e.meta.get("malformed")) for e in h.delivered],
            [("request.error", "r", True)] * 2,
        )
        self.assertEqual(h.session.invalidDropped, len(bad))
        reasons = [e["reason"] for e in events if "reason" in e]
        self.assertEqual(len(reasons), len(bad))
        self.assertIn("not this session", " ".join(reasons))
        h.fromEngine("reply.completed", requestId="r")
        self.assertEqual([e.type for e in h.delivered[2:]], ["reply.completed"])

    def test_duplicateProcessedOnce(self) -> None:
        h = SessionHarness()
        h.hello()
        envelope = h.fromEngine("reply.completed", requestId="r")
        h.session.received(dict(envelope))
        self.assertEqual(len(h.delivered), 1)
        self.assertEqual(h.session.duplicatesDropped, 1)

    def test_duplicateMemoryBounded(self) -> None:
        """
        The duplicate window is bounded: the oldest ids are forgotten.
        """
        h = SessionHarness(dedupWindow=3)
        h.hello()
        first = h.fromEngine("reply.completed", requestId="r0")
        for i in range(1, 5):
            h.fromEngine("reply.completed", requestId=f"r{i}")
        self.assertLessEqual(len(h.session._seen), 3)
        h.session.received(dict(first))
        self.assertEqual(len(h.delivered), 6)


class DecodeTextTests(SynchronousTestCase):
    def test_notJsonRefused(self) -> None:
        """
        A frame is refused with a reason when it is not JSON, including the
        constants Python's reader takes and no peer's would (passed on, they
        would make a client's JSON reader fail), and nesting past the
        interpreter's limit.
        """
        cases = [
            (b"not json", "not valid JSON"),
            (b"\xff\xfe", "not valid JSON"),
            (b'{"timestamp": NaN}', "NaN is not a JSON value"),
            (b"[Infinity]", "Infinity is not a JSON value"),
            (b'{"x": -Infinity}', "-Infinity is not a JSON value"),
            (b'{"x": 1e400}', "1e400 is too large"),
            (b"[-2.5E+999]", "-2.5E+999 is too large"),
            (b"[" * 100_000, "nested too deeply"),
        ]
        for payload, words in cases:
            with self.assertRaises(ProtocolViolation) as caught:
                decodeText(payload)
            self.assertIn(words, caught.exception.reason)
        self.assertEqual(
            decodeText(b'{"n": 1e308, "tiny": 1e-400, "s": "NaN"}'),
            {"n": 1e308, "tiny": 0.0, "s": "NaN"},
        )


class AckTests(SynchronousTestCase):
    def test_ackMatched(self) -> None:
        h = SessionHarness(ackTimeout=1.0)
        welcome = h.hello()
        h.fromEngine("ack", acknowledgedMessageId=welcome["messageId"])
        self.assertEqual([e.type for e in h.acked], ["welcome"])
        h.clock.advance(10)
        self.assertEqual(h.writer.types(), ["welcome"], "an acked envelope is not sent again")
        self.assertEqual(h.delivered, [], "acks are not passed on")

    def test_retransmission(self) -> None:
        """
        An envelope unacknowledged past the timeout is sent again with the
        same messageId, up to the limit, then given up with a warning.
        """
        h = SessionHarness(ackTimeout=2.0, maxRetransmits=2)
        welcome = h.hello()
        request = h.session.send(Envelope.build("request.cancel", requestId="r"))
        h.clock.advance(2.0)
        resent = [m for m in h.writer.sent if m["messageId"] == request.messageId]
        self.assertEqual(len(resent), 2)
        self.assertEqual(resent[0], resent[1])
        h.clock.advance(2.0)
        h.clock.advance(2.0)
        h.clock.advance(10.0)
        self.assertEqual(len([m for m in h.writer.sent if m["messageId"] == request.messageId]), 3)
        self.assertEqual(
            len([m for m in h.writer.sent if m["messageId"] == welcome["messageId"]]), 3
        )
        self.assertEqual(h.session.unacknowledged(), [])

    def test_ackStopsRetransmission(self) -> None:
        h = SessionHarness(ackTimeout=2.0)
        h.hello()
        request = h.session.send(Envelope.build("request.cancel", requestId="r"))
        h.clock.advance(2.0)
        h.fromEngine("ack", acknowledgedMessageId=request.messageId)
        h.clock.advance(20)
        self.assertEqual(len([m for m in h.writer.sent if m["messageId"] == request.messageId]), 2)

    def test_neverAckAnAck(self) -> None:
        """
        With acknowledgement of RPEngine's messages switched on, every message
        but an ack is acknowledged, and acks we send are never tracked.
        """
        h = SessionHarness(ackEngineMessages=True, ackTimeout=1.0)
        h.hello()
        delta = h.fromEngine("reply.completed", requestId="r")
        h.fromEngine("ack", acknowledgedMessageId="whatever")
        acks = [m for m in h.writer.sent if m["type"] == "ack"]
        self.assertEqual([a["acknowledgedMessageId"] for a in acks], [delta["messageId"]])
        h.clock.advance(10)
        self.assertEqual(len([m for m in h.writer.sent if m["type"] == "ack"]), 1)

    def test_noAcksByDefault(self) -> None:
        h = SessionHarness()
        h.hello()
        h.fromEngine("reply.completed", requestId="r")
        self.assertNotIn("ack", h.writer.types())

    def test_closeStopsTimers(self) -> None:
        h = SessionHarness(ackTimeout=1.0)
        h.hello()
        h.session.send(Envelope.build("request.cancel", requestId="r"))
        h.session.connectionLost()
        self.assertEqual(h.clock.getDelayedCalls(), [])
        self.assertEqual(h.closed, [h.session])
        self.assertEqual(
            [e.type for e in h.session.unacknowledged()], ["welcome", "request.cancel"]
        )


class RPEngineAnswerTests(SynchronousTestCase):
    """
    How RPEngine's core really answers (crates/rp-engine-core/src/app.rs,
    transport_message): every message in order, with an ack naming it in
    C{acknowledgedMessageId}, or, when it cannot read it, with a
    C{request.error} C{invalid_payload} that names nothing and no ack.
    """

    def test_welcomeAckWithoutSession(self) -> None:
        """
        RPEngine acks welcome before it adopts the session, so that ack
        carries C{sessionId: null}; it still stops welcome's retransmission.
        """
        h = SessionHarness(ackTimeout=1.0)
        welcome = h.hello()
        ack = Envelope.build("ack", None, acknowledgedMessageId=welcome["messageId"]).fields
        ack["sessionId"] = None
        h.session.received(ack)
        self.assertEqual([e.type for e in h.acked], ["welcome"])
        h.clock.advance(10)
        self.assertEqual(h.writer.types(), ["welcome"])

    def test_otherMessagesStillNeedTheSession(self) -> None:
        h = SessionHarness()
        h.hello()
        stray = Envelope.build("reply.completed", None, requestId="r").fields
        stray["sessionId"] = None
        events = captureLogEvents(self)
        h.session.received(stray)
        self.assertEqual(h.delivered, [])
        self.assertIn("not this session's", " ".join(str(e.get("reason")) for e in events))

    def refuse(self, h: SessionHarness, reason: str = "promptScene must be an object.") -> Envelope:
        h.fromEngine("request.error", code="invalid_payload", message=reason)
        return h.delivered[-1]

    def test_refusalTiedToItsRequest(self) -> None:
        """
        An untied invalid_payload is the answer to the oldest message RPEngine
        has not answered: it gets that message's requestId and messageId, and
        the message is never sent again.
        """
        h = SessionHarness(ackTimeout=1.0)
        welcome = h.hello()
        h.fromEngine("ack", acknowledgedMessageId=welcome["messageId"])
        first = h.session.send(Envelope.build("request.cancel", requestId="a"))
        second = h.session.send(Envelope.build("voice.capture.stop", requestId="b"))
        request = h.session.send(Envelope.build("reply.completed", requestId="c"))
        h.fromEngine("ack", acknowledgedMessageId=first.messageId)
        h.fromEngine("ack", acknowledgedMessageId=second.messageId)
        error = self.refuse(h)
        self.assertEqual(error["sourceMessageId"], request.messageId)
        self.assertEqual(error["requestId"], "c")
        self.assertIn("RPEngine refused the reply.completed", error["message"])
        self.assertIn("promptScene must be an object.", error["message"])
        h.clock.advance(30)
        self.assertEqual(len([m for m in h.writer.sent if m["messageId"] == request.messageId]), 1)

    def test_refusedWithdrawalNamesNoTurn(self) -> None:
        """
        A refused cancel must not end the turn it names: the error keeps no
        requestId, only the messageId it answers.
        """
        h = SessionHarness()
        welcome = h.hello()
        h.fromEngine("ack", acknowledgedMessageId=welcome["messageId"])
        cancel = h.session.send(Envelope.build("request.cancel", requestId="a"))
        error = self.refuse(h)
        self.assertEqual(error["sourceMessageId"], cancel.messageId)
        self.assertNotIn("requestId", error.fields)

    def test_refusalAfterRetransmission(self) -> None:
        """
        A retransmitted message is answered again: the answers still line up.
        """
        h = SessionHarness(ackTimeout=1.0)
        welcome = h.hello()
        h.clock.advance(1.0)  # welcome sent twice, both unanswered
        h.fromEngine("ack", acknowledgedMessageId=welcome["messageId"])
        h.fromEngine("ack", acknowledgedMessageId=welcome["messageId"], duplicate=True)
        request = h.session.send(Envelope.build("request.cancel", requestId="x"))
        self.refuse(h)
        self.assertEqual(h.delivered[-1]["sourceMessageId"], request.messageId)

    def test_refusedBeforeSending(self) -> None:
        """
        What RPEngine would refuse is not written at all: the session judges
        the size, once the envelope is stamped and encoded (what it carries
        is checked once, by the engine link: test_engine_link's
        RefusalTests).
        """
        from rpmiddleware.protocol.rules import MAX_MESSAGE_BYTES, EngineRefusal

        h = SessionHarness()
        h.hello()
        huge = Envelope.build("request.cancel", requestId="x" * MAX_MESSAGE_BYTES)
        with self.assertRaises(EngineRefusal) as caught:
            h.session.send(huge)
        self.assertEqual(caught.exception.field, "message")
        self.assertEqual(h.writer.types(), ["welcome"])
