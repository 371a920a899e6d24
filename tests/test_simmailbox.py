"""
The simulated RPEngine's file mode (rpmiddleware/testing/simmailbox.py)
against RPEngine's own adapter, src/filesystem-mailbox-adapter.ts and its
tests: a hand-driven game side writes and reads the folder, on a L{Clock}.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.engine.mailbox.audioslots import AudioLayout, createSlots, parseWav, silentSlot
from rpmiddleware.engine.mailbox.files import FROM_ENGINE, TO_ENGINE, makeStem, writeEnvelope
from rpmiddleware.engine.mailbox.service import MailboxOptions, manifest
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.simcore import AUDIO_TRANSPORT_FAILED_MESSAGE
from rpmiddleware.testing.simmailbox import (
    ACK_REMOVAL,
    MailboxTransport,
    ManifestRefused,
)
from rpmiddleware.testing.simoptions import SimulatorOptions

SPEECH = {
    "modalities": ["text", "audio"],
    "language": "en",
    "audio": {"model": "gemtavern-supertonic-3", "voice": "F1"},
}


class Game:
    """
    The game side, by hand: a mailbox folder, envelopes written into it and
    read out of it.
    """

    def __init__(self, case: SynchronousTestCase, slots: int = 8) -> None:
        self.root = os.path.abspath(case.mktemp())
        os.mkdir(self.root, 0o700)
        layout = AudioLayout(slotCount=slots)
        for name in (TO_ENGINE, FROM_ENGINE, "audio"):
            os.mkdir(os.path.join(self.root, name), 0o700)
        with open(os.path.join(self.root, "manifest.json"), "w") as f:
            json.dump(manifest(MailboxOptions(path=self.root), layout), f)
        audio = os.open(os.path.join(self.root, "audio"), os.O_RDONLY | os.O_DIRECTORY)
        createSlots(audio, layout)
        os.close(audio)
        self.outbox = os.open(os.path.join(self.root, TO_ENGINE), os.O_RDONLY | os.O_DIRECTORY)
        case.addCleanup(os.close, self.outbox)
        self.clock = Clock()
        self.stamp = 1_000_000_000_000
        self.sessionId = "game-session"
        self.case = case

    def transport(self, **options: Any) -> MailboxTransport:
        options.setdefault("welcomeTimeout", None)
        transport = MailboxTransport(self.clock, self.root, SimulatorOptions(**options))
        self.case.addCleanup(transport.disconnect, "test over", False)
        return transport

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        envelope = Envelope.build(kind, self.sessionId, **fields)
        self.stamp += 1
        writeEnvelope(
            self.outbox, makeStem(self.stamp, str(envelope.messageId)), envelope.toBytes()
        )
        return envelope.fields

    def read(self) -> list[dict[str, Any]]:
        """
        Everything RPEngine wrote (ready and whole), in order; left in place.
        """
        folder = os.path.join(self.root, FROM_ENGINE)
        stems = sorted(n[:-6] for n in os.listdir(folder) if n.endswith(".ready"))
        found = []
        for stem in stems:
            with open(os.path.join(folder, stem + ".json"), encoding="utf-8") as f:
                found.append(json.load(f))
        return found

    def types(self) -> list[str]:
        return [m["type"] for m in self.read()]

    def run(self, seconds: float, step: float = 0.01) -> None:
        for _ in range(round(seconds / step)):
            self.clock.advance(step)

    def welcome(self, transport: MailboxTransport, **fields: Any) -> None:
        fields.setdefault("peerInstanceId", "peer-1")
        fields.setdefault("nextAudioSlot", 0)
        transport.connect()
        self.run(0.1)
        self.write("welcome", serverVersion="test", **fields)
        self.run(0.3)

    def request(self, requestId: str = "r1", text: str = "Hello there?", **fields: Any) -> None:
        fields.setdefault("output", SPEECH)
        self.write(
            "reply.request",
            requestId=requestId,
            eventId=f"e-{requestId}",
            integrationId="game",
            characterId="mira",
            event={"text": text},
            card={"format": "chara_card_v2", "mode": "snapshot", "snapshot": exampleCard()},
            **fields,
        )


class ConnectTests(SynchronousTestCase):
    def test_manifestRefused(self) -> None:
        game = Game(self)
        path = os.path.join(game.root, "manifest.json")
        for change in ({"schema": "other"}, {"version": 2}):
            with open(path) as f:
                document = json.load(f)
            document.update(change)
            with open(path, "w") as f:
                json.dump(document, f)
            transport = game.transport()
            self.failureResultOf(transport.connect(), ManifestRefused)
            self.assertIn("Unsupported", transport.errors[0])
        document.update(schema="gemtavern.rp_engine.file_transport", version=1)
        document["audio"]["channels"] = 2
        with open(path, "w") as f:
            json.dump(document, f)
        transport = game.transport()
        self.failureResultOf(transport.connect(), ManifestRefused)
        self.assertIn("Invalid", transport.errors[0])

    def test_connectCleansAndRecovers(self) -> None:
        """
        On connect: files older than a day go, its own unacknowledged files
        are found again (old acks removed), then hello.
        """
        game = Game(self)
        folder = os.path.join(game.root, FROM_ENGINE)
        old = os.path.join(game.root, TO_ENGINE, "0000000000001-old.json")
        with open(old, "w") as f:
            f.write("{}")
        long = time.time() - 25 * 3600
        os.utime(old, (long, long))
        for stem, kind in (("0000000000002-a", "capacity.update"), ("0000000000003-b", "ack")):
            with open(os.path.join(folder, stem + ".json"), "w") as f:
                json.dump({"type": kind, "messageId": stem[-1]}, f)
            open(os.path.join(folder, stem + ".ready"), "w").close()
        transport = game.transport()
        transport.connect()
        self.assertFalse(os.path.exists(old))
        [hello] = [m for m in game.read() if m["type"] == "hello"]
        self.assertEqual(
            transport.outgoing,
            {"a": "0000000000002-a", hello["messageId"]: transport.outgoing[hello["messageId"]]},
        )
        self.assertEqual(game.types(), ["capacity.update", "hello"])

    def test_polling(self) -> None:
        game = Game(self)
        transport = game.transport()
        transport.connect()
        game.run(0.05)
        transport.polls = 0
        game.run(2.0)  # active after writing hello
        active = transport.polls
        transport.polls = 0
        game.run(4.0)
        self.assertGreaterEqual(active, 30)
        self.assertTrue(14 <= transport.polls <= 17, transport.polls)


class ReadingTests(SynchronousTestCase):
    def test_readyOnlyInOrderThenRemoved(self) -> None:
        game = Game(self)
        transport = game.transport()
        game.welcome(transport)
        with open(os.path.join(game.root, TO_ENGINE, "0000000000000-unready.json"), "w") as f:
            f.write("{}")
        game.write("request.cancel", requestId="x")
        game.write("request.cancel", requestId="y")
        game.run(0.5)
        received = [m["type"] for m in transport.engine.receivedMessages]
        self.assertEqual(received, ["welcome", "request.cancel", "request.cancel"])
        self.assertEqual(
            os.listdir(os.path.join(game.root, TO_ENGINE)), ["0000000000000-unready.json"]
        )

    def test_acks(self) -> None:
        """
        It acks every message but an ack, removes its acks after two
        seconds, and removes a file of its own once the game acks it.
        """
        game = Game(self)
        transport = game.transport()
        game.welcome(transport)
        acks = [m for m in game.read() if m["type"] == "ack"]
        self.assertEqual(len(acks), 1)
        game.run(ACK_REMOVAL)
        self.assertNotIn("ack", game.types())
        [hello, capacity] = game.read()
        game.write("ack", acknowledgedMessageId=hello["messageId"])
        game.run(0.5)
        self.assertEqual([m["type"] for m in game.read()], ["capacity.update"])
        self.assertEqual(list(transport.outgoing), [capacity["messageId"]])

    def test_oversizeRefused(self) -> None:
        game = Game(self)
        transport = game.transport()
        game.welcome(transport)
        path = os.path.join(game.root, TO_ENGINE, "0000000000009-big")
        with open(path + ".json", "wb") as f:
            f.truncate(8 * 1024 * 1024 + 1)
        open(path + ".ready", "w").close()
        game.run(0.5)
        self.assertIn("RPEngine message exceeds 8 MiB.", transport.errors)
        self.assertFalse(os.path.exists(path + ".json"))


class BatchingTests(SynchronousTestCase):
    def test_textDeltas(self) -> None:
        """
        Deltas of one request within 120 ms become one, renumbered from 0;
        pending text is flushed before the request's completion; a capacity
        update does not flush it.
        """
        game = Game(self)
        transport = game.transport()
        game.welcome(transport)
        before = len(game.read())
        send = transport.send
        send(
            Envelope.build("reply.text.delta", "s", requestId="q", sequence=0, delta="Hold").fields
        )
        send(Envelope.build("reply.text.delta", "s", requestId="q", sequence=1, delta=" on").fields)
        send(Envelope.build("capacity.update", "s", queueDepth=1).fields)
        game.clock.advance(0.119)
        self.assertEqual(game.types()[before:], ["capacity.update"])
        game.clock.advance(0.002)
        self.assertEqual(game.read()[-1]["delta"], "Hold on")
        self.assertEqual(game.read()[-1]["sequence"], 0)
        send(Envelope.build("reply.text.delta", "s", requestId="q", sequence=2, delta=".").fields)
        send(Envelope.build("reply.text.completed", "s", requestId="q", text="Hold on.").fields)
        last = game.read()[-2:]
        self.assertEqual(
            [(m["type"], m.get("sequence"), m.get("delta")) for m in last],
            [("reply.text.delta", 1, "."), ("reply.text.completed", None, None)],
        )

    def test_voiceLevels(self) -> None:
        """
        The newest level per 250 ms window; one pending when a state
        arrives is dropped.
        """
        game = Game(self)
        transport = game.transport()
        game.welcome(transport)
        before = len(game.read())
        for seconds in (0.1, 0.2, 0.3):
            transport.send(
                Envelope.build(
                    "voice.capture.level", "s", requestId="v", seconds=seconds, peak=seconds
                ).fields
            )
        game.clock.advance(0.25)
        levels = [m for m in game.read()[before:] if m["type"] == "voice.capture.level"]
        self.assertEqual([m["seconds"] for m in levels], [0.3])
        transport.send(
            Envelope.build("voice.capture.level", "s", requestId="v", seconds=0.4).fields
        )
        transport.send(
            Envelope.build("voice.capture.state", "s", requestId="v", state="speech_ended").fields
        )
        game.clock.advance(0.5)
        self.assertEqual(game.read()[-1]["type"], "voice.capture.state")
        self.assertEqual(len([m for m in game.read() if m["type"] == "voice.capture.level"]), 1)


class AudioTests(SynchronousTestCase):
    def test_segments(self) -> None:
        """
        Each phrase is a WAV in the next slot and a reply.audio.segment
        naming it; no audio start or chunks; consumed puts silence back.
        """
        game = Game(self)
        transport = game.transport()
        game.welcome(transport, peerInstanceId="peer-9", nextAudioSlot=3)
        game.request()
        game.run(1.0)
        kinds = game.types()
        self.assertNotIn("reply.audio.chunk", kinds)
        self.assertNotIn("reply.audio.start", kinds)
        segments = [m for m in game.read() if m["type"] == "reply.audio.segment"]
        self.assertEqual([s["slotIndex"] for s in segments], [3, 4, 5])
        first = segments[0]
        self.assertEqual(
            {k: first[k] for k in ("path", "format", "sampleRate", "channels", "peerInstanceId")},
            {
                "path": "audio/slot_0003.wav",
                "format": "wav_pcm_s16le",
                "sampleRate": 44100,
                "channels": 1,
                "peerInstanceId": "peer-9",
            },
        )
        with open(os.path.join(game.root, "audio", "slot_0003.wav"), "rb") as f:
            wav = f.read()
        self.assertEqual(len(wav), first["byteLength"])
        self.assertEqual(len(parseWav(wav).pcm), transport.segments[0]["byteLength"])
        ends = [k for k in kinds if k in ("reply.audio.completed", "reply.completed")]
        self.assertEqual(ends, ["reply.audio.completed", "reply.completed"])
        game.write("reply.audio.segment.consumed", slotIndex=3)
        game.run(0.5)
        with open(os.path.join(game.root, "audio", "slot_0003.wav"), "rb") as f:
            self.assertEqual(f.read(), silentSlot())

    def test_exhausted(self) -> None:
        """
        Out of slots: audio_transport_failed for that request (its audio
        completion and completion kept back), and audio stripped from the
        game's later requests until a new peer identity arrives.
        """
        game = Game(self, slots=2)
        transport = game.transport()
        game.welcome(transport)
        game.request("r1")
        game.run(1.0)
        [error] = [m for m in game.read() if m["type"] == "request.error"]
        self.assertEqual((error["requestId"], error["code"]), ("r1", "audio_transport_failed"))
        # src/app-host.ts replyAudioTransport: the host's own message, not
        # retryable, and no sourceMessageId (the core never saw the failure).
        self.assertEqual(
            (error["message"], error["retryable"]), (AUDIO_TRANSPORT_FAILED_MESSAGE, False)
        )
        self.assertNotIn("sourceMessageId", error)
        self.assertFalse([m for m in game.read() if m["type"] == "reply.completed"])
        game.request("r2", text="Again.")
        game.run(1.0)
        stripped = transport.engine.receivedMessages[-1]
        self.assertEqual(stripped["output"], {"modalities": ["text"], "language": "en"})
        game.write("welcome", serverVersion="test", peerInstanceId="peer-2", nextAudioSlot=0)
        game.request("r3", text="Once more.")
        game.run(1.0)
        self.assertEqual(transport.nextSlot, 2)
        self.assertFalse(transport.audioExhausted)
