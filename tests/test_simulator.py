"""
Tests for the RPEngine simulator: its protocol behaviour driven directly with
envelopes, a list as the send callable and a fake clock, and one connection
over a real loopback WebSocket.

Each test names the part of RPEngine's public source it checks
(crates/rp-engine-core/src/app.rs unless said otherwise).
"""

from __future__ import annotations

import base64
import copy
import json
import socket
from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from rpmiddleware.cards.canonical import canonicalHash
from rpmiddleware.protocol.envelope import PROTOCOL, PROTOCOL_VERSION, Envelope
from rpmiddleware.testing.capture import (
    INAUDIBLE_MESSAGE,
    INCOMPLETE_RECORDING_MESSAGE,
    NO_AUDIO_MESSAGE,
    Recording,
    refusal,
)
from rpmiddleware.testing.cardstore import PatchFailed, SessionCardStore, applyPatch
from rpmiddleware.testing.kit import exampleResponseRule
from rpmiddleware.testing.responsetext import (
    DisplayTextStream,
    ResponseProcessing,
    SpeechChunker,
    displayText,
    sentenceBlocks,
    synthesisText,
)
from rpmiddleware.testing.simoptions import PlayerTake
from rpmiddleware.testing.simulator import (
    SimulatedEngine,
    SimulatorOptions,
    connectSimulator,
    defaultReplyText,
)
from rpmiddleware.testing.tones import inputRecording

SESSION = "session-1"
MODEL = "gemtavern-supertonic-3"
SPEECH = {
    "modalities": ["text", "audio"],
    "language": "en",
    "audio": {"model": MODEL, "voice": "F4"},
}
TEXT_ONLY = {"modalities": ["text"], "language": "en"}
ENVELOPE_KEYS = {"protocol", "protocolVersion", "type", "messageId", "sessionId", "timestamp"}
#: The five fields of every request.error but invalid_payload (app.rs request_error_code).
ERROR_KEYS = ENVELOPE_KEYS | {"requestId", "sourceMessageId", "code", "message", "retryable"}


def makeCard(name: str = "Ayla", **data: Any) -> dict[str, Any]:
    """
    A valid Character Card V2 (json_core.rs validate_card_value) with
    non-ASCII text and a float, so canonical hashing has something to get
    wrong.
    """
    fields: dict[str, Any] = {
        "name": name,
        "description": "Eine Wirtin mit Herz — 宿屋の主人",
        "personality": "",
        "scenario": "",
        "first_mes": "",
        "mes_example": "",
        "creator_notes": "",
        "system_prompt": "",
        "post_history_instructions": "",
        "alternate_greetings": [],
        "tags": ["innkeeper"],
        "creator": "",
        "character_version": "1",
        "extensions": {"game": {"mood": 0.75, "level": 3}},
    }
    fields.update(data)
    return {"spec": "chara_card_v2", "spec_version": "2.0", "data": fields}


def snapshot(card: dict[str, Any], targetHash: str | None = None) -> dict[str, Any]:
    transfer: dict[str, Any] = {"format": "chara_card_v2", "mode": "snapshot", "snapshot": card}
    if targetHash is not None:
        transfer["targetHash"] = targetHash
    return transfer


def reference(targetHash: str) -> dict[str, Any]:
    return {"format": "chara_card_v2", "mode": "reference", "targetHash": targetHash}


def patch(baseHash: str, targetHash: str, operations: list[Any]) -> dict[str, Any]:
    return {
        "format": "chara_card_v2",
        "mode": "patch",
        "baseHash": baseHash,
        "targetHash": targetHash,
        "patch": operations,
    }


def audioEvent(seconds: float, **changes: Any) -> dict[str, Any]:
    audio = {
        "format": "pcm_s16le",
        "sampleRate": 16000,
        "channels": 1,
        "data": base64.b64encode(inputRecording(seconds)).decode("ascii"),
    }
    audio.update(changes)
    return {"audio": audio}


EMOTION_RULE = exampleResponseRule()


class EngineTestMixin:
    """
    A simulated engine writing to a list, on a L{Clock}.
    """

    clock: Clock
    out: list[dict[str, Any]]
    engine: SimulatedEngine
    card: dict[str, Any]

    def setUp(self) -> None:
        self.card = makeCard()
        self.build()

    def build(self, **options: Any) -> SimulatedEngine:
        self.clock = Clock()
        self.out = []
        self.engine = SimulatedEngine(self.out.append, self.clock, SimulatorOptions(**options))
        return self.engine

    def establish(self, **options: Any) -> SimulatedEngine:
        """
        A fresh engine, connected and welcomed; its output so far dropped.
        """
        self.build(**options)
        self.engine.connected()
        self.send("welcome", serverVersion="test-game")
        self.out.clear()
        return self.engine

    def send(self, type: str, **fields: Any) -> dict[str, Any]:
        envelope = Envelope.build(type, SESSION, **fields).fields
        self.engine.received(envelope)
        return envelope

    def request(
        self,
        requestId: str,
        text: str | None = "Hello there",
        output: dict[str, Any] | None = None,
        card: dict[str, Any] | None = None,
        kind: str = "reply.request",
        **fields: Any,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "requestId": requestId,
            "eventId": f"event-{requestId}",
            "integrationId": "my-game",
            "characterId": "ayla",
            "output": copy.deepcopy(output if output is not None else SPEECH),
            "card": card if card is not None else snapshot(self.card),
        }
        if kind == "reply.request" and text is not None:
            body["event"] = {"text": text}
        body.update(fields)
        return self.send(kind, **body)

    def capture(self, requestId: str = "v1", **fields: Any) -> dict[str, Any]:
        fields.setdefault("output", TEXT_ONLY)
        return self.request(requestId, None, kind="voice.capture.start", **fields)

    def advance(self, seconds: float = 0.0) -> None:
        """
        Everything due now (and within C{seconds}).
        """
        self.clock.advance(seconds)

    def walk(self, seconds: float, step: float = 0.05) -> None:
        """
        Advance in small steps, as a real reactor would: a reply that
        starts when another ends starts then, not at the end of one jump.
        """
        for _ in range(round(seconds / step)):
            self.clock.advance(step)

    def types(self, messages: list[dict[str, Any]] | None = None) -> list[str]:
        return [m["type"] for m in (self.out if messages is None else messages)]

    def of(self, *types: str, requestId: str | None = None) -> list[dict[str, Any]]:
        return [
            m
            for m in self.out
            if m["type"] in types and (requestId is None or m.get("requestId") == requestId)
        ]

    def only(self, type: str, requestId: str | None = None) -> dict[str, Any]:
        [message] = self.of(type, requestId=requestId)
        return message

    def forRequest(self, requestId: str) -> list[str]:
        return [m["type"] for m in self.out if m.get("requestId") == requestId]

    def depths(self) -> list[int]:
        return [m["queueDepth"] for m in self.of("capacity.update")]


class HandshakeTests(EngineTestMixin, SynchronousTestCase):
    def test_helloOnOpen(self) -> None:
        """
        app.rs transport_opened: C{hello} with the app version and no
        session yet (sessionId null); the envelope of src/protocol.ts
        clientEnvelope.  The version is RPEngine's package version at
        cfc6695, which the host passes to the core (src/app-version.ts,
        src/app-host.ts start), so a game that logs or checks it sees the
        real value.
        """
        self.engine.connected()
        [hello] = self.out
        self.assertEqual(set(hello), ENVELOPE_KEYS | {"clientVersion"})
        self.assertEqual(
            (hello["protocol"], hello["protocolVersion"]), (PROTOCOL, PROTOCOL_VERSION)
        )
        self.assertEqual(hello["type"], "hello")
        self.assertIsNone(hello["sessionId"])
        self.assertEqual(hello["clientVersion"], "1.3.0")

    def test_welcomeAckHasNoSession(self) -> None:
        """
        app.rs transport_message: the ack is sent before the welcome is
        handled, so it carries the session before it (null); then the
        session is adopted and capacity published under it.
        """
        self.engine.connected()
        welcome = self.send("welcome", serverVersion="game-1")
        hello, ack, capacity = self.out
        self.assertEqual(ack["type"], "ack")
        self.assertEqual(ack["acknowledgedMessageId"], welcome["messageId"])
        self.assertIsNone(ack["sessionId"])
        self.assertNotIn("duplicate", ack)
        self.assertEqual(capacity["type"], "capacity.update")
        self.assertEqual(capacity["sessionId"], SESSION)
        self.assertEqual(
            {k: capacity[k] for k in ("queueDepth", "queueLimit", "acceptingRequests")},
            {"queueDepth": 0, "queueLimit": 20, "acceptingRequests": True},
        )
        self.assertEqual(self.engine.sessionId, SESSION)
        self.assertEqual(self.engine.serverVersion, "game-1")
        self.assertEqual(self.successResultOf(self.engine.welcomed), self.engine)

    def test_welcomeTimeout(self) -> None:
        """
        app.rs transport_opened and timer_fired: no welcome within five
        seconds drops the connection.
        """
        self.engine.connected()
        self.advance(4.9)
        self.assertNoResult(self.engine.closed)
        self.advance(0.2)
        self.successResultOf(self.engine.closed)
        self.assertEqual(
            self.engine.protocolErrors, [(None, "no welcome within the handshake timeout")]
        )

    def test_welcomeInTimeKeepsConnection(self) -> None:
        self.establish()
        self.advance(10)
        self.assertNoResult(self.engine.closed)
        self.assertEqual(self.engine.protocolErrors, [])

    def test_invalidPayload(self) -> None:
        """
        app.rs transport_message with json_core.rs validate_envelope_value
        (and MAX_MESSAGE_BYTES): a frame over 8 MiB, not JSON, or refused
        by the envelope rules gets C{request.error} with only a code and a
        message -- no requestId, no sourceMessageId, no retryable -- and no
        ack, and nothing else happens.
        """
        self.establish()
        good = Envelope.build("request.cancel", SESSION, requestId="r1").fields
        frames: list[Any] = [
            "not json",
            '{"protocol": NaN}',
            json.dumps({**good, "protocolVersion": 2}),
            json.dumps({**good, "protocol": "other"}),
            json.dumps({k: v for k, v in good.items() if k != "messageId"}),
            json.dumps({k: v for k, v in good.items() if k != "requestId"}),
            json.dumps([good]),
            json.dumps({**good, "pad": "x" * (8 * 1024 * 1024)}),
        ]
        for frame in frames:
            self.engine.receivedFrame(frame)
        self.assertEqual(self.types(), ["request.error"] * len(frames))
        for error in self.out:
            self.assertEqual(set(error), ENVELOPE_KEYS | {"code", "message"})
            self.assertEqual(error["code"], "invalid_payload")
            self.assertEqual(error["sessionId"], SESSION)
        self.assertEqual(len(self.engine.protocolErrors), len(frames))

    def test_invalidReplyRequest(self) -> None:
        """
        A reply.request without output is refused as a whole by
        validate_envelope_value: invalid_payload, not acked, not queued.
        """
        self.establish()
        self.request("r1", output={})
        self.assertEqual(self.types(), ["request.error"])
        self.assertEqual(self.out[0]["code"], "invalid_payload")
        self.assertEqual(self.engine.queueDepth, 0)

    def test_sessionIdNotChecked(self) -> None:
        """
        app.rs transport_message never compares sessionId: a message of
        another session is acked and handled.
        """
        self.establish()
        body = {"requestId": "r1"}
        self.engine.received(Envelope.build("request.cancel", "other-session", **body).fields)
        self.assertEqual(self.types(), ["ack", "reply.cancelled"])

    def test_unknownTypeAckedAndIgnored(self) -> None:
        """
        app.rs transport_message: unknown types (and engine-only ones) are
        acked, then ignored.
        """
        self.establish()
        first = self.send("no.such.type")
        second = self.send("reply.completed", requestId="r1")
        self.assertEqual(self.types(), ["ack", "ack"])
        self.assertEqual(
            [m["acknowledgedMessageId"] for m in self.out],
            [first["messageId"], second["messageId"]],
        )

    def test_ackIsNeverAcked(self) -> None:
        self.establish()
        hello = self.engine.sent[0]
        self.send("ack", acknowledgedMessageId=hello["messageId"])
        self.assertEqual(self.out, [])
        self.assertEqual(self.engine.acksReceived, [hello["messageId"]])

    def test_duplicateAckedAndIgnored(self) -> None:
        """
        app.rs transport_message: a messageId seen before is acked with
        C{duplicate: true} and not handled again.
        """
        self.establish()
        cancel = self.send("request.cancel", requestId="r1")
        self.engine.received(dict(cancel))
        self.assertEqual(self.types(), ["ack", "reply.cancelled", "ack"])
        self.assertEqual(self.out[2]["acknowledgedMessageId"], cancel["messageId"])
        self.assertIs(self.out[2]["duplicate"], True)
        self.assertEqual(self.engine.duplicates, [cancel["messageId"]])

    def test_duplicateWindowSurvivesReconnect(self) -> None:
        """
        app.rs transport_closed clears the session and cards but not the
        seen messageIds: a message retransmitted on a new connection is
        still a duplicate.
        """
        self.establish()
        cancel = self.send("request.cancel", requestId="r1")
        self.engine.disconnected()
        self.engine.connected()
        self.send("welcome", serverVersion="again")
        self.out.clear()
        self.engine.received(dict(cancel))
        self.assertEqual(self.types(), ["ack"])
        self.assertIs(self.out[0]["duplicate"], True)

    def test_duplicateWindowIs2000(self) -> None:
        """
        app.rs transport_message keeps the last 2,000 messageIds.
        """
        self.establish()
        first = self.send("no.such.type")
        for _ in range(1999):
            self.send("no.such.type")
        self.engine.received(dict(first))
        self.assertIs(self.out[-1]["duplicate"], True)
        self.send("no.such.type")
        self.out.clear()
        self.engine.received(dict(first))
        self.assertEqual(self.types(), ["ack"])
        self.assertNotIn("duplicate", self.out[0])

    def test_everyMessageIsAFullEnvelope(self) -> None:
        self.establish()
        self.request("r1")
        self.advance()
        for message in self.out:
            self.assertTrue(ENVELOPE_KEYS <= set(message), message["type"])
            self.assertEqual(message["sessionId"], SESSION)
        ids = [m["messageId"] for m in self.out]
        self.assertEqual(len(ids), len(set(ids)))


class CardTests(EngineTestMixin, SynchronousTestCase):
    def sync(
        self, transfer: dict[str, Any], characterId: str = "ayla", integrationId: str = "my-game"
    ) -> dict[str, Any]:
        return self.send(
            "character.sync", integrationId=integrationId, characterId=characterId, card=transfer
        )

    def test_synced(self) -> None:
        """
        app.rs character_sync: C{character.synced} with the source message,
        the character and the hash (session.rs hash_value); a snapshot may
        omit targetHash.
        """
        self.establish()
        sync = self.sync(snapshot(self.card))
        ack, synced = self.out
        self.assertEqual(
            {
                k: synced[k]
                for k in ("sourceMessageId", "integrationId", "characterId", "targetHash")
            },
            {
                "sourceMessageId": sync["messageId"],
                "integrationId": "my-game",
                "characterId": "ayla",
                "targetHash": canonicalHash(self.card),
            },
        )

    def test_snapshotWithWrongTargetHash(self) -> None:
        """
        session.rs resolve_value: a reconstructed hash that is not targetHash
        is card_resync_required; app.rs request_error: requestId null for a
        sync, retryable.
        """
        self.establish()
        sync = self.sync(snapshot(self.card, "0" * 64))
        error = self.only("request.error")
        self.assertEqual(set(error), ERROR_KEYS)
        self.assertIsNone(error["requestId"])
        self.assertEqual(error["sourceMessageId"], sync["messageId"])
        self.assertEqual((error["code"], error["retryable"]), ("card_resync_required", True))

    def test_targetHashIsCaseInsensitive(self) -> None:
        self.establish()
        self.sync(snapshot(self.card, canonicalHash(self.card).upper()))
        self.assertEqual(self.types(), ["ack", "character.synced"])

    def test_referenceKeyedPerCharacter(self) -> None:
        """
        session.rs: the cache holds one card per integrationId + characterId;
        a reference resolves only under the key it was cached for.
        """
        self.establish()
        digest = canonicalHash(self.card)
        self.sync(snapshot(self.card))
        self.sync(reference(digest), characterId="bren")
        self.sync(reference(digest), integrationId="other-game")
        self.sync(reference(digest))
        codes = [m.get("code") or m["type"] for m in self.out if m["type"] != "ack"]
        self.assertEqual(
            codes,
            [
                "character.synced",
                "card_resync_required",
                "card_resync_required",
                "character.synced",
            ],
        )

    def test_referenceToAnOlderCard(self) -> None:
        """
        session.rs: a snapshot replaces the character's card; a reference
        to the one before is card_resync_required.
        """
        self.establish()
        old = canonicalHash(self.card)
        self.sync(snapshot(self.card))
        self.sync(snapshot(makeCard(description="changed")))
        self.sync(reference(old))
        self.assertEqual(self.out[-1]["code"], "card_resync_required")

    def test_patchKeyedPerCharacter(self) -> None:
        """
        session.rs: a patch applies to the card cached for its own key,
        whose hash must be baseHash; the result must hash to targetHash.
        """
        self.establish()
        base = canonicalHash(self.card)
        patched = makeCard(description="Sie lacht — 笑う")
        target = canonicalHash(patched)
        operations = [{"op": "replace", "path": "/data/description", "value": "Sie lacht — 笑う"}]
        self.sync(snapshot(self.card))
        self.sync(patch(base, target, operations), characterId="bren")
        self.assertEqual(self.out[-1]["code"], "card_resync_required")
        self.sync(patch(base, target, operations))
        self.assertEqual(self.out[-1]["type"], "character.synced")
        self.assertEqual(self.out[-1]["targetHash"], target)
        self.sync(reference(target))
        self.assertEqual(self.out[-1]["type"], "character.synced")

    def test_patchFailures(self) -> None:
        """
        session.rs: a stale base, a patch that does not apply, or a wrong
        target are card_resync_required; a patched card that is no longer a
        Character Card V2 is invalid_character_card, not retryable.
        """
        self.establish()
        base = canonicalHash(self.card)
        self.sync(snapshot(self.card))
        target = canonicalHash(makeCard(description="x"))
        replace = [{"op": "replace", "path": "/data/description", "value": "x"}]
        self.sync(patch("f" * 64, target, replace))
        self.sync(patch(base, target, [{"op": "test", "path": "/data/name", "value": "Nope"}]))
        self.sync(patch(base, "0" * 64, replace))
        self.sync(patch(base, target, [{"op": "remove", "path": "/data/name"}]))
        errors = [(m["code"], m["retryable"]) for m in self.of("request.error")]
        self.assertEqual(
            errors,
            [("card_resync_required", True)] * 3 + [("invalid_character_card", False)],
        )

    def test_invalidSnapshot(self) -> None:
        self.establish()
        self.sync(snapshot(makeCard(name="   ")))
        self.assertEqual(self.out[-1]["code"], "invalid_character_card")
        self.assertIs(self.out[-1]["retryable"], False)

    def test_cacheClearedByWelcomeAndByReconnect(self) -> None:
        """
        app.rs: the card cache is cleared on C{welcome} and when the
        connection closes.
        """
        self.establish()
        digest = canonicalHash(self.card)
        self.sync(snapshot(self.card))
        self.send("welcome", serverVersion="again")
        self.sync(reference(digest))
        self.assertEqual(self.out[-1]["code"], "card_resync_required")
        self.sync(snapshot(self.card))
        self.engine.disconnected()
        self.engine.connected()
        self.send("welcome", serverVersion="again")
        self.sync(reference(digest))
        self.assertEqual(self.out[-1]["code"], "card_resync_required")

    def test_requestResolvesItsCard(self) -> None:
        """
        app.rs accept_reply: reply.accepted names the resolved card hash; a
        card error is answered with the requestId and may be retried under
        the same requestId.
        """
        self.establish()
        digest = canonicalHash(self.card)
        request = self.request("r1", card=reference(digest))
        error = self.only("request.error")
        self.assertEqual(
            (error["requestId"], error["sourceMessageId"], error["code"]),
            ("r1", request["messageId"], "card_resync_required"),
        )
        self.request("r1")
        accepted = self.only("reply.accepted")
        self.assertEqual(accepted["resolvedCardHash"], digest)

    def test_transfersLogged(self) -> None:
        self.establish()
        self.sync(snapshot(self.card))
        self.sync(reference(canonicalHash(self.card)))
        self.assertEqual([mode for mode, _ in self.engine.cardTransfers], ["snapshot", "reference"])
        self.assertGreater(self.engine.cardTransfers[0][1], self.engine.cardTransfers[1][1])


class PatchTests(SynchronousTestCase):
    """
    RFC 6902 as json_core.rs apply_patch_value applies it.
    """

    def test_operations(self) -> None:
        document = {"a": [1, 2], "b": {"c": 1}}
        result = applyPatch(
            document,
            [
                {"op": "add", "path": "/a/1", "value": 3},
                {"op": "add", "path": "/a/-", "value": 4},
                {"op": "move", "from": "/b/c", "path": "/d"},
                {"op": "copy", "from": "/a/0", "path": "/e"},
                {"op": "test", "path": "/d", "value": 1},
                {"op": "replace", "path": "/b", "value": "x"},
                {"op": "remove", "path": "/a/0"},
            ],
        )
        self.assertEqual(result, {"a": [3, 2, 4], "b": "x", "d": 1, "e": 1})

    def test_failures(self) -> None:
        for operations in (
            [{"op": "test", "path": "/a", "value": 1.0}],
            [{"op": "test", "path": "/a", "value": True}],
            [{"op": "replace", "path": "/missing", "value": 1}],
            [{"op": "add", "path": "/list/01", "value": 1}],
            [{"op": "add", "path": "/list/3", "value": 1}],
            [{"op": "remove", "path": "/list/2"}],
            [{"op": "frobnicate", "path": "/a"}],
            [{"op": "add", "path": "a", "value": 1}],
        ):
            with self.assertRaises(PatchFailed, msg=operations):
                applyPatch({"a": 1, "list": [0, 1]}, operations)

    def test_storeDefaultsToOneKey(self) -> None:
        """
        The store alone (as benchmarks use it) keys by empty ids.
        """
        store = SessionCardStore()
        card = makeCard()
        digest, document = store.resolve(snapshot(card))
        self.assertEqual(digest, canonicalHash(card))
        self.assertEqual(store.resolve(reference(digest)), (digest, document))


class RequestTests(EngineTestMixin, SynchronousTestCase):
    def test_accepted(self) -> None:
        """
        app.rs accept_reply: ack, reply.accepted with the queue depth it
        makes, then capacity.update, then start_next_reply's.
        """
        self.establish()
        self.request("r1")
        ack, accepted, capacity, again = self.out
        self.assertEqual(ack["type"], "ack")
        self.assertEqual(
            {k: accepted[k] for k in ("type", "requestId", "eventId", "queueDepth")},
            {"type": "reply.accepted", "requestId": "r1", "eventId": "event-r1", "queueDepth": 1},
        )
        self.assertEqual(accepted["resolvedCardHash"], canonicalHash(self.card))
        self.assertEqual((capacity["type"], capacity["queueDepth"]), ("capacity.update", 1))
        self.assertEqual((again["type"], again["queueDepth"]), ("capacity.update", 1))

    def test_capacityUpdatesPerRequest(self) -> None:
        """
        app.rs publish_capacity is called after accepting, after starting,
        after completing and when the queue runs empty -- four updates for
        one request on an idle engine, none coalesced.
        """
        self.establish()
        self.request("r1", output=TEXT_ONLY)
        self.advance()
        self.assertEqual(self.depths(), [1, 1, 0, 0])
        completed = self.types().index("reply.completed")
        self.assertEqual(self.types()[completed + 1 :], ["capacity.update", "capacity.update"])

    def test_queueLimit(self) -> None:
        """
        app.rs preflight: 22 requests at once -- 20 accepted (QUEUE_LIMIT),
        2 refused with capacity_exceeded, retryable; capacity says so.
        """
        self.establish()
        for i in range(22):
            self.request(f"r{i}")
        accepted = self.of("reply.accepted")
        self.assertEqual([m["queueDepth"] for m in accepted], list(range(1, 21)))
        errors = self.of("request.error")
        self.assertEqual([m["requestId"] for m in errors], ["r20", "r21"])
        self.assertEqual(
            {(m["code"], m["retryable"]) for m in errors}, {("capacity_exceeded", True)}
        )
        last = self.of("capacity.update")[-1]
        self.assertEqual((last["queueDepth"], last["acceptingRequests"]), (20, False))
        self.advance()
        self.assertEqual(len(self.engine.completed), 20)
        self.assertEqual(self.engine.completed, [f"r{i}" for i in range(20)])

    def test_preflightOrder(self) -> None:
        """
        app.rs preflight: duplicate_request, then service_not_started, then
        capacity_exceeded, and only then the card.
        """
        self.establish(queueLimit=1)
        self.request("r1")
        self.request("r1", card=reference("0" * 64))
        self.request("r2", card=reference("0" * 64))
        self.engine.options.serviceStarted = False
        self.request("r1")
        self.request("r3", card=reference("0" * 64))
        self.assertEqual(
            [(m["requestId"], m["code"]) for m in self.of("request.error")],
            [
                ("r1", "duplicate_request"),
                ("r2", "capacity_exceeded"),
                ("r1", "duplicate_request"),
                ("r3", "service_not_started"),
            ],
        )
        for error in self.of("request.error"):
            self.assertEqual(set(error), ERROR_KEYS)
            self.assertIs(error["retryable"], error["code"] == "capacity_exceeded")

    def test_requestIdReusableAfterCompletion(self) -> None:
        self.establish()
        self.request("r1", output=TEXT_ONLY)
        self.advance()
        self.request("r1", output=TEXT_ONLY)
        self.advance()
        self.assertEqual(self.engine.processed["r1"], 2)

    def test_setAccepting(self) -> None:
        """
        app.rs publish_capacity: acceptingRequests is ready && depth < limit.
        """
        self.establish()
        self.engine.setAccepting(False)
        self.assertFalse(self.out[-1]["acceptingRequests"])
        self.request("r1")
        self.assertEqual(self.out[-1]["code"], "service_not_started")
        self.engine.setAccepting(True)
        self.assertTrue(self.out[-1]["acceptingRequests"])

    def test_unsupportedLanguage(self) -> None:
        """
        app.rs start_next_reply: the output language must be one of the
        speech languages even for text; the request is accepted first, then
        fails, and the next one starts.
        """
        self.establish()
        self.request("r1", output={"modalities": ["text"], "language": "xx"})
        self.request("r2", output=TEXT_ONLY)
        self.advance()
        self.assertEqual(self.forRequest("r1"), ["reply.accepted", "request.error"])
        self.assertEqual(self.only("request.error")["code"], "unsupported_language")
        self.assertEqual(self.engine.completed, ["r2"])

    def test_failedAtStartStaysAccepted(self) -> None:
        """
        app.rs start_next_reply does not forget a request that fails there:
        its requestId stays taken.
        """
        self.establish()
        self.request("r1", output={"modalities": ["text"], "language": "xx"})
        self.out.clear()
        self.request("r1", output=TEXT_ONLY)
        self.assertEqual(self.out[-1]["code"], "duplicate_request")

    def test_unsupportedVoice(self) -> None:
        """
        app.rs start_next_reply, supported_voice: F1-F5 and M1-M5 only.
        """
        self.establish()
        output = {**SPEECH, "audio": {"model": MODEL, "voice": "F9"}}
        self.request("r1", output=output)
        self.assertEqual(self.only("request.error")["code"], "unsupported_voice")
        self.request("r2", output={**SPEECH, "audio": {"model": MODEL, "voice": "M5"}})
        self.advance()
        self.assertIn("r2", self.engine.completed)

    def test_unparsableResponseProcessing(self) -> None:
        """
        json_core.rs validate_output compiles the response-processing rules
        (text.rs parse_response_processing): a pattern that does not
        compile, too many rules, a bad id, more groups than allowed, a
        capture group the pattern lacks, and what Python's re takes but
        Rust's regex refuses (lookaround, back-references) are all
        invalid_payload at the envelope check: no ack, nothing queued.
        """
        self.establish()

        def rule(pattern: str, **changes: Any) -> dict[str, Any]:
            return {**EMOTION_RULE, "matcher": {"type": "regex", "pattern": pattern}, **changes}

        bad: list[list[dict[str, Any]]] = [
            [rule("(unclosed")],
            [rule("a{2,1}")],
            [rule("x", id=f"r{n}") for n in range(9)],
            [rule("x", id="Mood")],
            [rule("x", id="m" * 65)],
            [rule("x" * 1025)],
            [rule("(a)" * 17)],
            [rule("(a)", captureGroup=2)],
            [rule("(?=x)x")],
            [rule("(?!x)y")],
            [rule("(?<=x)y")],
            [rule("(?<!x)y")],
            [rule("(a)\\1")],
            [rule("(?P<a>x)(?P=a)")],
        ]
        for n, rules in enumerate(bad):
            output = {**TEXT_ONLY, "responseProcessing": {"mode": "buffered", "rules": rules}}
            self.request(f"r{n}", output=output)
        self.assertEqual(self.types(), ["request.error"] * len(bad))
        for error in self.out:
            self.assertEqual(error["code"], "invalid_payload")
            self.assertNotIn("requestId", error)
            self.assertIn("responseProcessing", error["message"])
        self.assertEqual(self.engine.queueDepth, 0)
        # A good one with a Rust-only named group still plays.
        good = rule("(?<mood>x)", captureGroup=1)
        output = {**TEXT_ONLY, "responseProcessing": {"mode": "buffered", "rules": [good]}}
        self.request("ok", output=output)
        self.assertEqual(self.types()[len(bad) :][:2], ["ack", "reply.accepted"])

    def test_spokenRequest(self) -> None:
        """
        app.rs start_next_reply and stt_completed: a recording is
        transcribed, then the reply is generated from the transcript.
        """
        self.establish()
        self.request("r1", None, output=TEXT_ONLY, event=audioEvent(1.0))
        self.advance()
        completed = self.only("reply.text.completed")
        self.assertIn("simulated transcript of 1.00 s of audio", completed["text"])

    def test_sttModelNotInstalled(self) -> None:
        """
        app.rs start_next_reply: a recording in a language whose model is
        not installed fails with stt_model_not_installed.
        """
        self.establish()
        self.request("r1", None, output=TEXT_ONLY, event=audioEvent(1.0, language="ja"))
        self.assertEqual(self.only("request.error")["code"], "stt_model_not_installed")
        self.engine.options.installedSttLanguages = ("en", "ja")
        self.request("r2", None, output=TEXT_ONLY, event=audioEvent(1.0, language="ja"))
        self.advance()
        self.assertEqual(self.engine.completed, ["r2"])

    def test_nothingRecognised(self) -> None:
        """
        app.rs begin_gemma: no text and an empty transcript is
        request_failed.
        """
        self.establish(audioTranscript="")
        self.request("r1", None, output=TEXT_ONLY, event=audioEvent(1.0))
        self.advance()
        self.assertEqual(self.only("request.error")["code"], "request_failed")

    def test_failingGeneration(self) -> None:
        """
        app.rs operation_failed and fail_active: a failed generation ends
        the request with request_failed and the next one starts.
        """

        def reply(request: dict[str, Any]) -> str:
            if request["requestId"] == "r1":
                raise RuntimeError("model crashed")
            return "Fine."

        self.establish(replyText=reply)
        self.request("r1")
        self.request("r2")
        self.advance()
        error = self.only("request.error")
        self.assertEqual((error["requestId"], error["code"]), ("r1", "request_failed"))
        self.assertEqual(self.engine.completed, ["r2"])


class StreamTests(EngineTestMixin, SynchronousTestCase):
    def test_textAndAudio(self) -> None:
        """
        app.rs gemma_delta, gemma_completed, tts_completed,
        complete_if_ready; src/socket-adapter.ts: deltas with a zero-based
        sequence, the completed text, speech per sentence in 32 KiB chunks
        numbered globally and within the segment, the totals, then
        reply.completed with the modalities.
        """
        self.establish()
        self.request("r1", "Over the hills")
        self.advance()
        messages = [m for m in self.out if m.get("requestId") == "r1"]
        kinds = self.types(messages)
        self.assertEqual(kinds[0], "reply.accepted")
        self.assertEqual(kinds[-2:], ["reply.audio.completed", "reply.completed"])
        text = defaultReplyText({"event": {"text": "Over the hills"}})
        deltas = [m for m in messages if m["type"] == "reply.text.delta"]
        self.assertEqual([m["sequence"] for m in deltas], list(range(len(deltas))))
        self.assertEqual("".join(m["delta"] for m in deltas), text)
        completed = self.only("reply.text.completed")
        self.assertEqual(
            set(completed) - ENVELOPE_KEYS, {"requestId", "text", "tokenCount", "elapsedMs"}
        )
        self.assertEqual(completed["text"], text)
        self.assertEqual(completed["tokenCount"], len(text.split()))

        [start] = [m for m in messages if m["type"] == "reply.audio.start"]
        self.assertEqual(
            (start["format"], start["sampleRate"], start["channels"]), ("pcm_s16le", 44100, 1)
        )
        chunks = [m for m in messages if m["type"] == "reply.audio.chunk"]
        self.assertLess(kinds.index("reply.audio.start"), kinds.index("reply.audio.chunk"))
        # Sentence one is spoken while the second is still being generated.
        self.assertLess(kinds.index("reply.audio.chunk"), kinds.index("reply.text.completed"))
        self.assertEqual([c["sequence"] for c in chunks], list(range(len(chunks))))
        segments: dict[int, list[dict[str, Any]]] = {}
        for chunk in chunks:
            segments.setdefault(chunk["segmentSequence"], []).append(chunk)
        self.assertEqual(sorted(segments), [0, 1])
        totalBytes = 0
        for parts in segments.values():
            self.assertEqual([c["segmentChunkSequence"] for c in parts], list(range(len(parts))))
            self.assertEqual({c["segmentChunkCount"] for c in parts}, {len(parts)})
            sizes = [len(base64.b64decode(c["data"])) for c in parts]
            self.assertEqual(set(sizes[:-1]), {32 * 1024})
            self.assertLessEqual(sizes[-1], 32 * 1024)
            totalBytes += sum(sizes)
        audio = self.only("reply.audio.completed")
        self.assertEqual(
            {k: audio[k] for k in ("chunkCount", "totalBytes", "segmentCount")},
            {"chunkCount": len(chunks), "totalBytes": totalBytes, "segmentCount": 2},
        )
        self.assertAlmostEqual(audio["durationSeconds"], totalBytes / 2 / 44100)
        self.assertEqual(audio["elapsedMs"], 0.0)
        self.assertEqual(self.only("reply.completed")["modalities"], ["text", "audio"])

    def test_chunking(self) -> None:
        """
        src/socket-adapter.ts sendAudioSegment: a segment of 100,000 bytes
        goes as 32 KiB, 32 KiB, 32 KiB and the rest.
        """
        self.establish(
            replyText=lambda request: "Hello there friend.",
            secondsPerCharacter=50000 / 44100 / len("Hello there friend."),
        )
        self.request("r1")
        self.advance()
        chunks = self.of("reply.audio.chunk")
        sizes = [len(base64.b64decode(c["data"])) for c in chunks]
        self.assertEqual(sizes, [32768, 32768, 32768, 100000 - 3 * 32768])
        self.assertEqual([c["segmentChunkCount"] for c in chunks], [4] * 4)

    def test_textOnly(self) -> None:
        self.establish()
        self.request("r1", output=TEXT_ONLY)
        self.advance()
        self.assertEqual(
            sorted(set(self.forRequest("r1"))),
            ["reply.accepted", "reply.completed", "reply.text.completed", "reply.text.delta"],
        )
        self.assertEqual(self.only("reply.completed")["modalities"], ["text"])

    def test_expressionTagsHidden(self) -> None:
        """
        text.rs DisplayTextStreamCore and synthesis_text: tags never reach
        the display text, and speech drops tags the voice does not know.
        """
        self.establish(replyText=lambda request: "Hi <laugh>there. Bye <si gh>now.")
        self.request("r1")
        self.advance()
        deltas = "".join(m["delta"] for m in self.of("reply.text.delta"))
        self.assertEqual(deltas, "Hi there. Bye now.")
        self.assertEqual(self.only("reply.text.completed")["text"], "Hi there. Bye now.")
        self.assertEqual(self.only("reply.audio.completed")["segmentCount"], 2)

    def test_audioWithoutSegments(self) -> None:
        """
        app.rs complete_if_ready: audio asked for but nothing to say --
        reply.audio.start is still sent, then empty totals.
        """
        self.establish(replyText=lambda request: "<laugh>")
        self.request("r1")
        self.advance()
        kinds = self.forRequest("r1")
        self.assertEqual(
            kinds[-4:],
            [
                "reply.text.completed",
                "reply.audio.start",
                "reply.audio.completed",
                "reply.completed",
            ],
        )
        audio = self.only("reply.audio.completed")
        self.assertEqual(
            (audio["chunkCount"], audio["totalBytes"], audio["segmentCount"]), (0, 0, 0)
        )

    def test_responseProcessing(self) -> None:
        """
        app.rs gemma_delta/gemma_completed with text.rs ResponseProcessing:
        buffered -- no deltas; the completed text without the removed
        match, extractedContent by rule id; speech of the processed text
        only after the text is complete.
        """
        self.establish(replyText=lambda request: "Keep moving. Stay low.<fear_anxious>  \n")
        output = {**SPEECH, "responseProcessing": {"mode": "buffered", "rules": [EMOTION_RULE]}}
        self.request("r1", output=output)
        self.advance()
        self.assertEqual(self.of("reply.text.delta"), [])
        completed = self.only("reply.text.completed")
        self.assertEqual(completed["text"], "Keep moving. Stay low.")
        self.assertEqual(completed["extractedContent"], {"emotion": ["fear_anxious"]})
        kinds = self.forRequest("r1")
        self.assertLess(kinds.index("reply.text.completed"), kinds.index("reply.audio.start"))
        self.assertEqual(self.only("reply.audio.completed")["segmentCount"], 2)

    def test_tokensPerSecond(self) -> None:
        self.establish(tokensPerSecond=10.0)
        self.request("r1", output=TEXT_ONLY)
        self.advance()
        self.assertEqual(len(self.of("reply.text.delta")), 0)
        self.advance(0.1)
        self.assertEqual(len(self.of("reply.text.delta")), 1)
        self.advance(10)
        tokens = self.only("reply.text.completed")["tokenCount"]
        self.assertEqual(self.only("reply.text.completed")["elapsedMs"], tokens * 100.0)

    def test_bigClockStepGivesSameFigures(self) -> None:
        self.establish(tokensPerSecond=10.0, audioRealtime=True)
        self.request("r1")
        self.advance(100)
        completed = self.only("reply.text.completed")
        audio = self.only("reply.audio.completed")
        self.assertEqual(completed["elapsedMs"], completed["tokenCount"] * 100.0)
        self.assertAlmostEqual(audio["elapsedMs"], audio["durationSeconds"] * 1000.0, places=3)

    def test_audioRealtime(self) -> None:
        """
        With audioRealtime a sentence takes as long to synthesise as it
        plays: the reply ends after the last sentence's playing time.
        """
        self.establish(audioRealtime=True)
        self.request("r1")
        self.advance()
        self.assertEqual(self.of("reply.completed"), [])
        self.advance(60)
        audio = self.only("reply.audio.completed")
        self.assertGreater(audio["elapsedMs"], 0)
        self.assertEqual(len(self.of("reply.completed")), 1)

    def test_queueInOrder(self) -> None:
        """
        app.rs start_next_reply: one reply at a time, first in first out.
        """
        self.establish()
        for i in range(3):
            self.request(f"r{i}", output=TEXT_ONLY)
        self.advance()
        starts = [m["requestId"] for m in self.of("reply.text.delta") if m["sequence"] == 0]
        self.assertEqual(starts, ["r0", "r1", "r2"])
        self.assertEqual(self.engine.completed, ["r0", "r1", "r2"])
        firstDone = self.types().index("reply.completed")
        self.assertEqual(
            {m["requestId"] for m in self.out[:firstDone] if m["type"] == "reply.text.delta"},
            {"r0"},
        )

    def test_concurrencyExtension(self) -> None:
        self.establish(concurrency=2)
        for i in range(3):
            self.request(f"r{i}", output=TEXT_ONLY)
        self.advance()
        firstDone = self.types().index("reply.completed")
        self.assertEqual(
            {m["requestId"] for m in self.out[:firstDone] if m["type"] == "reply.text.delta"},
            {"r0", "r1"},
        )


class CancelTests(EngineTestMixin, SynchronousTestCase):
    def test_cancelActiveMidStream(self) -> None:
        """
        app.rs cancel_request: an active reply is cancelled with
        requested_by_game, nothing more is sent for it, capacity is
        published and the next one starts.
        """
        self.establish(tokensPerSecond=10.0)
        self.request("r1")
        self.request("r2", output=TEXT_ONLY)
        self.advance(0.35)
        self.assertEqual(len(self.of("reply.text.delta", requestId="r1")), 3)
        self.out.clear()
        self.send("request.cancel", requestId="r1")
        self.assertEqual(self.types()[:3], ["ack", "reply.cancelled", "capacity.update"])
        self.assertEqual(self.out[1]["reason"], "requested_by_game")
        self.advance(100)
        self.assertEqual([t for t in self.forRequest("r1")], ["reply.cancelled"])
        self.assertEqual(self.engine.completed, ["r2"])
        self.assertEqual(self.engine.cancelled, ["r1"])

    def test_cancelQueued(self) -> None:
        self.establish()
        self.request("r1", output=TEXT_ONLY)
        self.request("r2", output=TEXT_ONLY)
        self.out.clear()
        self.send("request.cancel", requestId="r2")
        self.assertEqual(self.types(), ["ack", "reply.cancelled", "capacity.update"])
        self.assertEqual(self.out[2]["queueDepth"], 1)
        self.advance()
        self.assertEqual(self.engine.completed, ["r1"])

    def test_cancelUnknown(self) -> None:
        """
        app.rs cancel_request: an id that is not queued, active or
        capturing gets reason not_active -- also one that has finished.
        """
        self.establish()
        self.send("request.cancel", requestId="nobody")
        self.request("r1", output=TEXT_ONLY)
        self.advance()
        self.send("voice.capture.cancel", requestId="r1")
        cancelled = self.of("reply.cancelled")
        self.assertEqual(
            [(m["requestId"], m["reason"]) for m in cancelled],
            [("nobody", "not_active"), ("r1", "not_active")],
        )
        self.assertEqual(self.engine.cancelled, [])

    def test_captureCancelCancelsAReply(self) -> None:
        """
        app.rs: voice.capture.cancel and request.cancel are the same.
        """
        self.establish()
        self.request("r1", output=TEXT_ONLY)
        self.send("voice.capture.cancel", requestId="r1")
        self.assertEqual(self.only("reply.cancelled")["reason"], "requested_by_game")

    def test_connectionLost(self) -> None:
        """
        app.rs transport_closed and cancel_all: everything is cancelled
        with connection_lost, which cannot be delivered.
        """
        self.establish()
        self.capture("v1")
        self.request("r1")
        self.request("r2")
        self.out.clear()
        self.engine.disconnect()
        self.assertEqual(self.out, [])
        self.assertEqual(
            self.engine.cancellations,
            [("r2", "connection_lost"), ("r1", "connection_lost"), ("v1", "connection_lost")],
        )
        self.assertEqual(self.engine.queueDepth, 0)
        self.successResultOf(self.engine.closed)
        self.advance(100)
        self.assertEqual(self.out, [])

    def test_stopService(self) -> None:
        """
        app.rs stop_service: everything cancelled with service_stopped,
        delivered, then the connection closes.
        """
        self.establish()
        self.request("r1")
        self.out.clear()
        self.engine.stopService()
        self.assertEqual(self.types(), ["reply.cancelled"])
        self.assertEqual(self.out[0]["reason"], "service_stopped")
        self.successResultOf(self.engine.closed)


class VoiceCaptureTests(EngineTestMixin, SynchronousTestCase):
    def states(self) -> list[tuple[str, float, bool, str | None]]:
        return [
            (m["state"], m["seconds"], m["autoEndEnabled"], m["message"])
            for m in self.of("voice.capture.state")
        ]

    def test_captureFlow(self) -> None:
        """
        app.rs accept_capture, capture_state, capture_level, stop_capture,
        stt_completed; src/browser-voice-capture.ts: accepted with the depth
        counting the capture, listening / speech_started / speech_ended
        (which stops the capture), levels every 0.1 s while capturing, then
        the transcript becomes a reply of its own.
        """
        self.establish()
        start = self.capture("v1")
        ack, accepted, capacity = self.out
        self.assertEqual((accepted["type"], accepted["queueDepth"]), ("reply.accepted", 1))
        self.assertEqual((capacity["type"], capacity["queueDepth"]), ("capacity.update", 1))
        self.advance(0.55)
        self.assertEqual(
            self.states(), [("listening", 0.0, True, None), ("speech_started", 0.5, True, None)]
        )
        levels = self.of("voice.capture.level")
        self.assertEqual([m["seconds"] for m in levels], [0.1, 0.2, 0.3, 0.4, 0.5])
        for level in levels:
            self.assertEqual(set(level) - ENVELOPE_KEYS, {"requestId", "seconds", "peak", "rms"})
        self.assertLess(levels[0]["peak"], levels[-1]["peak"])
        self.advance(1)
        self.assertEqual(self.states()[-1], ("speech_ended", 1.4, True, None))
        self.assertEqual(self.of("voice.capture.level")[-1]["seconds"], 1.4)
        self.advance(10)
        self.assertEqual(self.of("voice.capture.transcript"), [])
        self.assertEqual(self.of("reply.accepted")[1:], [])
        self.assertIn("of 1.00 s of speech", self.only("reply.text.completed")["text"])
        self.assertEqual(self.engine.completed, ["v1"])
        self.assertEqual(self.engine.processed["v1"], 1)
        self.assertEqual(start["requestId"], "v1")
        self.assertEqual(self.depths()[-1], 0)

    def test_stopWhileSpeaking(self) -> None:
        """
        app.rs stop_capture: a capture still capturing stops when the game
        says so, the player mid-sentence; what was heard is transcribed.
        """
        self.establish(captureTakes=[PlayerTake(silenceSeconds=0.3, speechSeconds=5.0)])
        self.capture("v1", returnTranscript=True)
        self.advance(1.0)
        self.send("voice.capture.stop", requestId="v1")
        levels = len(self.of("voice.capture.level"))
        self.advance(0.5)
        self.assertEqual(len(self.of("voice.capture.level")), levels)
        self.assertNotIn("speech_ended", [s[0] for s in self.states()])
        self.assertEqual(
            self.only("voice.capture.transcript")["text"],
            "(simulated transcript of 0.70 s of speech)",
        )

    def test_stopOnlyWhileCapturing(self) -> None:
        """
        app.rs stop_capture ignores a capture that is no longer capturing,
        and an unknown one: just the ack.
        """
        self.establish(transcriptionSeconds=1.0)
        self.capture("v1")
        self.advance(1.5)
        self.out.clear()
        self.send("voice.capture.stop", requestId="v1")
        self.send("voice.capture.stop", requestId="nobody")
        self.assertEqual(self.types(), ["ack", "ack"])

    def test_transcriptOnlyWhenAsked(self) -> None:
        """
        app.rs stt_completed: voice.capture.transcript only with
        returnTranscript true, before the reply.
        """
        self.establish(captureTakes=[PlayerTake(transcript="Open the gate")])
        self.capture("v1", returnTranscript=True)
        self.advance(10)
        transcript = self.only("voice.capture.transcript")
        self.assertEqual(
            {k: transcript[k] for k in ("requestId", "text", "language")},
            {"requestId": "v1", "text": "Open the gate", "language": "en"},
        )
        self.assertIn("elapsedMs", transcript)
        kinds = self.forRequest("v1")
        self.assertLess(kinds.index("voice.capture.transcript"), kinds.index("reply.text.delta"))
        self.assertIn("Open the gate", self.only("reply.text.completed")["text"])

    def test_emptySpeech(self) -> None:
        """
        app.rs stt_completed: nothing recognised and silenceBehavior
        "error" (the default) is empty_speech, after the (empty) transcript
        when asked.
        """
        self.establish(captureTakes=[PlayerTake(transcript="")])
        start = self.capture("v1", returnTranscript=True)
        self.advance(10)
        self.assertEqual(self.only("voice.capture.transcript")["text"], "")
        error = self.only("request.error")
        self.assertEqual(
            (error["requestId"], error["sourceMessageId"], error["code"], error["retryable"]),
            ("v1", start["messageId"], "empty_speech", False),
        )
        self.assertEqual(self.engine.queueDepth, 0)
        self.assertEqual(self.depths()[-1], 0)

    def test_restartWhenNothingRecognised(self) -> None:
        """
        app.rs stt_completed with silenceBehavior "restart": nothing
        recognised -- state listening with RPEngine's message, capacity,
        and the capture listens again for the next take.
        """
        takes = [PlayerTake(transcript=""), PlayerTake(transcript="Second try")]
        self.establish(captureTakes=takes)
        self.capture("v1", silenceBehavior="restart", returnTranscript=True)
        self.advance(1.45)
        kinds = self.types()
        ended = next(i for i, m in enumerate(self.out) if m.get("state") == "speech_ended")
        self.assertEqual(
            kinds[ended + 1 : ended + 4],
            ["voice.capture.state", "capacity.update", "voice.capture.state"],
        )
        self.assertEqual(
            self.states()[3:5],
            [
                ("listening", 0, True, "No speech was recognized; listening again."),
                ("listening", 0.0, True, None),
            ],
        )
        self.assertEqual(self.of("request.error"), [])
        self.advance(10)
        self.assertEqual([m["text"] for m in self.of("voice.capture.transcript")], ["Second try"])
        self.assertEqual(self.engine.completed, ["v1"])

    def test_noSpeechWithin8Seconds(self) -> None:
        """
        src/browser-voice-capture.ts and worker.rs: no speech within 8 s
        fails the capture (app.rs capture_failed: request_failed).
        """
        self.establish(captureTakes=[PlayerTake(speechSeconds=None)])
        self.capture("v1")
        self.advance(7.95)
        self.assertEqual(self.of("request.error"), [])
        self.advance(0.1)
        error = self.only("request.error")
        self.assertEqual((error["requestId"], error["code"]), ("v1", "request_failed"))
        self.assertEqual(self.types()[-1], "capacity.update")
        self.assertEqual(self.engine.queueDepth, 0)
        levels = len(self.of("voice.capture.level"))
        self.advance(5)
        self.assertEqual(len(self.of("voice.capture.level")), levels)

    def test_noSpeechRestart(self) -> None:
        """
        src/browser-voice-capture.ts restartSilentCapture: with
        silenceBehavior "restart" a silent window is discarded and the
        browser listens again.
        """
        takes = [PlayerTake(speechSeconds=None), PlayerTake(transcript="Finally")]
        self.establish(captureTakes=takes)
        self.capture("v1", silenceBehavior="restart")
        self.advance(8.05)
        self.assertEqual([s[0] for s in self.states()], ["listening", "listening", "listening"])
        self.assertIsNotNone(self.states()[1][3])
        self.advance(10)
        self.assertEqual(self.of("request.error"), [])
        self.assertIn("Finally", self.only("reply.text.completed")["text"])

    def test_heldAtThirtySeconds(self) -> None:
        """
        src/browser-voice-capture.ts holdAtLimit: after 30 s the recording
        stops (listening, auto end off) and waits for stop or cancel.
        """
        self.establish(captureSpeechSeconds=60.0)
        self.capture("v1", returnTranscript=True)
        self.advance(30.05)
        self.assertEqual(self.states()[-1][:3], ("listening", 30.0, False))
        levels = len(self.of("voice.capture.level"))
        self.advance(5)
        self.assertEqual(len(self.of("voice.capture.level")), levels)
        self.send("voice.capture.stop", requestId="v1")
        self.advance()
        self.assertEqual(
            self.only("voice.capture.transcript")["text"],
            "(simulated transcript of 29.70 s of speech)",
        )

    def test_oneCaptureAtATime(self) -> None:
        """
        app.rs preflight for voice: microphone_not_enabled, then
        voice_capture_active; a capture counts in the queue depth.
        """
        self.establish()
        self.capture("v1")
        self.capture("v2")
        self.assertEqual(self.out[-1]["code"], "voice_capture_active")
        self.request("r1")
        self.assertEqual(self.of("reply.accepted")[-1]["queueDepth"], 2)
        self.engine.options.microphoneEnabled = False
        self.capture("v3")
        self.assertEqual(self.out[-1]["code"], "microphone_not_enabled")

    def test_captureQueuedBehindReply(self) -> None:
        """
        A transcript becomes a queued reply (app.rs stt_completed) and is
        answered after the replies before it.
        """
        self.establish(tokensPerSecond=1.0)
        self.request("r1", output=TEXT_ONLY)
        self.capture("v1")
        self.walk(3)
        self.assertEqual(self.engine.queueDepth, 2)
        self.walk(30)
        self.assertEqual(self.engine.completed, ["r1", "v1"])

    def test_cancelCapture(self) -> None:
        """
        app.rs cancel_request: a capture is cancelled, nothing more comes
        from the microphone.
        """
        self.establish()
        self.capture("v1")
        self.advance(0.25)
        self.out.clear()
        self.send("voice.capture.cancel", requestId="v1")
        self.assertEqual(self.types(), ["ack", "reply.cancelled", "capacity.update"])
        self.assertEqual(self.out[1]["reason"], "requested_by_game")
        self.advance(20)
        self.assertEqual(self.types()[3:], [])
        self.capture("v2")
        self.assertEqual(self.of("reply.accepted")[-1]["requestId"], "v2")

    def test_echoForMockGameOnly(self) -> None:
        """
        app.rs capture_completed: RPEngine's own mock game may ask for the
        recording back (16 kHz PCM16 in 32 KiB chunks); nobody else gets it.
        """
        self.establish(captureTakes=[PlayerTake(silenceSeconds=0.3, speechSeconds=1.0)] * 2)
        self.capture("v1", integrationId="rimworld", debug={"echoCapturedAudio": True})
        self.advance(10)
        self.assertEqual([t for t in self.types() if t.startswith("voice.capture.audio")], [])
        self.capture("v2", integrationId="mock-game", debug={"echoCapturedAudio": True})
        self.advance(10)
        start = self.only("voice.capture.audio.start")
        self.assertEqual(
            (start["sampleRate"], start["format"], start["channels"]), (16000, "pcm_s16le", 1)
        )
        chunks = self.of("voice.capture.audio.chunk")
        pcm = b"".join(base64.b64decode(c["data"]) for c in chunks)
        self.assertEqual([c["sequence"] for c in chunks], list(range(len(chunks))))
        self.assertEqual({len(base64.b64decode(c["data"])) for c in chunks[:-1]}, {32768})
        completed = self.only("voice.capture.audio.completed")
        self.assertEqual(
            (completed["chunkCount"], completed["totalBytes"]), (len(chunks), len(pcm))
        )
        # Stopped at speech_ended: 0.3 s of silence, 1.0 s of speech, 0.1 s.
        self.assertAlmostEqual(completed["durationSeconds"], 1.4)
        kinds = self.forRequest("v2")
        self.assertLess(
            kinds.index("voice.capture.audio.completed"), kinds.index("reply.text.delta")
        )

    def test_stopBeforeSpeaking(self) -> None:
        """
        The issue's case: stopped 0.3 s after the start, before the player
        speaks.  src/browser-voice-capture.ts finalize refuses the silent
        recording, src/app-host.ts turns that into captureFailed, and
        app.rs capture_failed sends request_failed with the browser's
        message, not retryable, tied to the start; then capacity.
        """
        self.establish()
        start = self.capture("v1")
        self.advance(0.3)
        self.send("voice.capture.stop", requestId="v1")
        self.advance()
        error = self.only("request.error")
        self.assertEqual(set(error), ERROR_KEYS)
        self.assertEqual(
            (error["requestId"], error["sourceMessageId"], error["code"]),
            ("v1", start["messageId"], "request_failed"),
        )
        self.assertEqual(error["message"], "No audible microphone input was detected.")
        self.assertIs(error["retryable"], False)
        self.assertEqual(self.types()[-2:], ["request.error", "capacity.update"])
        self.assertEqual(self.depths()[-1], 0)
        self.advance(10)
        self.assertEqual(self.of("reply.text.completed", "voice.capture.transcript"), [])
        self.assertEqual(self.engine.completed, [])


class BrowserRecordingTests(EngineTestMixin, SynchronousTestCase):
    """
    src/browser-voice-capture.ts BrowserVoiceCapture.finalize: the checks
    the browser makes on a stopped recording before the core sees it, in
    its order; each refusal reaches the game as app.rs capture_failed does
    (request_failed, the browser's message, not retryable).
    """

    def recorded(self, take: PlayerTake, stopAfter: float | None = None) -> dict[str, Any]:
        """
        One capture of C{take}, stopped by the game after C{stopAfter}
        seconds (or at speech_ended), then given time to finish: the
        engine's output for it.
        """
        self.establish(captureTakes=[take])
        self.capture("v1", returnTranscript=True)
        if stopAfter is not None:
            self.advance(stopAfter)
            self.send("voice.capture.stop", requestId="v1")
        self.advance(30)
        return {
            "errors": self.of("request.error"),
            "transcripts": self.of("voice.capture.transcript"),
        }

    def assertRefused(self, outcome: dict[str, Any], message: str) -> None:
        [error] = outcome["errors"]
        self.assertEqual(
            (error["requestId"], error["code"], error["message"], error["retryable"]),
            ("v1", "request_failed", message, False),
        )
        self.assertEqual(outcome["transcripts"], [])
        self.assertEqual(self.engine.queueDepth, 0)

    def assertAccepted(self, outcome: dict[str, Any]) -> None:
        self.assertEqual(outcome["errors"], [])
        self.assertEqual(len(outcome["transcripts"]), 1)
        self.assertEqual(self.engine.completed, ["v1"])

    def test_silent(self) -> None:
        """
        A player the detector heard but whose voice is under peak 0.01 and
        RMS 0.003: "No audible microphone input was detected."
        """
        outcome = self.recorded(PlayerTake(silenceSeconds=0.3, speechSeconds=1.0, loudness=0.004))
        self.assertRefused(outcome, "No audible microphone input was detected.")

    def test_quietButAudible(self) -> None:
        """
        Both limits must be under: a peak of 0.009 with an RMS over 0.003
        is audible, and the capture goes on to recognition.
        """
        outcome = self.recorded(PlayerTake(silenceSeconds=0.3, speechSeconds=1.0, loudness=0.009))
        self.assertAccepted(outcome)

    def test_silenceOnly(self) -> None:
        """
        No speech at all, stopped by the game after 2 s (before the 8 s
        rule): inaudible.
        """
        outcome = self.recorded(PlayerTake(speechSeconds=None), stopAfter=2.0)
        self.assertRefused(outcome, "No audible microphone input was detected.")

    def test_empty(self) -> None:
        """
        A recorder that delivered nothing: "No microphone audio was
        captured.", checked before anything else.
        """
        outcome = self.recorded(PlayerTake(recordedSeconds=0.0))
        self.assertRefused(outcome, "No microphone audio was captured.")

    def test_cutShort(self) -> None:
        """
        Stopped at speech_ended after 1.4 s on the clock with 0.8 s of
        audio: 0.6 s off, over the 0.5 s allowed.
        """
        outcome = self.recorded(PlayerTake(recordedSeconds=0.8))
        self.assertRefused(
            outcome, "The browser produced an incomplete recording. Please try again."
        )

    def test_shortWithinHalfASecond(self) -> None:
        """
        0.45 s off a 1.4 s capture is within the 0.5 s allowed.
        """
        self.assertAccepted(self.recorded(PlayerTake(recordedSeconds=0.95)))

    def test_longerThanTheClock(self) -> None:
        """
        The length may be off either way: 2.0 s of audio for 1.4 s.
        """
        outcome = self.recorded(PlayerTake(recordedSeconds=2.0))
        self.assertRefused(
            outcome, "The browser produced an incomplete recording. Please try again."
        )

    def test_twentyPercentOfLongCaptures(self) -> None:
        """
        Over 2.5 s the allowance is 20% of the wall-clock time: 5.4 s on
        the clock allows 1.08 s, so 4.5 s of audio passes and 4.2 s does
        not.
        """
        take = PlayerTake(silenceSeconds=0.3, speechSeconds=5.0)
        self.assertAccepted(self.recorded(PlayerTake(**{**vars(take), "recordedSeconds": 4.5})))
        outcome = self.recorded(PlayerTake(**{**vars(take), "recordedSeconds": 4.2}))
        self.assertRefused(
            outcome, "The browser produced an incomplete recording. Please try again."
        )

    def test_lengthCheckedBeforeLoudness(self) -> None:
        """
        A recording both cut short and silent gets the length's message,
        the browser's first check.
        """
        outcome = self.recorded(PlayerTake(speechSeconds=None, recordedSeconds=1.0), stopAfter=2.0)
        self.assertRefused(
            outcome, "The browser produced an incomplete recording. Please try again."
        )

    def test_cancelWhileFinishing(self) -> None:
        """
        src/browser-voice-capture.ts cancel and src/app-host.ts captureStop:
        a capture cancelled after its stop, before the browser handed the
        recording over, is cancelled, and then the browser's rejected stop
        arrives as captureFailed: app.rs capture_failed sends
        request_failed "Voice capture was cancelled." with an empty
        sourceMessageId (the core's capture is gone) and capacity again.
        Nothing else follows.
        """
        self.establish(captureTakes=[PlayerTake(silenceSeconds=0.3, speechSeconds=5.0)])
        self.capture("v1", returnTranscript=True)
        self.advance(2)
        self.send("voice.capture.stop", requestId="v1")
        self.out.clear()
        self.send("voice.capture.cancel", requestId="v1")
        self.assertEqual(
            self.types(),
            ["ack", "reply.cancelled", "capacity.update", "request.error", "capacity.update"],
        )
        self.assertEqual(self.out[1]["reason"], "requested_by_game")
        error = self.out[3]
        self.assertEqual(
            (error["requestId"], error["sourceMessageId"], error["code"], error["retryable"]),
            ("v1", "", "request_failed", False),
        )
        self.assertEqual(error["message"], "Voice capture was cancelled.")
        self.advance(20)
        self.assertEqual(self.types()[5:], [])

    def test_cancelWhileCapturing(self) -> None:
        """
        Cancelled before any stop, the browser has no stop to reject: only
        reply.cancelled and capacity.
        """
        self.establish()
        self.capture("v1")
        self.advance(0.5)
        self.out.clear()
        self.send("voice.capture.cancel", requestId="v1")
        self.assertEqual(self.types(), ["ack", "reply.cancelled", "capacity.update"])

    def test_refusalOrderAndClockCap(self) -> None:
        """
        refusal: no audio at all first; the wall-clock time counts at most
        30 s, as the recorder stops there (a capture held 45 s with 30 s of
        audio is whole); None for a good recording.
        """
        self.assertEqual(refusal(Recording(0.0, 0.0, 0.0, wallSeconds=5.0)), NO_AUDIO_MESSAGE)
        self.assertIsNone(refusal(Recording(30.0, 0.3, 29.7, wallSeconds=45.0)))
        self.assertEqual(
            refusal(Recording(20.0, 0.3, 19.7, wallSeconds=45.0)), INCOMPLETE_RECORDING_MESSAGE
        )
        self.assertEqual(refusal(Recording(1.0, 0.0, 0.0)), INAUDIBLE_MESSAGE)
        self.assertIsNone(refusal(Recording(1.0, 0.2, 0.5)))


class BrowserCaptureLifeTests(EngineTestMixin, SynchronousTestCase):
    """
    src/browser-voice-capture.ts: the browser's one capture, which two
    failures leave open (receiveVad's no-speech error, finalize's empty
    recording), and the microphone being turned off (dispose).
    """

    def assertStartRefused(self, requestId: str, message: str) -> None:
        """
        A capture the core accepts and the browser cannot start: the
        core's messages, then the host's captureFailed as app.rs
        capture_failed answers it.
        """
        self.out.clear()
        start = self.capture(requestId)
        self.assertEqual(
            self.types(),
            ["ack", "reply.accepted", "capacity.update", "request.error", "capacity.update"],
        )
        error = self.out[3]
        self.assertEqual(
            (error["requestId"], error["sourceMessageId"], error["code"], error["retryable"]),
            (requestId, start["messageId"], "request_failed", False),
        )
        self.assertEqual(error["message"], message)
        self.assertEqual(self.depths()[-1], 0)

    def test_noSpeechLeavesCaptureOpen(self) -> None:
        """
        No speech within 8 s fails with the browser's message, and the
        browser keeps that capture: later captures, on this connection or
        the next, fail with "A voice capture is already active." until
        the player turns the microphone off and on.
        """
        self.establish(captureTakes=[PlayerTake(speechSeconds=None)])
        self.capture("v1")
        self.advance(8.05)
        self.assertEqual(
            self.only("request.error")["message"], "No speech was detected within 8 seconds."
        )
        self.assertStartRefused("v2", "A voice capture is already active.")
        self.engine.disconnect()
        self.engine.connected()
        self.send("welcome", serverVersion="test-game")
        self.assertStartRefused("v3", "A voice capture is already active.")
        self.engine.disableMicrophone()
        self.capture("v4")
        self.assertEqual(self.out[-1]["code"], "microphone_not_enabled")
        self.engine.enableMicrophone()
        self.out.clear()
        self.capture("v5")
        self.advance(10)
        self.assertEqual(self.of("request.error"), [])
        self.assertEqual(self.engine.completed, ["v5"])

    def test_emptyRecordingLeavesCaptureOpen(self) -> None:
        """
        An empty recording is refused before the browser lets go of the
        capture: the next capture cannot start either.
        """
        self.establish(captureTakes=[PlayerTake(recordedSeconds=0.0)])
        self.capture("v1")
        self.advance(5)
        self.assertEqual(self.only("request.error")["message"], "No microphone audio was captured.")
        self.assertStartRefused("v2", "A voice capture is already active.")

    def test_otherRefusalsLetGo(self) -> None:
        """
        An inaudible or incomplete recording is refused after the browser
        let go of the capture: the next one listens.
        """
        self.establish(captureTakes=[PlayerTake(loudness=0.0), PlayerTake(recordedSeconds=0.5)])
        for requestId in ("v1", "v2"):
            self.capture(requestId)
            self.advance(5)
        self.assertEqual(
            [e["message"] for e in self.of("request.error")],
            [
                "No audible microphone input was detected.",
                "The browser produced an incomplete recording. Please try again.",
            ],
        )
        self.out.clear()
        self.capture("v3")
        self.advance(10)
        self.assertEqual(self.of("request.error"), [])
        self.assertEqual(self.engine.completed, ["v3"])

    def test_microphoneOffMidCapture(self) -> None:
        """
        Turned off while the player speaks: the browser drops the
        recording (no more levels or states) and tells the core nothing;
        the capture still counts until the game stops it, and then the
        browser refuses the stop: "No matching voice capture is active."
        """
        self.establish(captureTakes=[PlayerTake(silenceSeconds=0.3, speechSeconds=5.0)])
        start = self.capture("v1")
        self.advance(1)
        self.engine.disableMicrophone()
        self.out.clear()
        self.advance(10)
        self.assertEqual(self.out, [])
        self.assertEqual(self.engine.queueDepth, 1)
        self.send("voice.capture.stop", requestId="v1")
        self.advance()
        self.assertEqual(self.types(), ["ack", "request.error", "capacity.update"])
        error = self.out[1]
        self.assertEqual(
            (error["sourceMessageId"], error["code"], error["message"]),
            (start["messageId"], "request_failed", "No matching voice capture is active."),
        )
        self.assertEqual(self.engine.queueDepth, 0)

    def test_microphoneOffWhileStopFinishes(self) -> None:
        """
        Turned off between the stop and the recording's hand-over: dispose
        cancels the browser's capture, so its stop fails with "Voice
        capture was cancelled.", tied to the start (the core still had
        the capture).
        """
        self.establish(captureTakes=[PlayerTake(silenceSeconds=0.3, speechSeconds=5.0)])
        start = self.capture("v1")
        self.advance(2)
        self.send("voice.capture.stop", requestId="v1")
        self.out.clear()
        self.engine.disableMicrophone()
        self.assertEqual(self.types(), ["request.error", "capacity.update"])
        self.assertEqual(
            (self.out[0]["sourceMessageId"], self.out[0]["message"]),
            (start["messageId"], "Voice capture was cancelled."),
        )
        self.advance(10)
        self.assertEqual(self.types()[2:], [])

    def test_listenAgainWithMicrophoneOff(self) -> None:
        """
        app.rs stt_completed listens again after an empty transcript
        (silenceBehavior "restart"); with the microphone turned off during
        recognition the browser cannot start, after the core's state and
        capacity.
        """
        self.establish(captureTakes=[PlayerTake(transcript="")], transcriptionSeconds=1.0)
        self.capture("v1", silenceBehavior="restart")
        self.advance(1.45)
        self.engine.disableMicrophone()
        self.out.clear()
        self.advance(1)
        self.assertEqual(
            self.types(),
            ["voice.capture.state", "capacity.update", "request.error", "capacity.update"],
        )
        self.assertEqual(
            self.out[2]["message"],
            "Enable microphone in GameLink before starting a voice message.",
        )
        self.assertEqual(self.engine.queueDepth, 0)


class HostDispatchTests(EngineTestMixin, SynchronousTestCase):
    """
    src/socket-adapter.ts onmessage, src/app-host.ts dispatch and drain:
    the game's messages are handled one at a time, each to the end.
    """

    def test_answerFromInsideSendWaits(self) -> None:
        """
        A game that answers from inside the send callable -- here it
        cancels the capture as soon as the start's ack arrives -- is heard
        after the start is fully handled: the cancel finds the capture
        accepted and cancels it, instead of finding nothing (not_active).
        """
        self.establish()
        send = self.engine._send

        def game(envelope: dict[str, Any]) -> None:
            send(envelope)
            if envelope["type"] == "ack" and envelope["acknowledgedMessageId"] == startId:
                self.send("voice.capture.cancel", requestId="v1")

        self.engine._send = game
        startId = ""
        start = Envelope.build(
            "voice.capture.start",
            SESSION,
            requestId="v1",
            eventId="event-v1",
            integrationId="my-game",
            characterId="ayla",
            output=TEXT_ONLY,
            card=snapshot(self.card),
        ).fields
        startId = start["messageId"]
        self.engine.received(start)
        self.assertEqual(
            self.types(),
            [
                "ack",
                "reply.accepted",
                "capacity.update",
                "ack",
                "reply.cancelled",
                "capacity.update",
            ],
        )
        self.assertEqual(self.out[4]["reason"], "requested_by_game")
        self.assertEqual(self.engine.queueDepth, 0)

    def test_framesToo(self) -> None:
        """
        Raw frames wait their turn the same way: a frame that is not JSON,
        sent from inside the send callable, is refused after the message
        being handled has sent everything.
        """
        self.establish()
        send = self.engine._send
        sentFrame: list[bool] = []

        def game(envelope: dict[str, Any]) -> None:
            send(envelope)
            if not sentFrame:
                sentFrame.append(True)
                self.engine.receivedFrame("{")

        self.engine._send = game
        self.request("r1", output=TEXT_ONLY)
        kinds = self.types()
        self.assertEqual(kinds[:3], ["ack", "reply.accepted", "capacity.update"])
        refused = kinds.index("request.error")
        self.assertGreater(refused, 2)
        self.assertEqual(self.out[refused]["code"], "invalid_payload")

    def test_raisingMessageLeavesTheRest(self) -> None:
        """
        drain's guard is released when handling raises, and what was
        queued behind is handled with the next message.
        """
        self.establish()
        send = self.engine._send
        calls: list[str] = []

        def game(envelope: dict[str, Any]) -> None:
            calls.append(envelope["type"])
            if len(calls) == 1:
                self.engine.receivedFrame("{")
                raise RuntimeError("the game's handler broke")
            send(envelope)

        self.engine._send = game
        self.assertRaises(RuntimeError, self.request, "r1", output=TEXT_ONLY)
        self.assertEqual(self.of("request.error"), [])
        self.engine._send = send
        self.send("request.cancel", requestId="nobody")
        self.assertEqual(self.types()[:2], ["request.error", "ack"])
        self.assertEqual(self.out[0]["code"], "invalid_payload")


class AudioTransportTests(EngineTestMixin, SynchronousTestCase):
    """
    src/app-host.ts execute, replyAudioTransport: a transport that takes
    whole phrases and refuses one.
    """

    def test_refusedPhrase(self) -> None:
        """
        A refused phrase is request.error audio_transport_failed with the
        host's message (requestId, code, message, retryable false; no
        sourceMessageId), one per refused phrase; that request's
        reply.audio.completed and reply.completed are kept back, the text
        is not.  The next request, delivered, completes again.
        """
        self.establish()
        refuse = [True]
        phrases: list[dict[str, Any]] = []

        def transport(segment: dict[str, Any]) -> bool:
            phrases.append(segment)
            return not refuse[0]

        self.engine.sendAudioSegment = transport
        self.request("r1", text="Tell me everything.")
        self.advance(30)
        errors = self.of("request.error", requestId="r1")
        self.assertEqual(len(errors), len(phrases))
        self.assertGreater(len(phrases), 1)
        for error in errors:
            self.assertEqual(
                set(error), ENVELOPE_KEYS | {"requestId", "code", "message", "retryable"}
            )
            self.assertEqual((error["code"], error["retryable"]), ("audio_transport_failed", False))
            self.assertEqual(
                error["message"],
                "Audio delivery is unavailable for this game process; later requests are "
                "text-only.",
            )
        self.assertEqual(len(self.of("reply.text.completed", requestId="r1")), 1)
        self.assertEqual(self.of("reply.audio.completed", "reply.completed", requestId="r1"), [])
        refuse[0] = False
        self.request("r2", text="Again.")
        self.advance(30)
        self.assertEqual(self.of("request.error", requestId="r2"), [])
        self.assertEqual(len(self.of("reply.completed", requestId="r2")), 1)

    def test_laterFailureIsNotARefusal(self) -> None:
        """
        Only a refusal at once counts (the host compares with false): a
        transport that answers with anything else -- a mailbox write still
        under way -- gets no audio_transport_failed.
        """
        self.establish()
        self.engine.sendAudioSegment = lambda segment: None
        self.request("r1")
        self.advance(30)
        self.assertEqual(self.of("request.error"), [])
        self.assertEqual(len(self.of("reply.completed", requestId="r1")), 1)


class LogTests(EngineTestMixin, SynchronousTestCase):
    def test_logs(self) -> None:
        """
        The logs other code reads: processed, completed, cancelled,
        duplicates, protocolErrors, cardTransfers, receivedMessages, sent.
        """
        self.establish(tokensPerSecond=10.0)
        request = self.request("r1", output=TEXT_ONLY)
        self.request("r2", output=TEXT_ONLY)
        self.engine.received(dict(request))
        self.send("request.cancel", requestId="r2")
        self.engine.receivedFrame("{")
        self.advance(100)
        self.assertEqual(self.engine.processed, {"r1": 1})
        self.assertEqual(self.engine.completed, ["r1"])
        self.assertEqual(self.engine.cancelled, ["r2"])
        self.assertEqual(self.engine.duplicates, [request["messageId"]])
        self.assertEqual(len(self.engine.protocolErrors), 1)
        self.assertEqual([mode for mode, _ in self.engine.cardTransfers][-2:], ["snapshot"] * 2)
        self.assertIsNone(self.engine.receivedMessages[-1])
        self.assertEqual(
            self.engine.sentOfType("reply.completed", requestId="r1")[0]["requestId"], "r1"
        )
        # hello, the welcome's ack and the first capacity.update came before.
        self.assertEqual(len(self.engine.sent), len(self.out) + 3)


class ResponseTextTests(SynchronousTestCase):
    """
    text.rs, approximated in Python.
    """

    def test_displayText(self) -> None:
        self.assertEqual(displayText("Hi <laugh>there"), "Hi there")
        stream = DisplayTextStream()
        self.assertEqual(stream.push("Hi <la"), "Hi ")
        self.assertEqual(stream.push("ugh>there"), "there")
        self.assertEqual(stream.push(" <unfinished"), " ")
        self.assertEqual(stream.finish(), "")

    def test_synthesisText(self) -> None:
        self.assertEqual(synthesisText("A <Laugh> b > c"), "A  b  c")
        self.assertEqual(synthesisText("A <laugh> b", frozenset({"laugh"})), "A <laugh> b")
        self.assertEqual(synthesisText("A <open"), "A ")

    def test_sentences(self) -> None:
        blocks = sentenceBlocks("The value is 3.14 today. Next sentence", True)
        self.assertEqual(
            [b.strip() for b, _ in blocks], ["The value is 3.14 today.", "Next sentence"]
        )
        blocks = sentenceBlocks("他说：“你好！”然后离开。下一句", True)
        self.assertEqual([b.strip() for b, _ in blocks], ["他说：“你好！”", "然后离开。", "下一句"])
        blocks = sentenceBlocks("Use a tool, e.g. a hammer. Then stop.", True)
        self.assertEqual(len(blocks), 2)

    def test_chunker(self) -> None:
        chunker = SpeechChunker()
        self.assertEqual(chunker.update("Hi. Next", False), [(0, "Hi.")])
        self.assertEqual(chunker.update("Hi. Next one! And", False), [(1, "Next one!")])
        self.assertEqual(chunker.update("Hi. Next one! And more", True), [(2, "And more")])
        with self.assertRaises(ValueError):
            chunker.update("Changed", True)

    def process(self, rules: list[dict[str, Any]], source: str) -> Any:
        processing = ResponseProcessing.parse({"mode": "buffered", "rules": rules})
        assert processing is not None
        return processing.process(source)

    def test_occurrencesAndRemovals(self) -> None:
        def rule(ruleId: str, occurrence: str, remove: str, where: list[str]) -> dict[str, Any]:
            return {
                "id": ruleId,
                "matcher": {"type": "regex", "pattern": r"\[(\w+)\]"},
                "captureGroup": 1,
                "occurrence": occurrence,
                "remove": remove,
                "removeFrom": where,
            }

        source = "a[x] b[y] c[z]"
        result = self.process([rule("first", "first", "match", ["text"])], source)
        self.assertEqual((result.text, result.audio), ("a b[y] c[z]", source))
        self.assertEqual(result.extracted, {"first": ["x"]})
        result = self.process([rule("last", "last", "capture", ["audio"])], source)
        self.assertEqual((result.text, result.audio), (source, "a[x] b[y] c[]"))
        result = self.process([rule("all", "all", "none", [])], source)
        self.assertEqual(result.extracted, {"all": ["x", "y", "z"]})
        result = self.process([rule("all", "all", "match", ["text"])], "[a]" * 70)
        self.assertEqual(len(result.extracted["all"]), 64)
        self.assertEqual(result.text, "[a]" * 6)

    def test_overlapsAndUnicode(self) -> None:
        """
        text.rs: overlapping removals are merged; offsets work on any text.
        """
        rules = [
            {
                "id": "outer",
                "matcher": {"type": "regex", "pattern": r"控制：\[([^]]+)\]"},
                "captureGroup": 1,
                "occurrence": "all",
                "remove": "match",
                "removeFrom": ["text"],
            },
            {
                "id": "inner",
                "matcher": {"type": "regex", "pattern": r"\[([^]]+)\]"},
                "captureGroup": 1,
                "occurrence": "all",
                "remove": "capture",
                "removeFrom": ["text"],
            },
        ]
        result = self.process(rules, "你好。控制：[撤退]继续。控制：[躲藏]")
        self.assertEqual(result.text, "你好。继续。")
        self.assertEqual(result.extracted, {"outer": ["撤退", "躲藏"], "inner": ["撤退", "躲藏"]})

    def test_dollarIsEndOfText(self) -> None:
        """
        Rust's C{$} without the m flag matches only at the very end.
        """
        rule = {**EMOTION_RULE, "matcher": {"type": "regex", "pattern": "b$"}, "captureGroup": 0}
        self.assertEqual(self.process([rule], "ab\n").extracted["emotion"], [])
        rule["matcher"] = {"type": "regex", "pattern": "b$", "flags": "m"}
        self.assertEqual(self.process([rule], "ab\n").extracted["emotion"], ["b"])


class LoopbackTests(TestCase):
    """
    One connection over a real loopback WebSocket.
    """

    @inlineCallbacks
    def test_connectSimulator(self) -> Any:
        from twisted.internet import reactor

        seen: dict[str, Any] = {"messages": []}
        established: Deferred[None] = Deferred()
        replied: Deferred[None] = Deferred()
        refused: Deferred[None] = Deferred()
        serverClosed: Deferred[None] = Deferred()

        class GameSide(WebSocketServerProtocol):
            def onConnect(self, request: Any) -> None:
                seen["origin"] = request.headers.get("origin")
                seen["path"] = request.path
                seen["peer"] = self

            def onMessage(self, payload: bytes, isBinary: bool) -> None:
                message = json.loads(payload)
                seen["messages"].append(message)
                if message["type"] == "hello":
                    welcome = Envelope.build("welcome", "loop-session", serverVersion="loop-game")
                    seen["welcome"] = welcome.messageId
                    self.sendMessage(welcome.toBytes())
                if message["type"] == "capacity.update" and not established.called:
                    established.callback(None)
                if message["type"] == "reply.completed":
                    replied.callback(None)
                if message.get("code") == "invalid_payload":
                    refused.callback(None)

            def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
                if not serverClosed.called:
                    serverClosed.callback(None)

        factory = WebSocketServerFactory("ws://127.0.0.1/rp-engine/socket", reactor=reactor)
        factory.protocol = GameSide
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)

        address = port.getHost()
        assert isinstance(address, IPv4Address)
        engine = yield connectSimulator(reactor, address.port)
        self.assertEqual((engine.sessionId, engine.serverVersion), ("loop-session", "loop-game"))
        self.assertEqual(seen["origin"], "https://rpengine.gemtavern.com")
        self.assertEqual(seen["path"], "/rp-engine/socket")
        yield established
        hello, ack, capacity = seen["messages"]
        self.assertEqual(hello["type"], "hello")
        self.assertIsNone(hello["sessionId"])
        self.assertEqual((ack["type"], ack["acknowledgedMessageId"]), ("ack", seen["welcome"]))
        self.assertEqual(capacity["sessionId"], "loop-session")
        handle = engine.carrier.transport.getHandle()
        self.assertTrue(handle.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        # A frame RPEngine cannot read, then one whole turn across the wire.
        seen["peer"].sendMessage(b"not json")
        yield refused
        turn = Envelope.build(
            "reply.request",
            "loop-session",
            requestId="wire-1",
            eventId="e1",
            integrationId="my-game",
            characterId="ayla",
            event={"text": "Over the wire"},
            output=SPEECH,
            card=snapshot(makeCard()),
        )
        seen["peer"].sendMessage(turn.toBytes())
        yield replied
        got = seen["messages"][4:]
        self.assertEqual(got[0]["acknowledgedMessageId"], turn.messageId)
        deltas = [m["delta"] for m in got if m["type"] == "reply.text.delta"]
        self.assertIn("Over the wire", "".join(deltas))
        chunks = [m for m in got if m["type"] == "reply.audio.chunk"]
        self.assertEqual(
            sum(len(base64.b64decode(c["data"])) for c in chunks),
            [m for m in got if m["type"] == "reply.audio.completed"][0]["totalBytes"],
        )
        self.assertEqual(engine.processed, {"wire-1": 1})

        engine.disconnect()
        yield engine.closed
        yield serverClosed

    def test_connectionRefused(self) -> Any:
        from twisted.internet import reactor
        from twisted.internet.error import ConnectionRefusedError

        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        unused = probe.getsockname()[1]
        probe.close()
        return self.assertFailure(connectSimulator(reactor, unused), ConnectionRefusedError)
