"""
Envelope building and validation against the seed.
"""

from __future__ import annotations

from datetime import datetime

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.protocol.envelope import PROTOCOL, Direction, Envelope, isoTimestamp
from rpmiddleware.protocol.messages import (
    MESSAGES,
    ProtocolViolation,
    ackReference,
    textOfDelta,
    validate,
)


def engineEnvelope(type: str, sessionId: str | None = "s1", **fields: object) -> dict:
    return Envelope.build(type, sessionId, **fields).fields


class BuildTests(SynchronousTestCase):
    def test_commonFields(self) -> None:
        """
        A built envelope has every field the seed lists, a fresh messageId each
        time, and an ISO 8601 UTC timestamp with milliseconds and a Z.
        """
        a = Envelope.build("welcome", "s1", serverVersion="x")
        b = Envelope.build("welcome", "s1", serverVersion="x")
        self.assertEqual(a["protocol"], PROTOCOL)
        self.assertEqual(a["protocolVersion"], 3)
        self.assertEqual(a["type"], "welcome")
        self.assertEqual(a["sessionId"], "s1")
        self.assertNotEqual(a.messageId, b.messageId)
        self.assertRegex(a["timestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertIsNotNone(datetime.fromisoformat(a["timestamp"]).tzinfo)

    def test_timestampFormat(self) -> None:
        when = datetime.fromisoformat("2026-07-16T00:00:00.123456+00:00")
        self.assertEqual(isoTimestamp(when), "2026-07-16T00:00:00.123Z")

    def test_unknownFieldsKept(self) -> None:
        """
        Unknown fields survive a round trip through bytes.
        """
        import json

        envelope = Envelope.build("reply.completed", "s", requestId="r", futureField={"a": [1]})
        self.assertEqual(json.loads(envelope.toBytes())["futureField"], {"a": [1]})

    def test_loneSurrogate(self) -> None:
        """
        Text with a lone surrogate (a legal JSON escape that UTF-8 cannot
        carry) is still written, escaped, rather than lost.
        """
        import json

        envelope = Envelope.build(
            "reply.text.delta", "s", requestId="r", sequence=0, delta="a\ud800b"
        )
        self.assertEqual(json.loads(envelope.toBytes())["delta"], "a\ud800b")

    def test_replaceKeepsMeta(self) -> None:
        envelope = Envelope.build("reply.completed", "s", requestId="r")
        envelope.meta["client"] = "c1"
        changed = envelope.replace(requestId="r2")
        self.assertEqual(changed.requestId, "r2")
        self.assertEqual(envelope.requestId, "r")
        self.assertEqual(changed.meta["client"], "c1")


class ValidateTests(SynchronousTestCase):
    def assertViolation(self, fields: object, fragment: str, sessionId: str | None = "s1") -> None:
        with self.assertRaises(ProtocolViolation) as caught:
            validate(fields, Direction.TO_GAME, sessionId)
        self.assertIn(fragment, caught.exception.reason)

    def test_everyTypeHasASpec(self) -> None:
        """
        Every message type RPEngine's core sends or reads (app.rs) has a spec.
        """
        seedTypes = {
            "hello", "welcome", "ack", "character.sync", "character.synced", "reply.request",
            "reply.accepted", "reply.text.delta", "reply.text.completed", "reply.audio.start",
            "reply.audio.chunk", "reply.audio.completed", "reply.completed", "request.cancel",
            "reply.cancelled", "capacity.update", "request.error", "voice.capture.start",
            "voice.capture.stop", "voice.capture.cancel", "voice.capture.level",
            "voice.capture.state", "voice.capture.transcript", "voice.capture.audio.start",
            "voice.capture.audio.chunk", "voice.capture.audio.completed",
            # File transport v1 only (src/filesystem-mailbox-adapter.ts).
            "reply.audio.segment", "reply.audio.segment.consumed",
        }  # fmt: skip
        self.assertEqual(set(MESSAGES), seedTypes)

    def test_valid(self) -> None:
        spec = validate(
            engineEnvelope("reply.text.delta", requestId="r", sequence=0, delta="Hi"),
            Direction.TO_GAME,
            "s1",
        )
        self.assertEqual(spec.type, "reply.text.delta")

    def test_notAnObject(self) -> None:
        self.assertViolation([1, 2], "JSON object")

    def test_wrongProtocol(self) -> None:
        fields = engineEnvelope("reply.completed", requestId="r")
        fields["protocol"] = "other"
        self.assertViolation(fields, "protocol must be")

    def test_wrongVersion(self) -> None:
        for bad in (2, 3.0, True, None):
            fields = engineEnvelope("reply.completed", requestId="r")
            fields["protocolVersion"] = bad
            self.assertViolation(fields, "protocolVersion must be 3")

    def test_versionAsString(self) -> None:
        """
        "3" is a reasonable variant and accepted.
        """
        fields = engineEnvelope("reply.completed", requestId="r")
        fields["protocolVersion"] = "3"
        validate(fields, Direction.TO_GAME, "s1")

    def test_missingMessageId(self) -> None:
        fields = engineEnvelope("reply.completed", requestId="r")
        del fields["messageId"]
        self.assertViolation(fields, "messageId")

    def test_badTimestamp(self) -> None:
        fields = engineEnvelope("reply.completed", requestId="r")
        fields["timestamp"] = "yesterday"
        self.assertViolation(fields, "ISO 8601")

    def test_unknownType(self) -> None:
        self.assertViolation(engineEnvelope("reply.dance"), "unknown message type")

    def test_wrongDirection(self) -> None:
        """
        A game-to-engine message arriving from the engine is refused.
        """
        self.assertViolation(engineEnvelope("request.cancel", requestId="r"), "may not be sent")

    def test_wrongSession(self) -> None:
        self.assertViolation(
            engineEnvelope("reply.completed", "other", requestId="r"), "not this session"
        )

    def test_missingRequired(self) -> None:
        self.assertViolation(engineEnvelope("reply.completed"), "missing requestId")

    def test_wrongType(self) -> None:
        self.assertViolation(
            engineEnvelope("capacity.update", acceptingRequests="yes", queueDepth=0, queueLimit=1),
            "acceptingRequests must be boolean",
        )
        self.assertViolation(
            engineEnvelope(
                "capacity.update", acceptingRequests=True, queueDepth=True, queueLimit=1
            ),
            "queueDepth must be integer",
        )

    def test_wrongOptionalType(self) -> None:
        """
        An optional field may be absent or null; any other wrong value is
        refused, naming the message type and the field.
        """
        validate(
            engineEnvelope("reply.accepted", requestId="r", queueDepth=None),
            Direction.TO_GAME,
            "s1",
        )
        self.assertViolation(
            engineEnvelope("reply.accepted", requestId="r", queueDepth="2"),
            "reply.accepted.queueDepth must be integer or null, got string",
        )
        self.assertViolation(
            engineEnvelope("reply.text.completed", requestId="r", elapsedMs=[1]),
            "reply.text.completed.elapsedMs must be number or null, got array",
        )

    def test_numberTakesInteger(self) -> None:
        """
        A number field takes an integer; an integer field does not take 1.0.
        """
        validate(
            engineEnvelope("reply.text.completed", requestId="r", elapsedMs=12),
            Direction.TO_GAME,
            "s1",
        )
        self.assertViolation(
            engineEnvelope("reply.text.delta", requestId="r", sequence=1.0, delta="a"),
            "reply.text.delta.sequence must be integer, got number",
        )

    def test_specFieldsFromSchema(self) -> None:
        """
        A spec's required and optional fields, with the Python types each
        may hold, come from its schema.
        """
        spec = MESSAGES["reply.text.completed"]
        self.assertEqual(dict(spec.required), {"requestId": (str,)})
        self.assertEqual(spec.optional["elapsedMs"], (int, float))
        self.assertEqual(spec.optional["extractedContent"], (dict,))
        self.assertEqual(MESSAGES["reply.completed"].optional["modalities"], (list,))

    def test_ackNeedsReference(self) -> None:
        self.assertViolation(engineEnvelope("ack"), "acknowledges")

    def test_ackVariants(self) -> None:
        for name in ("acknowledgedMessageId", "sourceMessageId"):
            fields = engineEnvelope("ack", **{name: "m1"})
            validate(fields, Direction.TO_GAME, "s1")
            self.assertEqual(ackReference(fields), "m1")

    def test_deltaVariants(self) -> None:
        self.assertEqual(textOfDelta({"text": "a"}), "a")
        self.assertEqual(textOfDelta({"delta": "b"}), "b")
        self.assertEqual(textOfDelta({"content": "c"}), "c")

    def test_helloNeedsNoSession(self) -> None:
        validate(engineEnvelope("hello", None), Direction.TO_GAME, None)
