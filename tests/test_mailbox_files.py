"""
The file mailbox's files (rpmiddleware/engine/mailbox/files.py, audioslots.py):
stems, atomic writes, scans, refusals, clean-up, WAV slots and the chunk
stream a phrase becomes.  Facts from RPEngine's file transport v1
(docs/file-transport-v1.md, src/filesystem-mailbox-adapter.ts,
src/socket-adapter.ts).
"""

from __future__ import annotations

import base64
import os
import stat
import struct
import time
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.engine.mailbox import files as mb
from rpmiddleware.engine.mailbox.audioslots import (
    PCM_CHUNK_BYTES,
    AudioLayout,
    SegmentStream,
    SlotLedger,
    WavAudio,
    createSlots,
    parseWav,
    pcm16Wav,
    readSlot,
    silentSlot,
    slotNameOf,
)
from rpmiddleware.protocol.envelope import Envelope


class FolderCase(SynchronousTestCase):
    def folder(self, mode: int = 0o700) -> tuple[str, int]:
        path = os.path.abspath(self.mktemp())
        os.mkdir(path, mode)
        os.chmod(path, mode)
        fd = mb.openDirectory(path)
        self.addCleanup(os.close, fd)
        return path, fd


class StemTests(SynchronousTestCase):
    def test_parse(self) -> None:
        self.assertEqual(
            mb.parseStem("1767225600000-0b5c8c2e-9d4f-4c1e-8f0a-3e2d1c0b9a87"),
            (1767225600000, "0b5c8c2e-9d4f-4c1e-8f0a-3e2d1c0b9a87"),
        )
        for name in (
            "176722560000-x",  # 12 digits
            "1767225600000x-y",
            "1767225600000-",
            "1767225600000-../../etc",
            "1767225600000-a/b",
            "1767225600000-a.json",
            "junk",
            "",
        ):
            self.assertIsNone(mb.parseStem(name), name)

    def test_make(self) -> None:
        self.assertEqual(mb.makeStem(42, "abc"), "0000000000042-abc")
        self.assertRaises(ValueError, mb.makeStem, 1, "../x")

    def test_clockOrders(self) -> None:
        """
        Stems in one millisecond still sort in the order they were made
        (RPEngine's nextStem does the same).
        """
        clock = mb.StemClock(now=lambda: 1.0)
        stems = [clock.next(f"m{i}") for i in range(3)]
        self.assertEqual(stems, ["0000000001000-m0", "0000000001001-m1", "0000000001002-m2"])
        self.assertEqual(sorted(stems), stems)


class WriteTests(FolderCase):
    def test_envelope(self) -> None:
        """
        An envelope is its JSON and an empty .ready, both readable by the
        owner alone; no temporary file is left.
        """
        path, fd = self.folder()
        mb.writeEnvelope(fd, "0000000000001-m", b'{"a":1}')
        self.assertEqual(
            sorted(os.listdir(path)), ["0000000000001-m.json", "0000000000001-m.ready"]
        )
        with open(os.path.join(path, "0000000000001-m.json"), "rb") as f:
            self.assertEqual(f.read(), b'{"a":1}')
        for name in os.listdir(path):
            self.assertEqual(stat.S_IMODE(os.stat(os.path.join(path, name)).st_mode), 0o600)

    def test_markerOnlyAfterJson(self) -> None:
        """
        A write that fails while the JSON is written (the disk is full, or
        the process dies there) leaves no marker: nothing a reader would
        read half.
        """
        path, fd = self.folder()
        calls: list[str] = []
        real = os.fsync

        def failingFsync(descriptor: int) -> None:
            calls.append("fsync")
            if len(calls) == 1:
                raise OSError(28, "No space left on device")
            real(descriptor)

        self.patch(mb.os, "fsync", failingFsync)
        self.assertRaises(OSError, mb.writeEnvelope, fd, "0000000000001-m", b"{}")
        self.assertEqual(os.listdir(path), [])

    def test_killedMidWriteLeavesOnlyATemporary(self) -> None:
        """
        A process killed after writing the temporary file leaves only that
        (a name no reader looks at), and start-up removes it.
        """
        path, fd = self.folder()

        def killed(*args: Any, **kwargs: Any) -> None:
            raise KeyboardInterrupt("killed")

        self.patch(mb.os, "replace", killed)
        self.assertRaises(KeyboardInterrupt, mb.writeAtomic, fd, "0000000000001-m.json", b"{")
        # writeAtomic cleans up even then; a real SIGKILL would not.
        with open(os.path.join(path, ".rpmiddleware-dead.tmp"), "wb") as f:
            f.write(b'{"half')
        scan = mb.scanReady(fd, 10)
        self.assertEqual((scan.stems, scan.strangers), ([], []))
        self.assertEqual(mb.removeTemporaries(fd), 1)
        self.assertEqual(os.listdir(path), [])

    def test_replaceIsAtomic(self) -> None:
        path, fd = self.folder()
        mb.writeAtomic(fd, "manifest.json", b"old")
        mb.writeAtomic(fd, "manifest.json", b"new")
        with open(os.path.join(path, "manifest.json"), "rb") as f:
            self.assertEqual(f.read(), b"new")
        self.assertEqual(os.listdir(path), ["manifest.json"])

    def test_removePairMarkerFirst(self) -> None:
        path, fd = self.folder()
        mb.writeEnvelope(fd, "0000000000001-m", b"{}")
        removed: list[str] = []
        real = os.unlink

        def unlink(name: str, **kwargs: Any) -> None:
            removed.append(name)
            real(name, **kwargs)

        self.patch(mb.os, "unlink", unlink)
        mb.removePair(fd, "0000000000001-m")
        self.assertEqual(removed, ["0000000000001-m.ready", "0000000000001-m.json"])
        mb.removePair(fd, "0000000000001-m")  # already gone: no error


class ScanTests(FolderCase):
    def test_orderAndLimit(self) -> None:
        path, fd = self.folder()
        for stem in ("0000000000003-c", "0000000000001-a", "0000000000002-b"):
            mb.writeEnvelope(fd, stem, b"{}")
        # Unmarked JSON, a swap file, and a marker that is no stem.
        for name in ("0000000000000-z.json", "x.json.crswap", "junk.ready"):
            with open(os.path.join(path, name), "wb"):
                pass
        scan = mb.scanReady(fd, 2)
        self.assertEqual(scan.stems, ["0000000000001-a", "0000000000002-b"])
        self.assertEqual(scan.strangers, ["junk.ready"])
        self.assertEqual(scan.total, 3)


class ReadTests(FolderCase):
    def assertRefused(self, fd: int, stem: str, fragment: str) -> None:
        with self.assertRaises(mb.Refused) as caught:
            mb.readEnvelopeBytes(fd, stem)
        self.assertIn(fragment, caught.exception.reason)

    def test_read(self) -> None:
        path, fd = self.folder()
        mb.writeEnvelope(fd, "0000000000001-m", b'{"type":"hello"}')
        self.assertEqual(mb.readEnvelopeBytes(fd, "0000000000001-m"), b'{"type":"hello"}')

    def test_markerWithoutJson(self) -> None:
        path, fd = self.folder()
        open(os.path.join(path, "0000000000001-m.ready"), "wb").close()
        self.assertRefused(fd, "0000000000001-m", "without its JSON")

    def test_symbolicLinks(self) -> None:
        path, fd = self.folder()
        secret = os.path.abspath(self.mktemp())
        with open(secret, "w") as f:
            f.write('{"type":"hello"}')
        os.symlink(secret, os.path.join(path, "0000000000001-m.json"))
        open(os.path.join(path, "0000000000001-m.ready"), "wb").close()
        self.assertRefused(fd, "0000000000001-m", "symbolic link")
        open(os.path.join(path, "0000000000002-m.json"), "wb").close()
        os.symlink(secret, os.path.join(path, "0000000000002-m.ready"))
        self.assertRefused(fd, "0000000000002-m", "symbolic link")

    def test_notARegularFile(self) -> None:
        path, fd = self.folder()
        os.mkdir(os.path.join(path, "0000000000001-m.json"))
        open(os.path.join(path, "0000000000001-m.ready"), "wb").close()
        self.assertRefused(fd, "0000000000001-m", "not a regular file")

    def test_tooLarge(self) -> None:
        path, fd = self.folder()
        with open(os.path.join(path, "0000000000001-m.json"), "wb") as f:
            f.truncate(mb.MAX_ENVELOPE_BYTES + 1)
        open(os.path.join(path, "0000000000001-m.ready"), "wb").close()
        self.assertRefused(fd, "0000000000001-m", "at most 8388608 bytes")
        self.assertRefused(fd, "0000000000001-m", str(mb.MAX_ENVELOPE_BYTES + 1))


class CleanupTests(FolderCase):
    def test_stale(self) -> None:
        """
        Files older than a day go (each marker before its JSON); newer ones
        and folders stay.
        """
        path, fd = self.folder()
        mb.writeEnvelope(fd, "0000000000001-old", b"{}")
        mb.writeEnvelope(fd, "0000000000002-new", b"{}")
        os.mkdir(os.path.join(path, "sub"))
        now = time.time()
        day = now - mb.STALE_SECONDS - 5
        for name in ("0000000000001-old.json", "0000000000001-old.ready"):
            os.utime(os.path.join(path, name), (day, day))
        self.assertEqual(mb.removeStale(fd, now), 2)
        self.assertEqual(
            sorted(os.listdir(path)), ["0000000000002-new.json", "0000000000002-new.ready", "sub"]
        )


class DirectoryTests(SynchronousTestCase):
    def assertRefused(self, path: str, fragment: str) -> None:
        with self.assertRaises(mb.MailboxError) as caught:
            mb.checkDirectory(path, "mailbox folder")
        self.assertIn(fragment, str(caught.exception))

    def test_worldWritable(self) -> None:
        path = os.path.abspath(self.mktemp())
        os.mkdir(path)
        os.chmod(path, 0o777)
        self.assertRefused(path, "writable by every user")
        self.assertRefused(path, "chmod o-w")
        os.chmod(path, 0o700)
        mb.checkDirectory(path, "mailbox folder")

    def test_symbolicLink(self) -> None:
        real = os.path.abspath(self.mktemp())
        os.mkdir(real, 0o700)
        link = os.path.abspath(self.mktemp())
        os.symlink(real, link)
        self.assertRefused(link, "symbolic link")

    def test_someoneElses(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("only root can give a folder to another user")
        path = os.path.abspath(self.mktemp())
        os.mkdir(path, 0o700)
        os.chown(path, 54321, 54321)
        self.assertRefused(path, "belongs to user 54321")

    def test_notAFolder(self) -> None:
        path = os.path.abspath(self.mktemp())
        open(path, "w").close()
        self.assertRefused(path, "is not a folder")
        self.assertRefused(path + "-missing", "does not exist")

    def test_ensureMakesPrivate(self) -> None:
        path = os.path.abspath(self.mktemp())
        mb.ensureDirectory(path, "mailbox folder")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode) & 0o077, 0)


class WavTests(SynchronousTestCase):
    def test_roundTrip(self) -> None:
        """
        RPEngine's WAV layout (its pcm16Wav test): RIFF, WAVE, PCM, mono,
        the rate, 16 bits, the data length, the samples.
        """
        wav = pcm16Wav(bytes([0x34, 0x12, 0xCC, 0xED]), 44100)
        self.assertEqual((wav[:4], wav[8:12]), (b"RIFF", b"WAVE"))
        self.assertEqual(struct.unpack_from("<HHI", wav, 20), (1, 1, 44100))
        self.assertEqual(struct.unpack_from("<H", wav, 34)[0], 16)
        self.assertEqual(struct.unpack_from("<I", wav, 40)[0], 4)
        self.assertEqual(parseWav(wav), WavAudio(44100, 1, bytes([0x34, 0x12, 0xCC, 0xED])))
        self.assertEqual(parseWav(silentSlot()).pcm, b"\x00\x00")

    def test_otherChunksSkipped(self) -> None:
        wav = pcm16Wav(b"\x01\x00", 22050)
        extra = b"LIST" + struct.pack("<I", 3) + b"abc\x00"
        mixed = wav[:12] + extra + wav[12:]
        self.assertEqual(parseWav(mixed), WavAudio(22050, 1, b"\x01\x00"))

    def test_refused(self) -> None:
        good = pcm16Wav(b"\x01\x00\x02\x00", 44100)
        float32 = bytearray(good)
        struct.pack_into("<H", float32, 20, 3)
        cut = good[:-2]
        for data, fragment in (
            (b"", "not a RIFF"),
            (b"RIFX" + good[4:], "not a RIFF"),
            (bytes(float32), "not PCM16"),
            (cut, "holds 2"),
            (good[:36], "no data chunk"),
        ):
            with self.assertRaises(mb.Refused) as caught:
                parseWav(data)
            self.assertIn(fragment, caught.exception.reason)


class SlotTests(FolderCase):
    def test_createSlots(self) -> None:
        """
        Every slot exists, silent, owner-only; existing slots are kept and a
        link planted as a slot is replaced, not followed.
        """
        path, fd = self.folder()
        layout = AudioLayout(slotCount=4)
        self.assertEqual(createSlots(fd, layout), (4, 0))
        self.assertEqual(sorted(os.listdir(path)), [f"slot_{i:04d}.wav" for i in range(4)])
        with open(os.path.join(path, "slot_0002.wav"), "rb") as f:
            self.assertEqual(f.read(), silentSlot())
        self.assertEqual(stat.S_IMODE(os.stat(os.path.join(path, "slot_0000.wav")).st_mode), 0o600)
        target = os.path.abspath(self.mktemp())
        with open(target, "wb") as f:
            f.write(b"precious")
        os.unlink(os.path.join(path, "slot_0001.wav"))
        os.symlink(target, os.path.join(path, "slot_0001.wav"))
        self.assertEqual(createSlots(fd, layout), (1, 1))
        self.assertFalse(os.path.islink(os.path.join(path, "slot_0001.wav")))
        with open(target, "rb") as f:
            self.assertEqual(f.read(), b"precious")

    def test_slotNames(self) -> None:
        layout = AudioLayout(slotCount=2048)
        self.assertEqual(layout.slotName(7), "slot_0007.wav")
        self.assertEqual(slotNameOf(layout, "audio/slot_0007.wav", 7), "slot_0007.wav")
        self.assertEqual(
            layout.manifestBlock(),
            {
                "format": "wav_pcm_s16le",
                "directory": "audio",
                "slotPattern": "slot_%04d.wav",
                "slotCount": 2048,
                "sampleRate": 44100,
                "channels": 1,
            },
        )

    def test_pathsRefused(self) -> None:
        """
        A segment's path must be exactly its slot in the audio folder:
        anything leaving the folder, or naming another file, is refused.
        """
        layout = AudioLayout(slotCount=8)
        for path, slot, fragment in (
            ("../secret.wav", 1, "leaves the audio folder"),
            ("audio/../../etc/passwd", 1, "leaves the audio folder"),
            ("/etc/passwd", 1, "leaves the audio folder"),
            ("C:\\Windows\\x.wav", 1, "leaves the audio folder"),
            ("audio/slot_0002.wav", 1, "not 'audio/slot_0001.wav'"),
            ("audio/manifest.json", 1, "not 'audio/slot_0001.wav'"),
            ("audio/slot_0008.wav", 8, "not one of the 8 slots"),
            ("audio/slot_-001.wav", -1, "not one of the 8 slots"),
        ):
            with self.assertRaises(mb.Refused) as caught:
                slotNameOf(layout, path, slot)
            self.assertIn(fragment, caught.exception.reason, path)

    def test_readSlotRefusesLinks(self) -> None:
        path, fd = self.folder()
        createSlots(fd, AudioLayout(slotCount=1))
        self.assertEqual(readSlot(fd, "slot_0000.wav"), silentSlot())
        os.unlink(os.path.join(path, "slot_0000.wav"))
        os.symlink("/etc/hostname", os.path.join(path, "slot_0000.wav"))
        with self.assertRaises(mb.Refused) as caught:
            readSlot(fd, "slot_0000.wav")
        self.assertIn("symbolic link", caught.exception.reason)

    def test_ledger(self) -> None:
        ledger = SlotLedger(4)
        first = ledger.peerInstanceId
        self.assertEqual(ledger.welcomeFields(), {"peerInstanceId": first, "nextAudioSlot": 0})
        ledger.used(2)
        ledger.used(0)
        self.assertEqual((ledger.nextSlot, ledger.remaining, ledger.exhausted), (3, 1, False))
        ledger.used(3)
        self.assertTrue(ledger.exhausted)
        ledger.renew()
        self.assertNotEqual(ledger.peerInstanceId, first)
        self.assertEqual((ledger.nextSlot, ledger.exhausted), (0, False))


class SegmentStreamTests(SynchronousTestCase):
    def segment(self, sequence: int) -> Envelope:
        return Envelope.build("reply.audio.segment", "s", requestId="r", segmentSequence=sequence)

    def test_likeTheSocketAdapter(self) -> None:
        """
        Start once per request, then 32 KiB chunks numbered across the
        request, each segment's chunks counted (src/socket-adapter.ts).
        """
        stream = SegmentStream()
        pcm0 = bytes(range(256)) * 300  # 76800 bytes: 3 chunks
        pcm1 = b"\x01\x00" * 100  # 1 chunk
        first = stream.envelopes(self.segment(0), WavAudio(44100, 1, pcm0), "s")
        second = stream.envelopes(self.segment(1), WavAudio(44100, 1, pcm1), "s")
        self.assertEqual([e.type for e in first], ["reply.audio.start"] + ["reply.audio.chunk"] * 3)
        self.assertEqual(
            {k: first[0][k] for k in ("requestId", "format", "sampleRate", "channels")},
            {"requestId": "r", "format": "pcm_s16le", "sampleRate": 44100, "channels": 1},
        )
        chunks = first[1:] + second
        self.assertEqual(
            [(c["sequence"], c["segmentSequence"], c["segmentChunkSequence"]) for c in chunks],
            [(0, 0, 0), (1, 0, 1), (2, 0, 2), (3, 1, 0)],
        )
        self.assertEqual([c["segmentChunkCount"] for c in chunks], [3, 3, 3, 1])
        data = b"".join(base64.b64decode(c["data"]) for c in first[1:])
        self.assertEqual(data, pcm0)
        self.assertEqual(len(base64.b64decode(first[1]["data"])), PCM_CHUNK_BYTES)
        self.assertTrue(all(e.sessionId == "s" for e in chunks))

    def test_forgottenAtTheEnd(self) -> None:
        stream = SegmentStream()
        stream.envelopes(self.segment(0), WavAudio(44100, 1, b"\x00\x00"), "s")
        self.assertEqual(len(stream), 1)
        stream.passed(Envelope.build("reply.completed", "s", requestId="r"))
        self.assertEqual(len(stream), 0)
        again = stream.envelopes(self.segment(0), WavAudio(44100, 1, b"\x00\x00"), "s")
        self.assertEqual(again[0].type, "reply.audio.start")

    def test_startFromRPEngine(self) -> None:
        """
        A reply.audio.start RPEngine sent itself counts: none is added.
        """
        stream = SegmentStream()
        stream.passed(Envelope.build("reply.audio.start", "s", requestId="r"))
        made = stream.envelopes(self.segment(0), WavAudio(44100, 1, b"\x00\x00"), "s")
        self.assertEqual([e.type for e in made], ["reply.audio.chunk"])
