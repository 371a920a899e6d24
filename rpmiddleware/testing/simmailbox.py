"""
The simulated RPEngine over its file mailbox (file transport v1).

L{MailboxTransport} plays RPEngine's C{FileSystemMailboxAdapter}
(C{src/filesystem-mailbox-adapter.ts} in RPEngine's public source) around a
L{SimulatedEngine}, on a reactor or a L{Clock}, so the game side's mailbox
is tested against what RPEngine really does:

  - it reads C{manifest.json} and refuses one it does not support;
  - on connect it removes mailbox files older than a day, finds its own
    unacknowledged files again (removing its old acks), and says hello;
  - it polls the game's folder every 50 ms for two seconds after any
    traffic, else every 250 ms; it reads only C{.ready} stems in name order,
    refuses (and removes) a file over 8 MiB, hands each to the core and
    removes it; an unreadable one stops that poll (RPEngine's too);
  - it writes each envelope as C{<ms>-<messageId>.json} then C{.ready}
    (each through a temporary file renamed when closed, as the browser's
    writable streams do), removes its acks after two seconds, and removes
    its other files when the game acknowledges them;
  - it coalesces C{reply.text.delta} per request for up to 120 ms
    (renumbered from 0, flushed before that request's completion, error,
    cancellation or audio) and keeps only the newest
    C{voice.capture.level} per 250 ms (dropped at the request's next
    message);
  - it writes each phrase as a WAV into the next slot file (which must
    exist), sends C{reply.audio.segment}, puts silence back on
    C{reply.audio.segment.consumed}, takes C{peerInstanceId} and
    C{nextAudioSlot} from C{welcome}, and when the slots run out refuses
    audio and strips it from the game's later requests.

    transport = MailboxTransport(reactor, "/path/to/mailbox")
    engine = yield transport.connect()
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from rpmiddleware.engine.mailbox.audioslots import PCM_CHUNK_BYTES, pcm16Wav
from rpmiddleware.protocol.envelope import PROTOCOL, PROTOCOL_VERSION, isoTimestamp
from rpmiddleware.protocol.messages import MAX_MESSAGE_BYTES
from rpmiddleware.testing.simengine import SimulatedEngine
from rpmiddleware.testing.simoptions import SimulatorOptions

MANIFEST_SCHEMA = "gemtavern.rp_engine.file_transport"
ACTIVE_POLL = 0.05
IDLE_POLL = 0.25
TEXT_DELTA_BATCH = 0.12
VOICE_LEVEL_BATCH = 0.25
ACK_REMOVAL = 2.0
ACTIVE_FOR = 2.0
STALE_SECONDS = 24 * 60 * 60
#: Types before which a request's pending text is flushed (isTextTerminal).
TEXT_TERMINAL = ("reply.text.completed", "reply.completed", "reply.cancelled", "request.error")


class ManifestRefused(Exception):
    pass


@dataclass
class _PendingText:
    sessionId: Any
    payload: dict[str, Any]
    delta: str
    timer: IDelayedCall


@dataclass
class _PendingLevel:
    payload: dict[str, Any]
    timer: IDelayedCall


def readyStems(names: list[str]) -> list[str]:
    return sorted(name[:-6] for name in names if name.endswith(".ready"))


def envelopeFor(type: str, sessionId: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """
    An envelope as RPEngine's adapters make one (src/protocol.ts
    clientEnvelope): the head, then the payload.
    """
    head: dict[str, Any] = {
        "protocol": PROTOCOL,
        "protocolVersion": PROTOCOL_VERSION,
        "type": type,
        "messageId": str(uuid.uuid4()),
        "sessionId": sessionId,
        "timestamp": isoTimestamp(),
    }
    head.update(payload)
    return head


def _writeLikeBrowser(path: str, data: bytes, exclusive: bool) -> None:
    """
    A browser writable stream: written to a swap file beside the target and
    moved over it when closed, so a reader sees the old file or the new.
    """
    if exclusive and os.path.lexists(path):
        raise FileExistsError(f"Mailbox file already exists: {os.path.basename(path)}")
    swap = path + ".crswap"
    with open(swap, "wb") as f:
        f.write(data)
    os.replace(swap, path)


def _removePair(directory: str, stem: str) -> None:
    for suffix in (".ready", ".json"):
        try:
            os.unlink(os.path.join(directory, stem + suffix))
        except OSError:
            pass


class MailboxTransport:
    """
    RPEngine's file mailbox adapter around a L{SimulatedEngine}.

    @ivar errors: what the adapter reported as errors (RPEngine shows them
        to the player), in order.
    @ivar written: every envelope written to the game, in order (after
        coalescing), for assertions.
    """

    def __init__(
        self,
        clock: IReactorTime,
        root: str,
        options: SimulatorOptions | None = None,
        engine: SimulatedEngine | None = None,
    ) -> None:
        self.clock = clock
        self.root = root
        self.engine = engine if engine is not None else SimulatedEngine(self.send, clock, options)
        self.engine._send = self.send
        self.engine.transportDisconnect = self._dropped
        self.engine.carrier = self
        self.engine.sendAudioSegment = self.sendAudioSegment
        self.errors: list[str] = []
        self.written: list[dict[str, Any]] = []
        #: Every phrase put in a slot (the core's segment, PCM included).
        self.segments: list[dict[str, Any]] = []
        self.connected = False
        self.manifest: dict[str, Any] = {}
        self.inbound = self.outbound = self.audio = ""
        self.nextSlot = 0
        self.peerInstanceId = ""
        self.audioExhausted = False
        self.outgoing: dict[str, str] = {}
        self._pendingText: dict[str, _PendingText] = {}
        self._pendingLevels: dict[str, _PendingLevel] = {}
        self._batchSequences: dict[str, int] = {}
        self._lastStamp = 0
        self._activeUntil = -1.0
        self._timer: IDelayedCall | None = None
        self._ackTimers: list[IDelayedCall] = []
        self._polling = False
        self.polls = 0

    # Connecting (connect, readManifest, cleanupStale, recoverOutgoing)

    def connect(self) -> Deferred[SimulatedEngine]:
        """
        Open the mailbox and say hello; fires with the engine once
        welcomed, or fails with L{ManifestRefused} (also in L{errors}) if
        the folder is not a mailbox RPEngine supports.
        """
        self.disconnect("Superseded connection", notify=False)
        try:
            self.manifest = self._readManifest()
            mailboxes = self.manifest["mailboxes"]
            self.inbound = self._folder(mailboxes["integrationToEngine"])
            self.outbound = self._folder(mailboxes["engineToIntegration"])
            self.audio = self._folder(self.manifest["audio"]["directory"])
        except (OSError, ValueError, KeyError, ManifestRefused) as e:
            self.errors.append(str(e))
            refused: Deferred[SimulatedEngine] = Deferred()
            refused.errback(ManifestRefused(str(e)))
            return refused
        self.connected = True
        self._cleanupStale()
        self.outgoing = self._recoverOutgoing()
        self._lastStamp = self._latestStamp(os.listdir(self.outbound))
        self.engine.connected()
        self._schedule(0)
        return self.engine.welcomed

    def _folder(self, name: str) -> str:
        path = os.path.join(self.root, name)
        if not os.path.isdir(path):
            raise ManifestRefused(f"the mailbox folder {name} is missing")
        return path

    def _readManifest(self) -> dict[str, Any]:
        with open(os.path.join(self.root, "manifest.json"), encoding="utf-8") as f:
            value = json.load(f)
        if value.get("schema") != MANIFEST_SCHEMA or value.get("version") != 1:
            raise ManifestRefused("Unsupported file-transport manifest")
        mailboxes, audio = value.get("mailboxes") or {}, value.get("audio") or {}
        if (
            not value.get("integrationId")
            or not mailboxes.get("integrationToEngine")
            or not mailboxes.get("engineToIntegration")
            or not audio.get("directory")
            or audio.get("format") != "wav_pcm_s16le"
            or audio.get("channels") != 1
            or not audio.get("slotCount", 0) >= 1
        ):
            raise ManifestRefused("Invalid file-transport manifest")
        return dict(value)

    def _cleanupStale(self) -> None:
        now = time.time()
        for directory in (self.inbound, self.outbound):
            for entry in os.scandir(directory):
                if entry.is_file() and now - entry.stat().st_mtime > STALE_SECONDS:
                    os.unlink(entry.path)

    def _recoverOutgoing(self) -> dict[str, str]:
        recovered: dict[str, str] = {}
        for stem in readyStems(os.listdir(self.outbound)):
            try:
                path = os.path.join(self.outbound, stem + ".json")
                if os.path.getsize(path) > MAX_MESSAGE_BYTES:
                    continue
                with open(path, encoding="utf-8") as f:
                    envelope = json.load(f)
                if envelope.get("type") == "ack":
                    _removePair(self.outbound, stem)
                    continue
                if isinstance(envelope.get("messageId"), str):
                    recovered[envelope["messageId"]] = stem
            except (OSError, ValueError, AttributeError):
                continue
        return recovered

    @staticmethod
    def _latestStamp(names: list[str]) -> int:
        latest = 0
        for name in names:
            head = name[:13]
            if head.isdigit():
                latest = max(latest, int(head))
        return latest

    def disconnect(self, reason: str = "", notify: bool = True) -> None:
        self.connected = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for pending in self._pendingText.values():
            if pending.timer.active():
                pending.timer.cancel()
        self._pendingText.clear()
        self._batchSequences.clear()
        for level in self._pendingLevels.values():
            if level.timer.active():
                level.timer.cancel()
        self._pendingLevels.clear()
        # RPEngine's tab would still remove its acks two seconds on; a
        # simulated one that went away leaves no timers behind in a test.
        for timer in self._ackTimers:
            if timer.active():
                timer.cancel()
        self._ackTimers = []
        if notify:
            self.engine.disconnected()

    def _dropped(self) -> None:
        """
        The tab went away (the engine's L{SimulatedEngine.disconnect}).
        """
        self.disconnect("closed", notify=True)

    # Writing (send, sendNow, nextStem, writeImmutable)

    def send(self, envelope: dict[str, Any]) -> None:
        kind = envelope["type"]
        requestId = envelope.get("requestId")
        requestId = requestId if isinstance(requestId, str) else None
        if kind == "voice.capture.level":
            self._bufferLevel(envelope)
            return
        if requestId:
            self._dropLevel(requestId)
        if kind == "reply.text.delta":
            self._bufferText(envelope)
            return
        if requestId and kind in TEXT_TERMINAL:
            self._flushText(requestId)
        self._write(envelope)
        if requestId and kind in TEXT_TERMINAL:
            self._batchSequences.pop(requestId, None)

    def _bufferText(self, envelope: dict[str, Any]) -> None:
        if not self.connected:
            return
        requestId, delta = envelope.get("requestId"), envelope.get("delta")
        if (
            not isinstance(requestId, str)
            or not requestId
            or not isinstance(delta, str)
            or not delta
        ):
            self._write(envelope)
            return
        pending = self._pendingText.get(requestId)
        if pending is not None:
            pending.delta += delta
            return
        timer = self.clock.callLater(TEXT_DELTA_BATCH, self._flushText, requestId)
        payload = {k: v for k, v in envelope.items() if k not in ("messageId", "timestamp")}
        self._pendingText[requestId] = _PendingText(
            envelope.get("sessionId"), payload, delta, timer
        )

    def _flushText(self, requestId: str) -> None:
        pending = self._pendingText.pop(requestId, None)
        if pending is None:
            return
        if pending.timer.active():
            pending.timer.cancel()
        sequence = self._batchSequences.get(requestId, 0)
        self._batchSequences[requestId] = sequence + 1
        payload = {k: v for k, v in pending.payload.items() if k not in ("type", "sessionId")}
        payload.update(sequence=sequence, delta=pending.delta)
        self._write(envelopeFor("reply.text.delta", pending.sessionId, payload))

    def _bufferLevel(self, envelope: dict[str, Any]) -> None:
        if not self.connected:
            return
        requestId = envelope.get("requestId")
        if not isinstance(requestId, str) or not requestId:
            self._write(envelope)
            return
        pending = self._pendingLevels.get(requestId)
        if pending is not None:
            pending.payload = dict(envelope)
            return
        timer = self.clock.callLater(VOICE_LEVEL_BATCH, self._flushLevel, requestId)
        self._pendingLevels[requestId] = _PendingLevel(dict(envelope), timer)

    def _flushLevel(self, requestId: str) -> None:
        pending = self._pendingLevels.pop(requestId, None)
        if pending is not None:
            payload = {
                k: v
                for k, v in pending.payload.items()
                if k not in ("protocol", "protocolVersion", "type", "messageId", "timestamp")
            }
            self._write(envelopeFor("voice.capture.level", payload.pop("sessionId", None), payload))

    def _dropLevel(self, requestId: str) -> None:
        pending = self._pendingLevels.pop(requestId, None)
        if pending is not None and pending.timer.active():
            pending.timer.cancel()

    def _write(self, envelope: dict[str, Any]) -> bool:
        if not self.connected:
            return False
        raw = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(raw) > MAX_MESSAGE_BYTES:
            self.errors.append("RPEngine message exceeds 8 MiB.")
            return False
        self._lastStamp = max(int(time.time() * 1000), self._lastStamp + 1)
        stem = f"{self._lastStamp:013d}-{envelope['messageId']}"
        try:
            _writeLikeBrowser(os.path.join(self.outbound, stem + ".json"), raw, exclusive=True)
            _writeLikeBrowser(os.path.join(self.outbound, stem + ".ready"), b"", exclusive=True)
        except OSError as e:
            self.errors.append(str(e))
            return False
        self.written.append(envelope)
        if envelope["type"] == "ack":
            self._ackTimers = [t for t in self._ackTimers if t.active()]
            self._ackTimers.append(
                self.clock.callLater(ACK_REMOVAL, _removePair, self.outbound, stem)
            )
        else:
            self.outgoing[envelope["messageId"]] = stem
        self._activeUntil = self.clock.seconds() + ACTIVE_FOR
        return True

    # Audio (sendAudioSegment, sendAudioNow, restoreSilence)

    def slotName(self, index: int) -> str:
        pattern = str(self.manifest["audio"]["slotPattern"])
        return pattern.replace("%04d", str(index).zfill(4))

    def sendAudioSegment(self, segment: dict[str, Any]) -> bool:
        if not self.manifest or not self.audio or self.audioExhausted:
            return False
        if self.nextSlot >= int(self.manifest["audio"]["slotCount"]):
            self.audioExhausted = True
            return False
        requestId = segment["requestId"]
        self._dropLevel(requestId)
        self._flushText(requestId)
        slotIndex = self.nextSlot
        self.nextSlot += 1
        name = self.slotName(slotIndex)
        path = os.path.join(self.audio, name)
        if not os.path.isfile(path):
            # The adapter opens the slot without creating it.
            self.errors.append(f"A requested file or directory could not be found: {name}")
            return True
        wav = pcm16Wav(segment["pcm"], segment["sampleRate"], 1)
        _writeLikeBrowser(path, wav, exclusive=False)
        self.segments.append(segment)
        payload = {
            "requestId": requestId,
            "segmentSequence": segment["segmentSequence"],
            "spokenText": segment["spokenText"],
            "slotIndex": slotIndex,
            "path": f"{self.manifest['audio']['directory']}/{name}",
            "format": "wav_pcm_s16le",
            "sampleRate": segment["sampleRate"],
            "channels": segment["channels"],
            "durationSeconds": segment["durationSeconds"],
            "byteLength": len(wav),
            "peerInstanceId": self.peerInstanceId,
        }
        self._write(envelopeFor("reply.audio.segment", segment.get("sessionId"), payload))
        return True

    def _restoreSilence(self, slotIndex: Any) -> None:
        count = int(self.manifest["audio"]["slotCount"])
        if not isinstance(slotIndex, int) or isinstance(slotIndex, bool):
            return
        if not 0 <= slotIndex < count:
            return
        path = os.path.join(self.audio, self.slotName(slotIndex))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"A requested file or directory could not be found: {path}")
        rate = int(self.manifest["audio"]["sampleRate"])
        _writeLikeBrowser(path, pcm16Wav(b"\x00\x00", rate, 1), exclusive=False)

    # Reading (schedule, poll, consume, removeAcknowledged)

    def _schedule(self, delay: float) -> None:
        if self.connected:
            self._timer = self.clock.callLater(delay, self.poll)

    def poll(self) -> None:
        if not self.connected or self._polling:
            return
        self._polling = True
        self.polls += 1
        try:
            for stem in readyStems(os.listdir(self.inbound)):
                self._consume(stem)
        except Exception as e:  # RPEngine reports any failure and tries next poll
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            self._polling = False
            active = self.clock.seconds() < self._activeUntil
            self._schedule(ACTIVE_POLL if active else IDLE_POLL)

    def _consume(self, stem: str) -> None:
        if not self.connected:
            return
        path = os.path.join(self.inbound, stem + ".json")
        if os.path.getsize(path) > MAX_MESSAGE_BYTES:
            _removePair(self.inbound, stem)
            self.errors.append("RPEngine message exceeds 8 MiB.")
            return
        with open(path, "rb") as f:
            raw = f.read().decode("utf-8")
        envelope = json.loads(raw)
        kind = envelope.get("type") if isinstance(envelope, dict) else None
        if kind == "ack" and isinstance(envelope.get("acknowledgedMessageId"), str):
            self._removeAcknowledged(envelope["acknowledgedMessageId"])
        if kind == "welcome":
            peer = envelope.get("peerInstanceId")
            peer = peer if isinstance(peer, str) else ""
            reported = envelope.get("nextAudioSlot")
            reported = int(reported) if isinstance(reported, int | float) and reported else 0
            if peer and peer != self.peerInstanceId:
                self.peerInstanceId, self.nextSlot, self.audioExhausted = peer, reported, False
            elif peer:
                self.nextSlot = max(self.nextSlot, reported)
        if kind == "reply.audio.segment.consumed":
            self._restoreSilence(envelope.get("slotIndex"))
        if (
            self.audioExhausted
            and kind in ("reply.request", "voice.capture.start")
            and envelope.get("output")
        ):
            envelope["output"]["modalities"] = ["text"]
            envelope["output"].pop("audio", None)
            raw = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)
        self.engine.receivedFrame(raw)
        _removePair(self.inbound, stem)
        self._activeUntil = self.clock.seconds() + ACTIVE_FOR

    def _removeAcknowledged(self, messageId: str) -> None:
        indexed = self.outgoing.pop(messageId, None)
        if indexed is not None:
            stems = [indexed]
        else:
            suffix = f"-{messageId}"
            stems = [s for s in readyStems(os.listdir(self.outbound)) if s.endswith(suffix)]
        for stem in stems:
            _removePair(self.outbound, stem)


def connectMailboxSimulator(
    clock: IReactorTime,
    root: str,
    options: SimulatorOptions | None = None,
    onTransport: Callable[[MailboxTransport], None] | None = None,
) -> Deferred[SimulatedEngine]:
    """
    Point a simulated RPEngine at the mailbox folder C{root} and say hello;
    fires with the engine once the game side's welcome was read.  The
    engine's C{carrier} is its L{MailboxTransport}.
    """
    transport = MailboxTransport(clock, root, options)
    if onTransport is not None:
        onTransport(transport)
    return transport.connect()


def socketChunks(segment: dict[str, Any]) -> list[dict[str, Any]]:
    """
    The C{reply.audio.chunk} fields RPEngine's socket adapter sends for one
    phrase (src/socket-adapter.ts sendAudioSegment): 32 KiB pieces.
    """
    pcm: bytes = segment["pcm"]
    count = -(-len(pcm) // PCM_CHUNK_BYTES)
    return [
        {
            "type": "reply.audio.chunk",
            "requestId": segment["requestId"],
            "sequence": segment["firstAudioSequence"] + index,
            "segmentSequence": segment["segmentSequence"],
            "segmentChunkSequence": index,
            "segmentChunkCount": count,
            "data": base64.b64encode(
                pcm[index * PCM_CHUNK_BYTES : (index + 1) * PCM_CHUNK_BYTES]
            ).decode("ascii"),
        }
        for index in range(count)
    ]


def spokenChunks(engine: SimulatedEngine, requestId: str | None = None) -> list[dict[str, Any]]:
    """
    What a simulated RPEngine spoke, as the WebSocket's chunks: the chunks
    it sent, or over the mailbox, those its socket adapter would have sent
    for each phrase it put in a slot.  Tests that count speech use this to
    hold for either transport.
    """
    segments = getattr(engine.carrier, "segments", None)
    if segments is None:
        return engine.sentOfType("reply.audio.chunk", requestId=requestId)
    return [
        chunk
        for segment in segments
        if requestId is None or segment["requestId"] == requestId
        for chunk in socketChunks(segment)
    ]
