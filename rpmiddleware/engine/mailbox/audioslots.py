"""
The audio half of the file mailbox: WAV slots, and each phrase RPEngine
puts in one turned into the speech stream the WebSocket carries.

In file mode RPEngine does not send C{reply.audio.start} and 32 KiB
C{reply.audio.chunk}s: it writes each synthesised phrase as one mono PCM16
WAV into the next pre-made slot file and sends C{reply.audio.segment}
naming it (C{src/filesystem-mailbox-adapter.ts} C{sendAudioNow}); the game
answers C{reply.audio.segment.consumed}, and RPEngine puts silence back.
A slot is never written twice for one C{peerInstanceId}; when they run out,
RPEngine refuses audio with C{audio_transport_failed} and strips it from
later requests until a C{welcome} brings a new peer identity
(C{docs/file-transport-v1.md}, C{src/app-host.ts}).

L{SegmentStream} makes the phrase into exactly what RPEngine's socket
adapter would have sent (C{src/socket-adapter.ts} C{sendAudioSegment}):
C{reply.audio.start} before a request's first audio, then 32 KiB chunks
numbered by C{sequence} (across the request), C{segmentSequence},
C{segmentChunkSequence} and C{segmentChunkCount}; so every plugin, the
resampler and every client see one stream whichever way RPEngine came.
"""

from __future__ import annotations

import os
import stat
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from rpmiddleware.audio.format import encodeBase64, pcm16Wav
from rpmiddleware.engine.mailbox.files import FILE_MODE, Refused, readRegularFile
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import OUTPUT_SAMPLE_RATE, PCM_CHUNK_BYTES
from rpmiddleware.protocol.meta import SPOKEN_TEXT

WAV_FORMAT = "wav_pcm_s16le"
AUDIO_DIRECTORY = "audio"
SLOT_PATTERN = "slot_%04d.wav"
#: As many as RPEngine's documentation and its mock game make.
DEFAULT_SLOT_COUNT = 2048
#: RPEngine's speech is 44.1 kHz mono PCM16 (app.rs tts_completed).
SAMPLE_RATE = OUTPUT_SAMPLE_RATE
#: A phrase's WAV is read whole; a sentence of speech is a few hundred KB,
#: and three minutes of it 16 MB.
MAX_SLOT_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class AudioLayout:
    """
    The manifest's C{audio} block: where the slots are and what they hold.
    """

    slotCount: int = DEFAULT_SLOT_COUNT
    directory: str = AUDIO_DIRECTORY
    slotPattern: str = SLOT_PATTERN
    sampleRate: int = SAMPLE_RATE

    def slotName(self, index: int) -> str:
        # RPEngine fills in the pattern's %04d with the index padded to four
        # digits (sendAudioNow); Python's %04d writes the same.
        return self.slotPattern % index

    def manifestBlock(self) -> dict[str, Any]:
        return {
            "format": WAV_FORMAT,
            "directory": self.directory,
            "slotPattern": self.slotPattern,
            "slotCount": self.slotCount,
            "sampleRate": self.sampleRate,
            "channels": 1,
        }


def silentSlot(sampleRate: int = SAMPLE_RATE) -> bytes:
    """
    What an unused slot holds: one silent sample (RPEngine's placeholder).
    """
    return pcm16Wav(b"\x00\x00", sampleRate)


@dataclass(frozen=True)
class WavAudio:
    sampleRate: int
    channels: int
    pcm: bytes


def parseWav(data: bytes) -> WavAudio:
    """
    The PCM16 of a RIFF WAV, however its chunks are laid out.

    @raise Refused: not a PCM16 WAV, or cut short.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise Refused("the slot file is not a RIFF WAVE file")
    offset = 12
    fmt: tuple[int, int, int, int] | None = None
    while offset + 8 <= len(data):
        kind = data[offset : offset + 4]
        (size,) = struct.unpack_from("<I", data, offset + 4)
        body = offset + 8
        if kind == b"fmt ":
            if size < 16 or body + 16 > len(data):
                raise Refused("the WAV's fmt chunk is cut short")
            audioFormat, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, body)
            fmt = (audioFormat, channels, rate, bits)
        elif kind == b"data":
            if fmt is None:
                raise Refused("the WAV has data before its fmt chunk")
            audioFormat, channels, rate, bits = fmt
            if audioFormat != 1 or bits != 16 or channels < 1:
                raise Refused(
                    f"the WAV is not PCM16 (format {audioFormat}, {bits} bits, {channels} channels)"
                )
            if body + size > len(data):
                raise Refused(f"the WAV says {size} bytes of audio but holds {len(data) - body}")
            pcm = data[body : body + size]
            if len(pcm) % (2 * channels):
                raise Refused("the WAV's audio is not whole samples")
            return WavAudio(rate, channels, pcm)
        offset = body + size + (size & 1)
    raise Refused("the WAV has no data chunk")


def createSlots(audio: int, layout: AudioLayout) -> tuple[int, int]:
    """
    Make every slot file RPEngine will write into (it opens them without
    creating them), silent, readable by you alone.  A slot that is a link or
    not a regular file is replaced.

    @param audio: a descriptor of the audio folder.
    @return: how many slots were made and how many of those replaced
        something that was no slot.
    """
    silence = silentSlot(layout.sampleRate)
    made = replaced = 0
    for index in range(layout.slotCount):
        name = layout.slotName(index)
        try:
            info = os.stat(name, dir_fd=audio, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None:
            if stat.S_ISREG(info.st_mode):
                continue
            if stat.S_ISDIR(info.st_mode):
                raise Refused(f"{name} in the audio folder is a folder, not a slot file")
            os.unlink(name, dir_fd=audio)
            replaced += 1
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, FILE_MODE, dir_fd=audio)
        try:
            os.write(fd, silence)
        finally:
            os.close(fd)
        made += 1
    return made, replaced


def slotNameOf(layout: AudioLayout, path: Any, slotIndex: int) -> str:
    """
    The slot file a C{reply.audio.segment} names, checked: its C{path} must
    be exactly the audio folder and the slot of its C{slotIndex} (as
    RPEngine writes it), so that no path may leave the audio folder.

    @raise Refused: naming what is wrong.
    """
    if not 0 <= slotIndex < layout.slotCount:
        raise Refused(f"slotIndex {slotIndex} is not one of the {layout.slotCount} slots")
    expected = f"{layout.directory}/{layout.slotName(slotIndex)}"
    if path == expected:
        return layout.slotName(slotIndex)
    text = str(path)[:200]
    parts = text.replace("\\", "/").split("/")
    if text.startswith(("/", "\\")) or ".." in parts or (len(text) > 1 and text[1] == ":"):
        raise Refused(f"path {text!r} leaves the audio folder")
    raise Refused(f"path {text!r} is not {expected!r}, the file of slot {slotIndex}")


def readSlot(audio: int, name: str) -> bytes:
    """
    The bytes of slot file C{name} in the audio folder (a descriptor); never
    through a link.

    @raise Refused: it is a link, not a regular file, missing or too large.
    """
    return readRegularFile(audio, name, MAX_SLOT_BYTES)


@dataclass
class SlotLedger:
    """
    Which slots this game process's peer identity has used.

    RPEngine writes slot after slot and never one twice for a
    C{peerInstanceId}; a C{welcome} tells it the identity and where to go on
    (C{nextAudioSlot}).  A new identity starts again at slot 0.
    """

    slotCount: int
    peerInstanceId: str = field(default_factory=lambda: f"rpmiddleware-{uuid.uuid4().hex}")
    nextSlot: int = 0

    def used(self, slotIndex: int) -> None:
        self.nextSlot = max(self.nextSlot, slotIndex + 1)

    @property
    def remaining(self) -> int:
        return max(0, self.slotCount - self.nextSlot)

    @property
    def exhausted(self) -> bool:
        return self.nextSlot >= self.slotCount

    def renew(self) -> None:
        self.peerInstanceId = f"rpmiddleware-{uuid.uuid4().hex}"
        self.nextSlot = 0

    def welcomeFields(self) -> dict[str, Any]:
        return {"peerInstanceId": self.peerInstanceId, "nextAudioSlot": self.nextSlot}


@dataclass
class _Speech:
    started: bool = False
    nextSequence: int = 0


class SegmentStream:
    """
    Turns each request's phrases into the chunk stream of RPEngine's socket
    adapter: C{reply.audio.start} once, then 32 KiB chunks numbered across
    the request.  One per mailbox endpoint; a request is forgotten when it
    ends.
    """

    #: What ends a request's audio (and the request).
    ENDS = frozenset({"reply.completed", "reply.cancelled", "request.error"})

    def __init__(self) -> None:
        self._speech: dict[str, _Speech] = {}

    def envelopes(
        self, segment: Envelope, audio: WavAudio, sessionId: str | None
    ) -> list[Envelope]:
        """
        The envelopes C{segment} stands for, in order.
        """
        requestId = str(segment.requestId)
        speech = self._speech.setdefault(requestId, _Speech())
        made: list[Envelope] = []
        if not speech.started:
            speech.started = True
            made.append(
                Envelope.build(
                    "reply.audio.start",
                    sessionId,
                    requestId=requestId,
                    format="pcm_s16le",
                    sampleRate=audio.sampleRate,
                    channels=audio.channels,
                )
            )
        pcm = audio.pcm
        count = -(-len(pcm) // PCM_CHUNK_BYTES)
        for index in range(count):
            part = pcm[index * PCM_CHUNK_BYTES : (index + 1) * PCM_CHUNK_BYTES]
            made.append(
                Envelope.build(
                    "reply.audio.chunk",
                    sessionId,
                    requestId=requestId,
                    sequence=speech.nextSequence + index,
                    segmentSequence=segment.get("segmentSequence"),
                    segmentChunkSequence=index,
                    segmentChunkCount=count,
                    data=encodeBase64(part),
                )
            )
        speech.nextSequence += count
        # What the segment says, which only this transport tells: for the
        # speech-marks plugin (meta spokenText on the segment's first chunk).
        spoken = segment.get("spokenText")
        chunks = [e for e in made if e.type == "reply.audio.chunk"]
        if isinstance(spoken, str) and chunks:
            chunks[0].meta[SPOKEN_TEXT] = spoken
        return made

    def passed(self, envelope: Envelope) -> None:
        """
        Note an envelope of RPEngine's that is not a segment: a request that
        ended is forgotten, and a C{reply.audio.start} RPEngine sent itself
        (a reply that made no audio at all) counts as the start.
        """
        requestId = envelope.requestId
        if requestId is None:
            return
        if envelope.type in self.ENDS:
            self._speech.pop(requestId, None)
        elif envelope.type == "reply.audio.start":
            self._speech.setdefault(requestId, _Speech()).started = True

    def forgetAll(self) -> None:
        self._speech.clear()

    def __len__(self) -> int:
        return len(self._speech)
