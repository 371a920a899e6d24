"""
Property tests for what RPEngine can send us: envelope validation never
raises anything but L{ProtocolViolation}, accepts every well-formed envelope,
and an L{EngineSession} survives any decoded JSON value at all.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.engine.session import EngineSession, SessionOptions, decodeText
from rpmiddleware.protocol.envelope import PROTOCOL, Direction, Envelope
from rpmiddleware.protocol.messages import MESSAGES, ProtocolViolation, validate
from tests.support.strategies import jsonValues, scalars

_FIELD_NAMES = sorted(
    {"protocol", "protocolVersion", "type", "messageId", "sessionId", "timestamp"}
    | {name for spec in MESSAGES.values() for name in (*spec.required, *spec.optional)}
)

#: Objects that look like envelopes: every known field name, values of any kind.
envelopeLike = st.dictionaries(
    st.sampled_from(_FIELD_NAMES) | st.text(max_size=8),
    jsonValues
    | st.sampled_from([PROTOCOL, 3, "3", 3.0, True, *MESSAGES, "2026-07-16T00:00:00.000Z", ""]),
    max_size=10,
)

ids = st.text(min_size=1, max_size=10) | st.sampled_from(["x" * 256, "\u00e9\U0001f600"])
timestamps = st.sampled_from(
    ["2026-07-16T00:00:00.000Z", "2026-07-16T00:00:00+02:00", "2026-07-16", "2026-07-16 01:02"]
) | st.datetimes(timezones=st.just(None)).map(lambda d: d.isoformat())

_VALUES: dict[type, st.SearchStrategy[Any]] = {
    str: st.text(max_size=20),
    int: st.integers(-(2**40), 2**40),
    float: st.floats(allow_nan=False, allow_infinity=False),
    bool: st.booleans(),
    dict: st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=6), max_size=3),
    list: st.lists(st.integers(), max_size=3),
}
_ID_FIELDS = frozenset({"requestId", "eventId", "sessionId"})


def _valueOf(name: str, types: tuple[type, ...]) -> st.SearchStrategy[Any]:
    if name in _ID_FIELDS:
        return ids
    return st.one_of(*(_VALUES[t] for t in types))


@st.composite
def wellFormed(draw: Any, direction: Direction, sessionId: str | None) -> dict[str, Any]:
    """
    A valid envelope of a type that may travel C{direction}, with its
    required fields, some optional ones and unknown extras.
    """
    spec = draw(st.sampled_from([s for s in MESSAGES.values() if direction in s.directions]))
    fields: dict[str, Any] = {
        "protocol": PROTOCOL,
        "protocolVersion": draw(st.sampled_from([3, "3"])),
        "type": spec.type,
        "messageId": draw(ids),
        "timestamp": draw(timestamps),
    }
    extras = draw(
        st.dictionaries(st.text(min_size=1, max_size=4).map("x-".__add__), scalars, max_size=2)
    )
    fields.update(extras)
    for name, types in spec.required.items():
        fields[name] = draw(_valueOf(name, types))
    for name, types in spec.optional.items():
        if draw(st.booleans()):
            fields[name] = draw(_valueOf(name, types) | st.none())
    if spec.type == "ack":
        fields["sourceMessageId"] = draw(ids)
    if sessionId is not None and spec.type != "hello":
        fields["sessionId"] = sessionId
    elif spec.type != "hello" and draw(st.booleans()):
        fields["sessionId"] = draw(ids)
    return fields


class ValidateProperties(SynchronousTestCase):
    @settings(max_examples=100, deadline=None)
    @given(
        value=jsonValues | envelopeLike,
        direction=st.sampled_from(list(Direction)),
        sessionId=st.none() | ids,
    )
    def test_onlyProtocolViolation(
        self, value: Any, direction: Direction, sessionId: str | None
    ) -> None:
        """
        Whatever JSON value arrives, validate either returns the spec of its
        type or raises ProtocolViolation with a reason; nothing else escapes.
        """
        try:
            spec = validate(value, direction, sessionId)
        except ProtocolViolation as e:
            self.assertIsInstance(e.reason, str)
            self.assertTrue(e.reason)
        else:
            self.assertIs(spec, MESSAGES[value["type"]])
            self.assertIn(direction, spec.directions)

    @settings(max_examples=100, deadline=None)
    @given(st.data(), st.sampled_from(list(Direction)), st.none() | ids)
    def test_wellFormedAccepted(
        self, data: st.DataObject, direction: Direction, sessionId: str | None
    ) -> None:
        """
        Every well-formed envelope is accepted, unknown fields and all, and
        survives a trip through JSON.
        """
        fields = data.draw(wellFormed(direction, sessionId))
        self.assertEqual(validate(fields, direction, sessionId).type, fields["type"])
        again = json.loads(Envelope(fields).toBytes())
        self.assertEqual(validate(again, direction, sessionId).type, fields["type"])

    @settings(max_examples=100, deadline=None)
    @given(st.data(), st.sampled_from(list(Direction)))
    def test_missingRequiredRefused(self, data: st.DataObject, direction: Direction) -> None:
        """
        Taking away any field the seed requires makes the envelope invalid.
        """
        fields = data.draw(wellFormed(direction, None))
        spec = MESSAGES[fields["type"]]
        required = ["protocol", "protocolVersion", "type", "messageId", "timestamp"]
        required += list(spec.required)
        name = data.draw(st.sampled_from(required))
        del fields[name]
        with self.assertRaises(ProtocolViolation):
            validate(fields, direction, None)

    @settings(max_examples=100, deadline=None)
    @given(st.data(), st.sampled_from(list(Direction)))
    def test_wrongTypeRefused(self, data: st.DataObject, direction: Direction) -> None:
        """
        A required field of the wrong JSON type makes the envelope invalid
        (a boolean is not a number, a number is not a string).
        """
        fields = data.draw(wellFormed(direction, None))
        spec = MESSAGES[fields["type"]]
        if not spec.required:
            return
        name = data.draw(st.sampled_from(sorted(spec.required)))
        allowed = spec.required[name]
        wrong = [t for t in (str, int, bool, dict, list) if t not in allowed]
        if bool not in allowed and int in allowed:
            wrong.append(bool)
        fields[name] = data.draw(st.one_of(*(_VALUES[t] for t in wrong)))
        with self.assertRaises(ProtocolViolation):
            validate(fields, direction, None)


class _Writer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed: list[tuple[int, str]] = []

    def sendText(self, payload: bytes) -> None:
        self.sent.append(payload)

    def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))


def _session(**options: Any) -> tuple[EngineSession, list[Envelope], _Writer]:
    delivered: list[Envelope] = []
    writer = _Writer()
    session = EngineSession(
        writer,
        Clock(),
        SessionOptions(**options),
        onWelcome=lambda s: None,
        onEnvelope=lambda s, e: delivered.append(e),
        onClosed=lambda s: None,
    )
    return session, delivered, writer


class SessionProperties(SynchronousTestCase):
    @settings(max_examples=60, deadline=None)
    @given(
        before=st.lists(jsonValues | envelopeLike, max_size=5),
        after=st.lists(jsonValues | envelopeLike, max_size=10),
    )
    def test_receivedNeverRaises(self, before: list[Any], after: list[Any]) -> None:
        """
        Arbitrary JSON before and after the handshake is dropped (counted)
        or delivered, never raised; the session keeps its sessionId and
        still answers.
        """
        session, delivered, writer = _session(dedupWindow=8, ackEngineMessages=True)
        for value in before:
            session.received(value)
        session.received(Envelope.build("hello").fields)
        sessionId = session.sessionId
        self.assertIsNotNone(sessionId)
        for value in after:
            session.received(value)
        self.assertEqual(session.sessionId, sessionId)
        self.assertLessEqual(len(session._seen), 8)
        # Random values never carry this session's id, so nothing was delivered.
        self.assertEqual(delivered, [])
        self.assertEqual(session.invalidDropped, len(before) + len(after))
        self.assertEqual(writer.closed, [])
        session.received(Envelope.build("reply.completed", session.sessionId, requestId="r").fields)
        self.assertEqual([e.type for e in delivered], ["reply.completed"])

    @settings(max_examples=60, deadline=None)
    @given(st.data())
    def test_wellFormedDeliveredOnce(self, data: st.DataObject) -> None:
        """
        Well-formed envelopes of the session are delivered (acks matched
        instead), each messageId once however often it repeats.
        """
        session, delivered, _ = _session(dedupWindow=64)
        session.received(Envelope.build("hello").fields)
        assert session.sessionId is not None
        envelopes = data.draw(
            st.lists(wellFormed(Direction.TO_GAME, session.sessionId), max_size=12)
        )
        # The file mailbox's own types are refused over the WebSocket.
        envelopes = [
            e for e in envelopes if e["type"] != "hello" and not MESSAGES[e["type"]].fileModeOnly
        ]
        repeats = data.draw(st.lists(st.sampled_from(envelopes), max_size=6)) if envelopes else []
        for fields in [*envelopes, *repeats]:
            session.received(dict(fields))
        expected = {
            e["messageId"] for e in envelopes if e["type"] != "ack"
        }  # ids unique with overwhelming odds; duplicates of one id count once
        self.assertEqual({e.messageId for e in delivered}, expected)
        self.assertEqual(len(delivered), len(expected))
        self.assertEqual(session.invalidDropped, 0)


class DecodeProperties(SynchronousTestCase):
    @settings(max_examples=100, deadline=None)
    @given(
        st.binary(max_size=64) | st.text(max_size=64).map(lambda t: t.encode("utf-8", "replace"))
    )
    def test_decodeTextOnlyViolates(self, payload: bytes) -> None:
        """
        Any bytes are either JSON or a ProtocolViolation.
        """
        try:
            value = decodeText(payload)
        except ProtocolViolation as e:
            self.assertTrue(e.reason.startswith("not valid JSON"))
        else:
            self.assertEqual(json.dumps(value), json.dumps(json.loads(payload)))
