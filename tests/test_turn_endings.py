"""
No turn waits forever (issue 21): a malformed terminal answer from RPEngine,
a stream that stalls after acceptance, each ended within its bound on a
L{Clock}.  (RPEngine's tab leaving the file mailbox: test_mailbox_reader.)
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.api import ReplyFailed
from rpmiddleware.client.errors import LLM_ERROR, engineErrorMessage
from rpmiddleware.envelope import Envelope
from rpmiddleware.testing.kit import captureLogEvents
from tests.test_engine_link import Harness


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
