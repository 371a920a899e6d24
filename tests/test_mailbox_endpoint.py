"""
The engine endpoint's file mailbox (rpmiddleware/engine/mailbox/) against
the simulated RPEngine in file mode (rpmiddleware/testing/simmailbox.py,
which follows RPEngine's src/filesystem-mailbox-adapter.ts), both on one
L{Clock} and a temporary folder: the layout RPEngine reads, the handshake,
turns, acks and removal, crash safety, restarts of either side, hostile
files, and the audio slots.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.core.middleware import Middleware
from rpmiddleware.engine.mailbox.audioslots import parseWav, silentSlot
from rpmiddleware.engine.mailbox.files import FROM_ENGINE, TO_ENGINE, writeAtomic
from rpmiddleware.engine.mailbox.service import MailboxOptions, MailboxService
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import captureLogEvents
from rpmiddleware.testing.simmailbox import spokenChunks
from tests.support.mailbox import Rig, ending, transportOf


def _read(rig: Rig, name: str) -> str:
    with open(os.path.join(rig.root, TO_ENGINE, name), encoding="utf-8") as f:
        return f.read()


def typeOf(envelope: Envelope) -> str:
    return envelope.type


def envelopeBytes(kind: str, sessionId: str | None, **fields: Any) -> tuple[str, bytes]:
    envelope = Envelope.build(kind, sessionId, **fields)
    return str(envelope.messageId), envelope.toBytes()


class LayoutTests(SynchronousTestCase):
    def test_manifestAndFolders(self) -> None:
        """
        The manifest RPEngine reads, the two mailboxes and the audio folder
        (yours alone), and every slot, silent; the log names the folder to
        select in RPEngine.
        """
        events = captureLogEvents(self)
        rig = Rig(self, slots=8)
        with open(os.path.join(rig.root, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        self.assertEqual(
            manifest,
            {
                "schema": "gemtavern.rp_engine.file_transport",
                "version": 1,
                "integrationId": "rpmiddleware",
                "displayName": "rpmiddleware",
                "mailboxes": {
                    "integrationToEngine": "integration-to-engine",
                    "engineToIntegration": "engine-to-integration",
                },
                "audio": {
                    "format": "wav_pcm_s16le",
                    "directory": "audio",
                    "slotPattern": "slot_%04d.wav",
                    "slotCount": 8,
                    "sampleRate": 44100,
                    "channels": 1,
                },
            },
        )
        for name in (TO_ENGINE, FROM_ENGINE, "audio"):
            mode = os.stat(os.path.join(rig.root, name)).st_mode
            self.assertEqual(stat.S_IMODE(mode), 0o700, name)
        self.assertEqual(rig.files("audio"), [f"slot_{i:04d}.wav" for i in range(8)])
        with open(os.path.join(rig.root, "audio", "slot_0005.wav"), "rb") as f:
            self.assertEqual(f.read(), silentSlot())
        [ready] = [e for e in events if e.get("folder") == rig.root and "slots" in e]
        self.assertIn("Filesystem mailbox", ready["log_format"])
        self.assertIn("Choose mailbox folder", ready["log_format"])

    def test_refusedFolders(self) -> None:
        """
        A world-writable folder, a link, or a world-writable mailbox inside
        it: start-up stops with the reason.
        """
        base = os.path.abspath(self.mktemp())
        os.mkdir(base, 0o700)
        open_ = os.path.join(base, "open")
        os.mkdir(open_)
        os.chmod(open_, 0o777)
        link = os.path.join(base, "link")
        os.symlink(os.path.join(base, "open"), link)
        inner = os.path.join(base, "inner")
        os.makedirs(os.path.join(inner, TO_ENGINE))
        os.chmod(os.path.join(inner, TO_ENGINE), 0o777)
        for path, fragment in (
            (open_, "writable by every user"),
            (link, "symbolic link"),
            (inner, "writable by every user"),
            (os.path.join(base, "missing", "box"), "is no folder"),
        ):
            service = MailboxService(
                Clock(), Middleware(Clock()), MailboxOptions(path=path, watch=False)
            )
            with self.assertRaises(SystemExit) as caught:
                service.privilegedStartService()
            self.assertIn(fragment, str(caught.exception), path)
            self.assertIn("cannot use the RPEngine mailbox", str(caught.exception))


class HandshakeTests(SynchronousTestCase):
    def test_helloWelcome(self) -> None:
        """
        RPEngine's hello is acknowledged, then welcomed with the process's
        peer identity and the next audio slot; the link has a live session.
        """
        rig = Rig(self, adopt=False)
        engine = rig.engine()
        transport = transportOf(engine)
        session = rig.middleware.link.session
        assert session is not None
        self.assertTrue(session.fileMode)
        self.assertEqual(engine.sessionId, session.sessionId)
        [hello] = [m for m in engine.sent if m["type"] == "hello"]
        received = [m for m in engine.receivedMessages if isinstance(m, dict)]
        # The welcome at once; the acks of a poll's files together after it.
        self.assertEqual([m["type"] for m in received[:2]], ["ack", "welcome"])
        self.assertEqual(received[0]["acknowledgedMessageId"], hello["messageId"])
        welcome = received[1]
        ledger = rig.endpoint.ledger
        self.assertEqual(welcome["peerInstanceId"], ledger.peerInstanceId)
        self.assertEqual(welcome["nextAudioSlot"], 0)
        self.assertEqual(transport.peerInstanceId, ledger.peerInstanceId)
        rig.run(3.0)
        # Both sides acknowledged and removed everything.
        self.assertEqual(rig.files(TO_ENGINE), [])
        self.assertEqual(rig.files(FROM_ENGINE), [])
        self.assertEqual(transport.errors, [])

    def test_adoptedAfterRestart(self) -> None:
        """
        With RPEngine already polling (it will not say hello again), the
        welcome written at start-up is adopted: the session goes live when
        RPEngine shows it read it, not before.
        """
        rig = Rig(self, adopt=False)
        engine = rig.engine()
        rig.kill()
        again = Rig(self, root=rig.root, clock=rig.clock)
        self.assertIsNone(again.middleware.link.session)
        pending = again.endpoint.session
        self.assertTrue(pending.pending)
        again.run(1.0)
        self.assertFalse(pending.pending)
        self.assertIs(again.middleware.link.session, pending)
        self.assertEqual(engine.sessionId, pending.sessionId)
        turn = again.ask()
        again.run(3.0)
        self.assertEqual(typeOf(ending(turn)), "reply.completed")

    def test_noRPEngineNoSession(self) -> None:
        """
        Nobody reads the folder: the offered session never goes live and
        requests wait in the link, as with no WebSocket.
        """
        rig = Rig(self)
        rig.run(60.0)
        self.assertIsNone(rig.middleware.link.session)
        rig.ask()
        rig.run(1.0)
        self.assertEqual(len(rig.middleware.link.waiting), 1)
        self.assertEqual(len(rig.files(TO_ENGINE)), 2)  # the offered welcome alone
        engine = rig.engine()
        rig.run(3.0)
        self.assertEqual(len(rig.middleware.link.waiting), 0)
        self.assertEqual(len(engine.completed), 1)

    def test_polling(self) -> None:
        """
        Every 250 ms when idle, every 50 ms while messages flow.
        """
        rig = Rig(self)
        rig.run(3.0)  # the welcome offered at start-up counts as traffic
        before = rig.service.polls
        rig.run(10.0)
        idle = rig.service.polls - before
        self.assertTrue(38 <= idle <= 41, idle)
        rig.engine()
        rig.ask()
        before = rig.service.polls
        rig.run(1.0)
        self.assertGreaterEqual(rig.service.polls - before, 18)


class TurnTests(SynchronousTestCase):
    def test_typedTurn(self) -> None:
        """
        A typed turn: the chain sees RPEngine's socket stream (start, 32 KiB
        chunks numbered like its socket adapter's) from the WAV slots; each
        slot is answered consumed and made silent again; nothing is left in
        either folder.
        """
        rig = Rig(self)
        engine = rig.engine()
        transport = transportOf(engine)
        turn = rig.ask()
        rig.run(4.0)
        done = ending(turn)
        self.assertEqual(done.type, "reply.completed")
        kinds = [e.type for e in turn.envelopes]
        self.assertEqual(kinds[0], "reply.accepted")
        self.assertEqual(kinds.count("reply.audio.start"), 1)
        self.assertEqual(kinds[-2:], ["reply.audio.completed", "reply.completed"])
        self.assertNotIn("reply.audio.segment", kinds)
        chunks = [e.fields for e in turn.envelopes if e.type == "reply.audio.chunk"]
        spoken = spokenChunks(engine, turn.requestId)
        fields = (
            "sequence",
            "segmentSequence",
            "segmentChunkSequence",
            "segmentChunkCount",
            "data",
        )
        self.assertEqual(
            [{k: c[k] for k in fields} for c in chunks], [{k: c[k] for k in fields} for c in spoken]
        )
        self.assertEqual([c["sequence"] for c in chunks], list(range(len(chunks))))
        completed = turn.envelopes[-2]
        pcm = b"".join(base64.b64decode(c["data"]) for c in chunks)
        self.assertEqual(completed["totalBytes"], len(pcm))
        self.assertEqual(completed["chunkCount"], len(chunks))
        self.assertGreaterEqual(len(transport.segments), 2)
        consumed = [
            m for m in engine.receivedMessages if m["type"] == "reply.audio.segment.consumed"
        ]
        self.assertEqual([m["slotIndex"] for m in consumed], list(range(len(transport.segments))))
        self.assertTrue(all(m["requestId"] == turn.requestId for m in consumed))
        for index in range(len(transport.segments)):
            path = os.path.join(rig.root, "audio", f"slot_{index:04d}.wav")
            with open(path, "rb") as f:
                self.assertEqual(parseWav(f.read()).pcm, b"\x00\x00")
        self.assertEqual(turn.text(), engine.sentOfType("reply.text.completed")[0]["text"])
        self.assertEqual(engine.processed[turn.requestId], 1)
        rig.run(3.0)
        self.assertEqual((rig.files(TO_ENGINE), rig.files(FROM_ENGINE)), ([], []))
        self.assertEqual(len(rig.endpoint.outbox), 0)
        self.assertEqual(rig.endpoint.ledger.nextSlot, len(transport.segments))
        self.assertEqual(transport.errors, [])

    def test_textCoalesced(self) -> None:
        """
        RPEngine batches text deltas in file mode (120 ms): fewer deltas,
        numbered from 0, the same text.
        """
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=50.0)
        turn = rig.ask()
        rig.run(6.0)
        deltas = [e for e in turn.envelopes if e.type == "reply.text.delta"]
        tokens = engine.sentOfType("reply.text.delta", requestId=turn.requestId)
        self.assertLess(len(deltas), len(tokens))
        self.assertEqual([d["sequence"] for d in deltas], list(range(len(deltas))))
        self.assertEqual("".join(d["delta"] for d in deltas), "".join(t["delta"] for t in tokens))

    def test_cancel(self) -> None:
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=20.0)
        turn = rig.ask()
        rig.run(0.5)
        turn.cancel()
        rig.run(2.0)
        self.assertEqual(typeOf(ending(turn)), "reply.cancelled")
        self.assertEqual(engine.cancelled, [turn.requestId])

    def test_voiceCapture(self) -> None:
        """
        A capture through RPEngine's microphone: levels thinned to the
        newest per 250 ms, states and transcript, then the reply.
        """
        rig = Rig(self)
        engine = rig.engine(captureSpeechSeconds=1.5)
        turn = rig.middleware.captureVoice("mira")
        rig.run(5.0)
        self.assertEqual(typeOf(ending(turn)), "reply.completed")
        kinds = [e.type for e in turn.envelopes]
        levels = kinds.count("voice.capture.level")
        self.assertGreater(levels, 0)
        self.assertLess(levels, len(engine.sentOfType("voice.capture.level")))
        self.assertIn("voice.capture.transcript", kinds)
        self.assertEqual(
            [e["state"] for e in turn.envelopes if e.type == "voice.capture.state"],
            ["listening", "speech_started", "speech_ended"],
        )


class ReliabilityTests(SynchronousTestCase):
    def test_unreadIsNotRewritten(self) -> None:
        """
        RPEngine is slow to read for a moment (under the reader watch's
        five seconds): the request waits in the folder, written once, not
        again after the ack timeout (here 1 s); read then, it is played once.
        """
        rig = Rig(self)
        rig.middleware.settings.engine.ack_timeout = 1.0
        engine = rig.engine()
        transport = transportOf(engine)
        transport.disconnect(notify=False)
        turn = rig.ask()

        def copies() -> list[str]:
            names = [n for n in rig.files(TO_ENGINE) if n.endswith(".json")]
            return [n for n in names if str(turn.requestId) in _read(rig, n)]

        rig.run(0.1)
        first = copies()
        rig.run(4.4)
        self.assertEqual((len(first), copies()), (1, first))
        transport.connected = True
        transport.poll()
        rig.run(4.0)
        self.assertEqual(typeOf(ending(turn)), "reply.completed")
        self.assertEqual(engine.processed[turn.requestId], 1)

    def test_readButUnacknowledgedIsRewritten(self) -> None:
        """
        RPEngine read the request but its ack was lost: the request is
        written again under the same messageId, RPEngine answers it is a
        duplicate, and plays it once.
        """
        rig = Rig(self)
        engine = rig.engine()
        loop = rig.service._loop
        assert loop is not None
        loop.stop()  # we stop reading for a moment
        turn = rig.ask()
        rig.run(0.3)
        for name in rig.files(FROM_ENGINE):  # the ack and everything after it is lost
            os.unlink(os.path.join(rig.root, FROM_ENGINE, name))
        loop.start(0.05)
        rig.run(8.0)
        self.assertEqual(len(engine.duplicates), 1)
        self.assertEqual(engine.processed[turn.requestId], 1)

    def test_middlewareRestartMidTurn(self) -> None:
        """
        The middleware dies mid-turn and starts again on the same folder:
        what it wrote and RPEngine had not read yet is read once, nothing
        is written twice, RPEngine is adopted without a new hello, and the
        next turn plays with a new peer identity from slot 0.
        """
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=20.0)
        transport = transportOf(engine)
        first = rig.ask()
        rig.run(0.5)
        transport.disconnect(notify=False)  # RPEngine busy elsewhere for a moment
        waiting = rig.ask("And the road south?")
        rig.run(0.2)
        rig.kill()
        events = captureLogEvents(self)
        again = Rig(self, root=rig.root, clock=rig.clock)
        [found] = [e for e in events if "found" in e and "removed" in e]
        self.assertGreaterEqual(found["found"], 1)  # the waiting request, at least
        transport.connected = True
        transport.poll()
        again.run(12.0)
        self.assertEqual(engine.processed[first.requestId], 1)
        self.assertEqual(engine.processed[waiting.requestId], 1)
        self.assertEqual(len(engine.duplicates), 0)
        self.assertIsNotNone(again.middleware.link.session)
        third = again.ask("Still there?")
        again.run(4.0)
        self.assertEqual(typeOf(ending(third)), "reply.completed")
        self.assertEqual(transport.peerInstanceId, again.endpoint.ledger.peerInstanceId)
        self.assertNotEqual(rig.endpoint, again.endpoint)
        self.assertEqual(transport.errors, [])

    def test_rpengineRestartMidTurn(self) -> None:
        """
        RPEngine's tab dies mid-turn and a new one opens: the turn it had
        accepted ends with a retryable engine_disconnected; a request that
        was waiting unread in the folder is played once, by the new tab,
        and answered to its caller.
        """
        rig = Rig(self)
        engine = rig.engine(tokensPerSecond=20.0)
        first = rig.ask()
        rig.run(0.5)
        engine.disconnect()
        waiting = rig.ask("And the road south?")
        rig.run(1.0)
        second = rig.engine()
        rig.run(6.0)
        error = ending(first)
        self.assertEqual(error.type, "request.error")
        self.assertEqual((error["code"], error["retryable"]), ("engine_disconnected", True))
        self.assertEqual(typeOf(ending(waiting)), "reply.completed")
        self.assertEqual(dict(second.processed), {waiting.requestId: 1})
        self.assertNotIn(waiting.requestId, engine.processed)

    def test_retransmitGivesUp(self) -> None:
        """
        A read message never acknowledged is written again at most
        max_retransmits times.
        """
        rig = Rig(self)
        engine = rig.engine()
        engine._transportMessage = lambda fields: None  # type: ignore[method-assign]
        # An RPEngine that reads and never answers is judged gone by the
        # reader watch (test_mailbox_reader); here only the session's own
        # retransmission is looked at.
        rig.endpoint.watch.check = lambda session: None
        rig.ask()
        rig.run(30.0)
        session = rig.middleware.link.session
        assert session is not None
        self.assertEqual(session.unacknowledged(), [])


class HostileFileTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events = captureLogEvents(self)
        self.rig = Rig(self)
        self.engine = self.rig.engine()
        session = self.rig.middleware.link.session
        assert session is not None
        self.sessionId = str(session.sessionId)

    def refusals(self) -> list[str]:
        return [
            f"{e.get('name')}: {e.get('reason')}"
            for e in self.events
            if e.get("log_format", "").startswith("refused")
        ]

    def assertStillWorks(self) -> None:
        turn = self.rig.ask()
        self.rig.run(4.0)
        self.assertEqual(typeOf(ending(turn)), "reply.completed")

    def assertRefusedOnce(self, fragment: str, leftover: list[str] | None = None) -> None:
        self.rig.run(1.0)
        found = [r for r in self.refusals() if fragment in r]
        self.assertEqual(len(found), 1, self.refusals())
        self.assertEqual(self.rig.files(FROM_ENGINE), leftover or [])
        self.assertStillWorks()

    def test_markerWithoutJson(self) -> None:
        self.rig.drop("0000000000001-lonely.ready", b"")
        self.assertRefusedOnce("without its JSON")

    def test_halfWritten(self) -> None:
        """
        A JSON still being written has no marker, and is not read; a marker
        over a cut-off JSON is refused.
        """
        self.rig.drop("0000000000001-writing.json", b'{"protocol":"gemtavern.rp_eng')
        self.rig.run(1.0)
        self.assertEqual(self.rig.files(FROM_ENGINE), ["0000000000001-writing.json"])
        self.rig.drop("0000000000002-cut.json", b'{"protocol":"gemtavern.rp_eng')
        self.rig.drop("0000000000002-cut.ready", b"")
        self.assertRefusedOnce("not valid JSON", ["0000000000001-writing.json"])

    def test_notAnEnvelope(self) -> None:
        for index, body in enumerate((b"[1, 2]", b'{"hello": true}', b'"text"')):
            stem = f"000000000000{index}-thing{index}"
            self.rig.drop(stem + ".json", body)
            self.rig.drop(stem + ".ready", b"")
        self.rig.run(1.0)
        self.assertEqual(len([r for r in self.refusals() if "not an envelope" in r]), 3)
        self.assertStillWorks()

    def test_wrongNames(self) -> None:
        messageId, body = envelopeBytes("capacity.update", self.sessionId, queueDepth=0)
        self.rig.drop("junk.ready", b"")
        self.rig.drop("0000000000001-other.json", body)
        self.rig.drop("0000000000001-other.ready", b"")
        self.rig.run(1.0)
        self.assertTrue([r for r in self.refusals() if "junk.ready" in r])
        self.assertTrue([r for r in self.refusals() if "not the one its name says" in r])
        self.assertEqual(self.rig.files(FROM_ENGINE), [])
        self.assertStillWorks()

    def test_symbolicLink(self) -> None:
        secret = os.path.abspath(self.mktemp())
        messageId, body = envelopeBytes("capacity.update", self.sessionId)
        with open(secret, "wb") as f:
            f.write(body)
        os.symlink(
            secret, os.path.join(self.rig.root, FROM_ENGINE, f"0000000000001-{messageId}.json")
        )
        self.rig.drop(f"0000000000001-{messageId}.ready", b"")
        self.assertRefusedOnce("symbolic link")
        self.assertTrue(os.path.exists(secret))

    def test_tooLarge(self) -> None:
        path = os.path.join(self.rig.root, FROM_ENGINE, "0000000000001-huge.json")
        with open(path, "wb") as f:
            f.truncate(8 * 1024 * 1024 + 1)
        self.rig.drop("0000000000001-huge.ready", b"")
        self.assertRefusedOnce("RPEngine's messages are at most 8388608 bytes")

    def segment(self, path: str, slot: int = 3) -> None:
        messageId, body = envelopeBytes(
            "reply.audio.segment",
            self.sessionId,
            requestId="r-hostile",
            segmentSequence=0,
            slotIndex=slot,
            path=path,
            format="wav_pcm_s16le",
            sampleRate=44100,
            channels=1,
        )
        self.rig.drop(f"0000000000001-{messageId}.json", body)
        self.rig.drop(f"0000000000001-{messageId}.ready", b"")

    def test_segmentPathsOutside(self) -> None:
        """
        A segment whose path leaves the audio folder, names another file, or
        is a link is refused (that phrase is not played); the slot is still
        answered, so RPEngine puts silence back.
        """
        outside = os.path.abspath(self.mktemp())
        with open(outside, "wb") as f:
            f.write(b"secret")
        for path in (
            "../manifest.json",
            outside,
            "audio/../../../etc/passwd",
            "audio/slot_0004.wav",
        ):
            self.segment(path)
        link = os.path.join(self.rig.root, "audio", "slot_0005.wav")
        os.unlink(link)
        os.symlink(outside, link)
        self.segment("audio/slot_0005.wav", slot=5)
        self.rig.run(1.0)
        refused = [e for e in self.events if e.get("log_format", "").startswith("refused audio")]
        self.assertEqual(len(refused), 5)
        reasons = " ".join(str(e["reason"]) for e in refused)
        self.assertEqual(reasons.count("leaves the audio folder"), 3)
        self.assertIn("not 'audio/slot_0003.wav'", reasons)
        self.assertIn("symbolic link", reasons)
        consumed = [
            m["slotIndex"]
            for m in self.engine.receivedMessages
            if m["type"] == "reply.audio.segment.consumed"
        ]
        self.assertEqual(sorted(consumed), [3, 3, 3, 3, 5])
        with open(outside, "rb") as f:
            self.assertEqual(f.read(), b"secret")
        self.assertStillWorks()

    def test_badWav(self) -> None:
        with open(os.path.join(self.rig.root, "audio", "slot_0003.wav"), "wb") as f:
            f.write(b"RIFF\x00\x00\x00\x00WAVEjunk")
        self.segment("audio/slot_0003.wav")
        self.rig.run(1.0)
        [refused] = [e for e in self.events if e.get("log_format", "").startswith("refused audio")]
        self.assertIn("no data chunk", refused["reason"])
        self.assertStillWorks()

    def test_ourFolderCleanedAtStart(self) -> None:
        """
        Our own folder may hold what RPEngine would choke on (a marker with
        no JSON stops its reader for good): start-up removes it, keeps what
        is whole, and drops our old acks.
        """
        self.rig.kill()
        outbox = os.path.join(self.rig.root, TO_ENGINE)
        open(os.path.join(outbox, "0000000000001-lonely.ready"), "wb").close()
        open(os.path.join(outbox, "junk.ready"), "wb").close()
        fd = os.open(outbox, os.O_RDONLY | os.O_DIRECTORY)
        ackId, ack = envelopeBytes("ack", None, acknowledgedMessageId="x")
        keptId, kept = envelopeBytes("request.cancel", None, requestId="r")
        for stem, body in ((f"0000000000002-{ackId}", ack), (f"0000000000003-{keptId}", kept)):
            writeAtomic(fd, stem + ".json", body)
            writeAtomic(fd, stem + ".ready", b"")
        os.close(fd)
        again = Rig(self, root=self.rig.root, clock=self.rig.clock, adopt=False)
        self.assertEqual(len(again.endpoint.outbox), 1)
        self.assertEqual(
            again.files(TO_ENGINE),
            [f"0000000000003-{keptId}.json", f"0000000000003-{keptId}.ready"],
        )


class SlotTests(SynchronousTestCase):
    def test_renewedBeforeRunningOut(self) -> None:
        """
        Slots run low: once no turn is open, a fresh welcome gives RPEngine
        a new peer identity, and the next turn's phrases start at slot 0.
        """
        events = captureLogEvents(self)
        rig = Rig(self, slots=6)
        engine = rig.engine()
        transport = transportOf(engine)
        peer = transport.peerInstanceId
        first = rig.ask()
        rig.run(3.0)
        self.assertEqual(typeOf(ending(first)), "reply.completed")
        self.assertEqual(transport.peerInstanceId, peer)
        second = rig.ask()
        rig.run(3.0)
        used = len(transport.segments)
        self.assertGreater(used, 5)
        rig.run(2.0)
        self.assertNotEqual(transport.peerInstanceId, peer)
        self.assertEqual(transport.peerInstanceId, rig.endpoint.ledger.peerInstanceId)
        renewed = [e for e in events if "new peer identity" in e.get("log_format", "")]
        self.assertEqual(len(renewed), 1)
        third = rig.ask()
        rig.run(3.0)
        self.assertEqual(typeOf(ending(third)), "reply.completed")
        self.assertIn("reply.audio.chunk", [e.type for e in third.envelopes])
        self.assertEqual(transport.segments[used]["requestId"], third.requestId)
        self.assertEqual(typeOf(ending(second)), "reply.completed")
        self.assertEqual(transport.errors, [])

    def test_exhaustedMidTurn(self) -> None:
        """
        A reply with more phrases than slots: RPEngine ends it with
        audio_transport_failed, the log says why speech stopped, and the
        next turn speaks again under a new identity.
        """
        events = captureLogEvents(self)
        rig = Rig(self, slots=2)
        engine = rig.engine()
        first = rig.ask()
        rig.run(3.0)
        error = ending(first)
        self.assertEqual((error.type, error["code"]), ("request.error", "audio_transport_failed"))
        [stopped] = [e for e in events if "stopped speaking" in e.get("log_format", "")]
        self.assertEqual(stopped["requestId"], first.requestId)
        rig.run(2.0)
        second = rig.ask("Hello.")
        rig.run(3.0)
        self.assertEqual(typeOf(ending(second)), "reply.completed")
        self.assertIn("reply.audio.chunk", [e.type for e in second.envelopes])
        self.assertEqual(transportOf(engine).errors, [])
