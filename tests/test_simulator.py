"""
Tests for the RPEngine simulator: its protocol behaviour driven directly with
a fake clock, and one connection over a real loopback WebSocket.
"""

from __future__ import annotations

import base64
import copy
import json
import socket
from datetime import datetime
from typing import Any

import jsonpatch
import numpy as np
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from rpmiddleware.cards import REQUIRED_DATA_FIELDS, canonicalHash
from rpmiddleware.envelope import PROTOCOL, PROTOCOL_VERSION, Envelope
from rpmiddleware.testing.cardstore import simulatorHash
from rpmiddleware.testing.replystream import tokenize
from rpmiddleware.testing.simulator import (
    SimulatedEngine,
    SimulatorOptions,
    connectSimulator,
    defaultReplyText,
)
from rpmiddleware.testing.tones import inputRecording, pcm16Samples

SESSION = "session-1"
SPEECH = {"modalities": ["text", "audio"], "language": "en", "audio": {"voice": "F4"}}
TEXT_ONLY = {"modalities": ["text"]}


def makeCard(name: str = "Ayla", **data: Any) -> dict[str, Any]:
    """
    A valid Character Card V2 with non-ASCII text and a float, so canonical
    hashing has something to get wrong.
    """
    fields: dict[str, Any] = {key: kind() for key, kind in REQUIRED_DATA_FIELDS.items()}
    fields.update(
        name=name,
        description="Eine Wirtin mit Herz — 宿屋の主人",
        tags=["innkeeper"],
        extensions={"game": {"mood": 0.75, "level": 3}},
    )
    fields.update(data)
    return {"spec": "chara_card_v2", "spec_version": "2.0", "data": fields}


def snapshot(card: dict[str, Any], targetHash: str | None = None) -> dict[str, Any]:
    return {
        "format": "chara_card_v2",
        "mode": "snapshot",
        "targetHash": targetHash or canonicalHash(card),
        "card": card,
    }


def reference(targetHash: str) -> dict[str, Any]:
    return {"format": "chara_card_v2", "mode": "reference", "targetHash": targetHash}


def audioEvent(seconds: float, **changes: Any) -> dict[str, Any]:
    audio = {
        "format": "pcm_s16le",
        "sampleRate": 16000,
        "channels": 1,
        "language": "en",
        "data": base64.b64encode(inputRecording(seconds)).decode("ascii"),
    }
    audio.update(changes)
    return {"audio": audio}


class EngineTestMixin:
    """
    A L{SimulatedEngine} on a L{Clock}, writing into a list.
    """

    clock: Clock
    engine: SimulatedEngine
    card: dict[str, Any]

    def makeEngine(self, **options: Any) -> SimulatedEngine:
        self.clock = Clock()
        self.wire: list[dict[str, Any]] = []
        self.engine = SimulatedEngine(self.wire.append, self.clock, SimulatorOptions(**options))
        self.card = makeCard()
        return self.engine

    def establish(self, **options: Any) -> SimulatedEngine:
        engine = self.makeEngine(**options)
        engine.connected()
        self.game("welcome", sessionId=SESSION, serverVersion="game-1.0")
        return engine

    def game(self, type: str, sessionId: str | None = SESSION, **fields: Any) -> dict[str, Any]:
        """
        Send one envelope from the game side and return it.
        """
        envelope = Envelope.build(type, sessionId, **fields).fields
        self.engine.received(envelope)
        return envelope

    def request(
        self,
        requestId: str = "r1",
        text: str | None = "Hello there",
        output: dict[str, Any] | None = None,
        card: dict[str, Any] | None = None,
        kind: str = "reply.request",
        **extra: Any,
    ) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "requestId": requestId,
            "eventId": f"event-{requestId}",
            "integrationId": "my-game",
            "characterId": "ayla",
            "output": output if output is not None else SPEECH,
            "player": {"displayName": "Robin"},
            "card": card if card is not None else snapshot(self.card),
        }
        if kind == "reply.request" and "event" not in extra:
            fields["event"] = {"text": text}
        fields.update(extra)
        return self.game(kind, **fields)

    def runFor(self, seconds: float, step: float = 0.05) -> None:
        """
        Advance the clock in small steps, as a running reactor would.
        """
        for _ in range(int(round(seconds / step))):
            self.clock.advance(step)

    def sent(self, *types: str, requestId: str | None = None) -> list[dict[str, Any]]:
        return self.engine.sentOfType(*types, requestId=requestId)

    def errors(self) -> list[dict[str, Any]]:
        return self.sent("request.error")

    def stream(self, requestId: str) -> list[dict[str, Any]]:
        return [m for m in self.engine.sent if m.get("requestId") == requestId]


class HandshakeTests(EngineTestMixin, SynchronousTestCase):
    def test_helloOnConnect(self) -> None:
        engine = self.makeEngine(clientVersion="rpengine-test")
        engine.connected()
        [hello] = engine.sent
        self.assertEqual(hello["type"], "hello")
        self.assertEqual(hello["protocol"], PROTOCOL)
        self.assertEqual(hello["protocolVersion"], PROTOCOL_VERSION)
        self.assertEqual(hello["clientVersion"], "rpengine-test")
        self.assertNotIn("sessionId", hello)
        self.assertTrue(hello["timestamp"].endswith("Z"))
        datetime.fromisoformat(hello["timestamp"])

    def test_welcomeEstablishesSession(self) -> None:
        engine = self.makeEngine()
        engine.connected()
        welcome = self.game("welcome", sessionId=SESSION, serverVersion="game-1.0")
        self.assertEqual((engine.sessionId, engine.serverVersion), (SESSION, "game-1.0"))
        self.assertIs(self.successResultOf(engine.welcomed), engine)
        hello, ack, capacity = engine.sent
        self.assertEqual(ack["type"], "ack")
        self.assertEqual(ack["sourceMessageId"], welcome["messageId"])
        self.assertEqual(ack["sessionId"], SESSION)
        self.assertEqual(capacity["type"], "capacity.update")
        self.assertEqual(
            (capacity["acceptingRequests"], capacity["queueDepth"], capacity["queueLimit"]),
            (True, 0, 4),
        )

    def test_everyMessageIsAFullEnvelope(self) -> None:
        self.establish()
        self.request()
        self.clock.advance(0)
        self.assertEqual(self.wire, self.engine.sent)
        ids = [m["messageId"] for m in self.wire]
        self.assertEqual(len(ids), len(set(ids)))
        json.dumps(self.wire)
        for message in self.engine.sent[1:]:
            self.assertEqual(message["sessionId"], SESSION)
            self.assertEqual(message["protocol"], PROTOCOL)
            self.assertEqual(message["protocolVersion"], 3)
            datetime.fromisoformat(message["timestamp"])

    def test_duplicateMessageIsAckedAndNotProcessed(self) -> None:
        self.establish()
        original = self.request()
        self.engine.received(copy.deepcopy(original))
        self.clock.advance(0)
        acks = [a for a in self.sent("ack") if a["sourceMessageId"] == original["messageId"]]
        self.assertEqual([a.get("duplicate", False) for a in acks], [False, True])
        self.assertEqual(self.engine.duplicates, [original["messageId"]])
        self.assertEqual(self.engine.processed["r1"], 1)
        self.assertEqual(len(self.sent("reply.accepted")), 1)
        self.assertEqual(len(self.sent("reply.completed")), 1)
        self.assertEqual(self.errors(), [])

    def test_ackIsNeverAcked(self) -> None:
        self.establish()
        capacity = self.engine.sent[-1]["messageId"]
        before = len(self.engine.sent)
        self.game("ack", sourceMessageId=capacity)
        self.assertEqual(len(self.engine.sent), before)
        self.assertEqual(self.engine.acksReceived, [capacity])

    def test_retransmittedWelcomeIsADuplicate(self) -> None:
        self.makeEngine().connected()
        welcome = self.game("welcome", sessionId=SESSION, serverVersion="game-1.0")
        self.engine.received(copy.deepcopy(welcome))
        self.assertEqual(
            [(m["type"], m.get("duplicate")) for m in self.engine.sent[1:]],
            [("ack", None), ("capacity.update", None), ("ack", True)],
        )
        self.assertEqual(self.engine.duplicates, [welcome["messageId"]])

    def test_unknownAndEngineOnlyTypes(self) -> None:
        self.establish()
        for kind, words in [("reply.teleport", "unknown"), ("reply.completed", "RPEngine")]:
            envelope = Envelope.build(kind, SESSION, requestId="r1").fields
            self.assertProtocolError(envelope, words)

    def test_dropAcks(self) -> None:
        self.establish(dropAcks=True)
        self.request()
        self.clock.advance(0)
        self.assertEqual(self.sent("ack"), [])
        self.assertEqual(len(self.sent("reply.completed")), 1)

    def assertProtocolError(self, envelope: dict[str, Any], words: str) -> None:
        before = len(self.engine.sent)
        self.engine.received(envelope)
        [error] = self.engine.sent[before:]
        self.assertEqual(error["type"], "request.error")
        self.assertEqual(error["code"], "request_failed")
        self.assertIs(error["retryable"], False)
        self.assertIn(words, error["message"])
        messageId = envelope.get("messageId")
        if messageId:
            self.assertEqual(error["sourceMessageId"], messageId)
        else:
            self.assertNotIn("sourceMessageId", error)
        self.assertEqual(self.engine.protocolErrors[-1], (messageId, error["message"]))

    def test_wrongSessionId(self) -> None:
        self.establish()
        envelope = Envelope.build("request.cancel", "other-session", requestId="r1").fields
        self.assertProtocolError(envelope, "sessionId")

    def test_wrongProtocolAndVersion(self) -> None:
        self.establish()
        wrong = Envelope.build("request.cancel", SESSION, requestId="r1").fields
        self.assertProtocolError(dict(wrong, protocol="other.protocol"), "protocol must be")
        self.assertProtocolError(dict(wrong, protocolVersion=2), "protocolVersion")
        self.assertProtocolError(dict(wrong, protocolVersion="3"), "protocolVersion")

    def test_missingMessageId(self) -> None:
        self.establish()
        envelope = Envelope.build("request.cancel", SESSION, requestId="r1").fields
        del envelope["messageId"]
        self.assertProtocolError(envelope, "messageId")
        self.assertEqual(len(self.sent("ack")), 1)  # the welcome's only

    def test_messageBeforeWelcome(self) -> None:
        self.makeEngine().connected()
        envelope = Envelope.build("request.cancel", None, requestId="r1").fields
        self.assertProtocolError(envelope, "before welcome")
        self.assertIsNone(self.engine.sessionId)

    def test_welcomeTimeout(self) -> None:
        engine = self.makeEngine()
        engine.connected()
        self.clock.advance(4.9)
        self.assertNoResult(engine.closed)
        self.clock.advance(0.2)
        self.successResultOf(engine.closed)
        self.assertIn("no welcome", engine.protocolErrors[-1][1])


class CardTests(EngineTestMixin, SynchronousTestCase):
    def sync(self, card: dict[str, Any]) -> dict[str, Any]:
        return self.game("character.sync", integrationId="my-game", characterId="ayla", card=card)

    def test_hashMatchesMiddleware(self) -> None:
        """
        The simulator's own RFC 8785 hash agrees with rpmiddleware.cards.
        """
        card = makeCard(extensions={"b": 1e21, "a": [1.5, "ü", {"z": None}]})
        self.assertEqual(simulatorHash(card), canonicalHash(card))

    def test_snapshotThenReference(self) -> None:
        self.establish()
        targetHash = canonicalHash(self.card)
        transfer = snapshot(self.card)
        self.sync(transfer)
        [synced] = self.sent("character.synced")
        self.assertEqual(
            (synced["integrationId"], synced["characterId"], synced["targetHash"]),
            ("my-game", "ayla", targetHash),
        )
        self.request(card=reference(targetHash))
        self.clock.advance(0)
        self.assertEqual(self.errors(), [])
        self.assertEqual(len(self.sent("reply.completed", requestId="r1")), 1)
        size = len(json.dumps(transfer, separators=(",", ":"), ensure_ascii=False).encode())
        self.assertEqual(self.engine.cardTransfers[0], ("snapshot", size))
        self.assertEqual(self.engine.cardTransfers[1][0], "reference")
        self.assertLess(self.engine.cardTransfers[1][1], 200)

    def test_snapshotUnderAnotherName(self) -> None:
        self.establish()
        transfer = snapshot(self.card)
        transfer["document"] = transfer.pop("card")
        self.sync(transfer)
        self.assertEqual(len(self.sent("character.synced")), 1)

    def test_patch(self) -> None:
        self.establish()
        self.sync(snapshot(self.card))
        changed = copy.deepcopy(self.card)
        changed["data"]["personality"] = "Warm, wary of strangers."
        changed["data"]["tags"].append("quest-giver")
        patch = jsonpatch.make_patch(self.card, changed).patch
        self.sync(
            {
                "format": "chara_card_v2",
                "mode": "patch",
                "baseHash": canonicalHash(self.card),
                "targetHash": canonicalHash(changed),
                "patch": patch,
            }
        )
        self.assertEqual(
            [s["targetHash"] for s in self.sent("character.synced")],
            [canonicalHash(self.card), canonicalHash(changed)],
        )
        self.assertEqual(self.engine.cards.cards[canonicalHash(changed)], changed)
        self.request(card=reference(canonicalHash(changed)))
        self.assertEqual(self.errors(), [])
        self.assertEqual([mode for mode, _ in self.engine.cardTransfers][:2], ["snapshot", "patch"])

    def assertError(self, code: str, retryable: bool, words: str) -> dict[str, Any]:
        [error] = self.errors()
        self.assertEqual(error["code"], code)
        self.assertIs(error["retryable"], retryable)
        self.assertIn(words, error["message"])
        return error

    def test_unknownReference(self) -> None:
        self.establish()
        sent = self.request(card=reference("ab" * 32))
        error = self.assertError("card_resync_required", True, "snapshot")
        self.assertEqual(error["requestId"], "r1")
        self.assertEqual(error["sourceMessageId"], sent["messageId"])
        self.assertEqual(self.sent("reply.accepted"), [])

    def test_resyncRetryUnderSameRequestId(self) -> None:
        """
        card_resync_required is retryable: the same requestId with a
        snapshot is accepted, not a duplicate_request.
        """
        self.establish()
        self.request(card=reference("ab" * 32))
        self.request(card=snapshot(self.card))
        self.clock.advance(0)
        self.assertEqual([e["code"] for e in self.errors()], ["card_resync_required"])
        self.assertEqual(self.engine.processed["r1"], 1)

    def test_patchAgainstUnknownBase(self) -> None:
        self.establish()
        self.sync(
            {
                "format": "chara_card_v2",
                "mode": "patch",
                "baseHash": "cd" * 32,
                "targetHash": canonicalHash(self.card),
                "patch": [],
            }
        )
        self.assertError("card_resync_required", True, "baseHash")

    def test_snapshotWithWrongHash(self) -> None:
        self.establish()
        self.request(card=snapshot(self.card, targetHash="0" * 64))
        self.assertError("invalid_character_card", False, "targetHash does not match")
        self.assertEqual(self.engine.cards.cards, {})

    def test_patchWithWrongTarget(self) -> None:
        self.establish()
        self.sync(snapshot(self.card))
        self.sync(
            {
                "format": "chara_card_v2",
                "mode": "patch",
                "baseHash": canonicalHash(self.card),
                "targetHash": canonicalHash(self.card),
                "patch": [{"op": "replace", "path": "/data/name", "value": "Brann"}],
            }
        )
        self.assertError("invalid_character_card", False, "targetHash does not match")

    def test_invalidCardNamesTheField(self) -> None:
        self.establish()
        card = makeCard()
        del card["data"]["first_mes"]
        self.request(card=snapshot(card))
        self.assertError("invalid_character_card", False, "data.first_mes")

    def test_cacheBelongsToOneSession(self) -> None:
        engine = self.establish()
        self.sync(snapshot(self.card))
        engine.disconnected()
        engine.connected()
        self.game("welcome", sessionId="session-2", serverVersion="game-1.0")
        self.game(
            "reply.request",
            sessionId="session-2",
            requestId="r1",
            integrationId="my-game",
            characterId="ayla",
            event={"text": "Hi"},
            card=reference(canonicalHash(self.card)),
        )
        self.assertEqual([e["code"] for e in self.errors()], ["card_resync_required"])


class ReplyTests(EngineTestMixin, SynchronousTestCase):
    def test_textAndAudioReply(self) -> None:
        self.establish()
        self.request()
        self.clock.advance(0)
        stream = self.stream("r1")
        types = [m["type"] for m in stream]
        expected = defaultReplyText(
            {"event": {"text": "Hello there"}, "player": {"displayName": "Robin"}}
        )

        self.assertEqual(types[0], "reply.accepted")
        self.assertNotIn("transcript", stream[0])
        self.assertEqual(types[-2:], ["reply.audio.completed", "reply.completed"])
        self.assertEqual(types.count("reply.completed"), 1)
        self.assertEqual(types.count("reply.audio.start"), 1)
        self.assertLess(types.index("reply.audio.start"), types.index("reply.audio.chunk"))
        # Speech starts while the text is still being generated.
        self.assertLess(types.index("reply.audio.chunk"), types.index("reply.text.completed"))
        lastDelta = max(i for i, t in enumerate(types) if t == "reply.text.delta")
        lastChunk = max(i for i, t in enumerate(types) if t == "reply.audio.chunk")
        self.assertLess(lastDelta, types.index("reply.text.completed"))
        self.assertEqual(types.index("reply.audio.completed"), lastChunk + 1)
        self.assertGreater(types.index("reply.completed"), types.index("reply.text.completed"))

        deltas = [m for m in stream if m["type"] == "reply.text.delta"]
        self.assertEqual([d["sequence"] for d in deltas], list(range(len(deltas))))
        [completed] = [m for m in stream if m["type"] == "reply.text.completed"]
        self.assertEqual("".join(d["text"] for d in deltas), completed["text"])
        self.assertEqual(completed["text"], expected)
        self.assertIn("Hello there", completed["text"])
        self.assertEqual(completed["stats"]["tokens"], len(deltas))

        [start] = [m for m in stream if m["type"] == "reply.audio.start"]
        self.assertEqual(
            (start["format"], start["sampleRate"], start["channels"]), ("pcm_s16le", 44100, 1)
        )
        chunks = [m for m in stream if m["type"] == "reply.audio.chunk"]
        self.assertEqual([c["sequence"] for c in chunks], list(range(len(chunks))))
        sentences = expected.replace(". ", ".\n").split("\n")
        self.assertEqual(len(sentences), 2)
        self.assertEqual(
            sorted({c["segmentSequence"] for c in chunks}), list(range(len(sentences)))
        )
        totalBytes = 0
        for segment, sentence in enumerate(sentences):
            mine = [c for c in chunks if c["segmentSequence"] == segment]
            self.assertEqual([c["chunkSequence"] for c in mine], list(range(len(mine))))
            self.assertEqual([c["final"] for c in mine], [False] * (len(mine) - 1) + [True])
            pcm = b"".join(base64.b64decode(c["data"]) for c in mine)
            totalBytes += len(pcm)
            self.assertEqual(
                [c["samples"] * 2 for c in mine], [len(base64.b64decode(c["data"])) for c in mine]
            )
            self.assertTrue(all(c["samples"] == 4410 for c in mine[:-1]))
            self.assertEqual(len(pcm) // 2, round(len(sentence) * 0.05 * 44100))
            samples = pcm16Samples(pcm).astype(np.float64)
            spectrum = np.abs(np.fft.rfft(samples))
            peak = np.fft.rfftfreq(len(samples), 1 / 44100)[int(np.argmax(spectrum))]
            self.assertAlmostEqual(peak, 220 + 20 * segment, delta=1.0)
            self.assertLess(np.max(np.abs(samples)), 0.31 * 32768)
            self.assertGreater(np.max(np.abs(samples)), 0.29 * 32768)

        [audioDone] = [m for m in stream if m["type"] == "reply.audio.completed"]
        self.assertEqual(audioDone["segments"], len(sentences))
        self.assertEqual(audioDone["chunks"], len(chunks))
        self.assertEqual(audioDone["bytes"], totalBytes)
        self.assertAlmostEqual(audioDone["durationMs"], totalBytes / 2 / 44.1)
        self.assertEqual(self.engine.processed, {"r1": 1})
        self.assertEqual(self.engine.completed, ["r1"])
        self.assertEqual([c["queueDepth"] for c in self.sent("capacity.update")], [0, 1, 0])

    def test_textOnlyReply(self) -> None:
        self.establish()
        self.request(output=TEXT_ONLY)
        self.clock.advance(0)
        types = [m["type"] for m in self.stream("r1")]
        self.assertFalse([t for t in types if t.startswith("reply.audio")])
        self.assertEqual(types[0], "reply.accepted")
        self.assertEqual(types[-2:], ["reply.text.completed", "reply.completed"])

    def test_customReplyTextSeesTheRequest(self) -> None:
        seen: list[dict[str, Any]] = []

        def reply(request: dict[str, Any]) -> str:
            seen.append(request)
            return "One. Two!"

        self.establish(replyText=reply)
        self.request(output=TEXT_ONLY, text="Knock knock")
        self.clock.advance(0)
        self.assertEqual(seen[0]["event"], {"text": "Knock knock"})
        deltas = self.sent("reply.text.delta")
        self.assertEqual([d["text"] for d in deltas], ["One. ", "Two!"])

    def test_failingGeneration(self) -> None:
        """
        A replyText that raises ends that request with request_failed; the
        queue goes on with the next one.
        """

        def reply(request: dict[str, Any]) -> str:
            if request["requestId"] == "r1":
                raise RuntimeError("model crashed")
            return "Fine."

        self.establish(replyText=reply)
        self.request("r1", output=TEXT_ONLY)
        self.request("r2", output=TEXT_ONLY)
        self.clock.advance(0)
        [error] = self.errors()
        self.assertEqual((error["code"], error["requestId"]), ("request_failed", "r1"))
        self.assertIn("model crashed", error["message"])
        self.assertEqual(self.engine.completed, ["r2"])
        self.assertEqual(self.engine.queueDepth, 0)

    def test_spokenRequestHasTranscript(self) -> None:
        self.establish()
        self.request(event=audioEvent(1.2))
        self.clock.advance(0)
        [accepted] = self.sent("reply.accepted")
        self.assertEqual(accepted["transcript"], "(simulated transcript of 1.20 s of audio)")
        self.assertIn(accepted["transcript"], self.sent("reply.text.completed")[0]["text"])

    def test_tokensPerSecond(self) -> None:
        self.establish(tokensPerSecond=4)
        self.request(output=TEXT_ONLY)
        self.clock.advance(0)
        self.assertEqual(len(self.sent("reply.accepted")), 1)
        self.assertEqual(len(self.sent("reply.text.delta")), 0)
        self.clock.advance(0.25)
        self.assertEqual(len(self.sent("reply.text.delta")), 1)
        self.clock.advance(0.5)
        self.assertEqual(len(self.sent("reply.text.delta")), 3)
        reply = defaultReplyText(
            {"event": {"text": "Hello there"}, "player": {"displayName": "Robin"}}
        )
        tokens = len(tokenize(reply))
        self.clock.advance(tokens / 4 - 0.75 - 0.01)
        self.assertEqual(self.sent("reply.text.completed"), [])
        self.clock.advance(0.01)
        [completed] = self.sent("reply.text.completed")
        self.assertEqual(completed["stats"]["durationMs"], tokens / 4 * 1000)
        self.clock.advance(0)
        self.assertEqual(len(self.sent("reply.completed")), 1)

    def test_audioRealtime(self) -> None:
        self.establish(audioRealtime=True)
        self.request()
        self.clock.advance(0)
        self.assertEqual(len(self.sent("reply.audio.chunk")), 1)
        self.assertEqual(len(self.sent("reply.text.completed")), 1)
        self.clock.advance(0.1)
        self.assertEqual(len(self.sent("reply.audio.chunk")), 2)
        self.clock.advance(10)
        self.assertEqual(len(self.sent("reply.completed")), 1)

    def test_cancelMidStream(self) -> None:
        self.establish(tokensPerSecond=10)
        self.request()
        self.clock.advance(0)
        self.clock.advance(0.35)
        self.assertEqual(len(self.sent("reply.text.delta")), 3)
        cancel = self.game("request.cancel", requestId="r1")
        self.assertEqual(self.sent("ack")[-1]["sourceMessageId"], cancel["messageId"])
        self.assertEqual(self.engine.sent[-2]["type"], "reply.cancelled")
        self.assertEqual(self.engine.sent[-1]["type"], "capacity.update")
        before = len(self.engine.sent)
        self.clock.advance(60)
        self.assertEqual(len(self.engine.sent), before)
        self.assertEqual(self.engine.cancelled, ["r1"])
        self.assertEqual(self.sent("reply.completed"), [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_cancelQueued(self) -> None:
        self.establish(tokensPerSecond=10)
        self.request("r1")
        self.request("r2")
        self.game("request.cancel", requestId="r2")
        self.clock.advance(60)
        self.assertEqual([m["type"] for m in self.stream("r2")], ["reply.cancelled"])
        self.assertEqual(self.engine.processed, {"r1": 1})

    def test_cancelUnknown(self) -> None:
        self.establish()
        self.game("request.cancel", requestId="nope")
        [error] = self.errors()
        self.assertEqual((error["code"], error["requestId"]), ("request_failed", "nope"))

    def test_queueInOrder(self) -> None:
        self.establish()
        for requestId in ("r1", "r2", "r3"):
            self.request(requestId, output=TEXT_ONLY)
        self.clock.advance(0)
        order = [
            (m["type"], m["requestId"])
            for m in self.engine.sent
            if m["type"].startswith("reply.") and m["type"] in ("reply.accepted", "reply.completed")
        ]
        self.assertEqual(
            order,
            [(t, r) for r in ("r1", "r2", "r3") for t in ("reply.accepted", "reply.completed")],
        )
        self.assertEqual(self.engine.processed, {"r1": 1, "r2": 1, "r3": 1})

    def test_concurrency(self) -> None:
        self.establish(concurrency=2, tokensPerSecond=10)
        for requestId in ("r1", "r2", "r3"):
            self.request(requestId, output=TEXT_ONLY)
        self.clock.advance(0)
        self.assertEqual([m["requestId"] for m in self.sent("reply.accepted")], ["r1", "r2"])

    def test_capacityExceeded(self) -> None:
        self.establish(queueLimit=2, tokensPerSecond=10)
        self.request("r1")
        self.request("r2")
        self.request("r3")
        [error] = self.errors()
        self.assertEqual(
            (error["code"], error["retryable"], error["requestId"]),
            ("capacity_exceeded", True, "r3"),
        )
        updates = [(c["acceptingRequests"], c["queueDepth"]) for c in self.sent("capacity.update")]
        self.assertEqual(updates, [(True, 0), (True, 1), (False, 2)])
        self.runFor(10)
        self.assertEqual(self.engine.completed, ["r1", "r2"])
        self.assertEqual(self.sent("capacity.update")[-1]["acceptingRequests"], True)
        self.assertNotIn("r3", self.engine.processed)

    def test_setAccepting(self) -> None:
        self.establish()
        self.engine.setAccepting(False)
        self.assertEqual(self.engine.sent[-1]["type"], "capacity.update")
        self.assertIs(self.engine.sent[-1]["acceptingRequests"], False)
        self.request()
        self.assertEqual(self.errors()[0]["code"], "capacity_exceeded")
        self.engine.setAccepting(True)
        self.request()
        self.clock.advance(0)
        self.assertEqual(self.engine.processed, {"r1": 1})

    def test_disconnectMidTurn(self) -> None:
        self.establish(tokensPerSecond=10)
        self.request()
        self.clock.advance(0.2)
        before = len(self.engine.sent)
        self.engine.disconnect()
        self.successResultOf(self.engine.closed)
        self.clock.advance(60)
        self.assertEqual(len(self.engine.sent), before)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class RequestCheckTests(EngineTestMixin, SynchronousTestCase):
    def assertRejected(
        self,
        code: str,
        words: str,
        retryable: bool = False,
        options: dict[str, Any] | None = None,
        **request: Any,
    ) -> None:
        self.establish(**(options or {}))
        self.request(**request)
        self.clock.advance(0)
        [error] = self.errors()
        self.assertEqual((error["code"], error["retryable"]), (code, retryable))
        self.assertIn(words, error["message"])
        self.assertEqual(error["requestId"], "r1")
        self.assertEqual(self.sent("reply.accepted"), [])
        self.assertEqual(len(self.sent("ack")), 2)

    def test_unsupportedVoice(self) -> None:
        self.assertRejected("unsupported_voice", "F9", output=dict(SPEECH, audio={"voice": "F9"}))

    def test_unsupportedOutputLanguage(self) -> None:
        self.assertRejected("unsupported_language", "xx", output=dict(SPEECH, language="xx"))

    def test_textOutputHasNoLanguageCheck(self) -> None:
        self.establish()
        self.request(output={"modalities": ["text"], "language": "xx"})
        self.assertEqual(self.errors(), [])

    def test_wrongSpeechModel(self) -> None:
        self.assertRejected(
            "request_failed", "model", output=dict(SPEECH, audio={"voice": "M1", "model": "other"})
        )

    def test_unsupportedInputLanguage(self) -> None:
        self.assertRejected("unsupported_language", "fr", event=audioEvent(1, language="fr"))

    def test_audioLongerThan30Seconds(self) -> None:
        self.assertRejected("request_failed", "audio longer than 30 s", event=audioEvent(30.5))

    def test_wrongSampleRate(self) -> None:
        self.assertRejected("request_failed", "sampleRate", event=audioEvent(1, sampleRate=44100))

    def test_wrongAudioFormat(self) -> None:
        self.assertRejected("request_failed", "format", event=audioEvent(1, format="mp3"))

    def test_stereoAudio(self) -> None:
        self.assertRejected("request_failed", "channels", event=audioEvent(1, channels=2))

    def test_badBase64(self) -> None:
        self.assertRejected("request_failed", "base64", event=audioEvent(1, data="not base64!"))

    def test_float32AudioAccepted(self) -> None:
        self.establish()
        data = base64.b64encode(inputRecording(2.0, "pcm_f32le")).decode()
        self.request(event=audioEvent(1, format="pcm_f32le", data=data))
        self.clock.advance(0)
        self.assertEqual(self.errors(), [])
        self.assertIn("2.00 s", self.sent("reply.accepted")[0]["transcript"])

    def test_eventNeedsTextOrAudio(self) -> None:
        self.assertRejected("request_failed", "text or audio", event={})

    def test_serviceNotStarted(self) -> None:
        self.assertRejected(
            "service_not_started", "not started", retryable=True, options={"serviceStarted": False}
        )
        self.engine.options.serviceStarted = True
        self.request()
        self.clock.advance(0)
        self.assertEqual(self.engine.processed, {"r1": 1})

    def test_duplicateRequest(self) -> None:
        self.establish()
        self.request()
        self.request()
        [error] = self.errors()
        self.assertEqual((error["code"], error["requestId"]), ("duplicate_request", "r1"))
        self.clock.advance(0)
        self.assertEqual(self.engine.processed, {"r1": 1})


class VoiceCaptureTests(EngineTestMixin, SynchronousTestCase):
    def capture(self, **extra: Any) -> dict[str, Any]:
        return self.request(kind="voice.capture.start", **extra)

    def states(self) -> list[str]:
        return [m["state"] for m in self.sent("voice.capture.state")]

    def test_captureFlow(self) -> None:
        self.establish(captureSpeechSeconds=1.0)
        start = self.capture()
        self.assertEqual(self.sent("ack")[-1]["sourceMessageId"], start["messageId"])
        self.assertEqual(self.states(), ["listening"])
        self.clock.advance(0)
        self.assertEqual(self.states(), ["listening", "speaking"])
        self.clock.advance(0.9)
        levels = self.sent("voice.capture.level", requestId="r1")
        self.assertGreaterEqual(len(levels), 3)
        self.assertTrue(all(0.0 <= m["level"] <= 1.0 for m in levels))
        self.assertEqual(self.sent("reply.accepted"), [])
        self.clock.advance(0.1)
        self.assertEqual(self.states(), ["listening", "speaking", "processing"])
        self.clock.advance(0)
        types = [m["type"] for m in self.stream("r1")]
        processing = max(
            i for i, m in enumerate(self.stream("r1")) if m.get("state") == "processing"
        )
        self.assertEqual(types[processing + 1], "reply.accepted")
        self.assertEqual(types[-1], "reply.completed")
        [accepted] = self.sent("reply.accepted")
        self.assertEqual(accepted["transcript"], "(simulated transcript of 1.00 s of speech)")
        self.assertEqual(self.engine.processed, {"r1": 1})

    def test_stopEndsSpeechEarly(self) -> None:
        self.establish(captureSpeechSeconds=5.0)
        self.capture()
        self.clock.advance(0)
        self.clock.advance(0.5)
        self.game("voice.capture.stop", requestId="r1")
        self.assertEqual(self.states()[-1], "processing")
        self.clock.advance(0)
        self.assertIn("0.50 s of speech", self.sent("reply.accepted")[0]["transcript"])
        self.assertEqual(len(self.sent("reply.completed")), 1)

    def test_cancelCapture(self) -> None:
        self.establish()
        self.capture()
        self.clock.advance(0.3)
        self.game("voice.capture.cancel", requestId="r1")
        self.assertEqual(self.states()[-1], "idle")
        self.assertEqual(self.sent("reply.cancelled", requestId="r1")[0]["requestId"], "r1")
        self.clock.advance(10)
        self.assertEqual(self.sent("reply.accepted"), [])
        self.assertEqual(self.engine.cancelled, ["r1"])

    def test_microphoneNotEnabled(self) -> None:
        self.establish(microphoneEnabled=False)
        self.capture()
        [error] = self.errors()
        self.assertEqual((error["code"], error["requestId"]), ("microphone_not_enabled", "r1"))
        self.assertEqual(self.states(), [])


class LoopbackTests(TestCase):
    """
    connectSimulator against a real game-side WebSocket listener.
    """

    @inlineCallbacks
    def test_connectSimulator(self) -> Any:
        from twisted.internet import reactor

        seen: dict[str, Any] = {"messages": []}
        established: Deferred[None] = Deferred()
        replied: Deferred[None] = Deferred()
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
        self.assertEqual((ack["type"], ack["sourceMessageId"]), ("ack", seen["welcome"]))
        self.assertEqual(capacity["sessionId"], "loop-session")
        handle = engine.carrier.transport.getHandle()
        self.assertTrue(handle.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        # One whole turn across the wire: JSON, base64 audio and all.
        card = makeCard()
        turn = Envelope.build(
            "reply.request",
            "loop-session",
            requestId="wire-1",
            integrationId="my-game",
            characterId="ayla",
            event={"text": "Over the wire"},
            output=SPEECH,
            card=snapshot(card),
        )
        seen["peer"].sendMessage(turn.toBytes())
        yield replied
        got = seen["messages"][3:]
        self.assertEqual(got[0]["sourceMessageId"], turn.messageId)
        deltas = [m["text"] for m in got if m["type"] == "reply.text.delta"]
        self.assertIn("Over the wire", "".join(deltas))
        chunks = [m for m in got if m["type"] == "reply.audio.chunk"]
        self.assertEqual(
            sum(len(base64.b64decode(c["data"])) for c in chunks),
            [m for m in got if m["type"] == "reply.audio.completed"][0]["bytes"],
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
