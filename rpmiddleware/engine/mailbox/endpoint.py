"""
The engine endpoint's file mailbox: RPEngine's envelopes read from a folder
become L{MailboxSession}s on the same L{EngineLink} the WebSocket feeds.

    engine-to-integration/ --> MailboxEndpoint.read --> MailboxSession --> EngineLink
    integration-to-engine/ <-- FileOutbox.write     <-- MailboxSession <-- EngineLink

What only file mode has lives here: RPEngine's phrases in WAV slots turned
into the chunk stream (L{SegmentStream}) and answered with
C{reply.audio.segment.consumed}; acks removing our files; the peer identity
and its slots (L{SlotLedger}), renewed with a fresh C{welcome} before they
run out; and a session adopted at start-up by an RPEngine that was already
polling the folder when the middleware (re)started.

When a newer RPEngine connection takes over (a hello in the mailbox, or
the WebSocket), the mailbox session ends as a WebSocket one does: the link
resends what RPEngine never acknowledged, under the same messageId (see
L{EngineLink._resubmit}), after the old copies still waiting in the folder
were withdrawn, so that no second tab plays them too.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from rpmiddleware.engine.link import RESENDABLE
from rpmiddleware.engine.mailbox.audioslots import (
    AudioLayout,
    SegmentStream,
    SlotLedger,
    parseWav,
    readSlot,
    slotNameOf,
)
from rpmiddleware.engine.mailbox.files import (
    READY,
    Refused,
    StemClock,
    exists,
    parseStem,
    readEnvelopeBytes,
    removePair,
    writeEnvelope,
    writeEnvelopes,
)
from rpmiddleware.engine.mailbox.session import MailboxSession, MailboxWriter
from rpmiddleware.engine.mailbox.watch import ReaderWatch
from rpmiddleware.engine.session import EngineSession, decodeText
from rpmiddleware.protocol.envelope import Envelope, summarize
from rpmiddleware.protocol.messages import ProtocolViolation
from rpmiddleware.protocol.rules import EngineRefusal

if TYPE_CHECKING:
    from rpmiddleware.engine.link import EngineLink
    from rpmiddleware.engine.session import SessionOptions


class EngineHost(Protocol):
    """
    What the mailbox needs of the middleware that owns the engine link
    (L{rpmiddleware.core.middleware.Middleware} provides it): the link its
    sessions feed, and the options every engine session is made with.
    """

    @property
    def link(self) -> EngineLink: ...

    def sessionOptions(self) -> SessionOptions: ...


#: RPEngine removes its own ack files two seconds after writing them
#: (src/filesystem-mailbox-adapter.ts sendNow); ours go the same way.
ACK_LINGER = 2.0
#: Seconds a message of ours may wait unread before the log says so.
UNREAD_WARNING = 30.0
#: The error RPEngine's host sends when a phrase found no free slot
#: (src/app-host.ts).
AUDIO_TRANSPORT_FAILED = "audio_transport_failed"


class FileOutbox:
    """
    The folder RPEngine reads (C{integration-to-engine}): one file pair per
    envelope, found again by messageId until RPEngine acknowledges it.
    """

    log = Logger()

    def __init__(self, directory: int, clock: IReactorTime, onWrite: Callable[[], None]) -> None:
        self._dir = directory
        self._clock = clock
        self._onWrite = onWrite
        self._stems: dict[str, str] = {}
        self._acks: deque[tuple[float, str]] = deque()
        self.stems = StemClock(now=clock.seconds)
        self.written = 0
        self._holding = False
        self._held: list[tuple[str, bytes]] = []

    def recover(self) -> tuple[int, int]:
        """
        After a restart: find our unacknowledged envelopes again (so that
        RPEngine's acks still remove them; they are never written twice),
        drop our old acks, and remove anything RPEngine would choke on (a
        marker without its JSON, a name that is no stem).

        @return: how many were found again, and how many pairs removed.
        """
        found = removed = 0
        latest = 0
        with os.scandir(self._dir) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            parsed = parseStem(name.rsplit(".", 1)[0])
            if parsed is not None:
                latest = max(latest, parsed[0])
        for name in names:
            if not name.endswith(READY):
                continue
            stem = name[: -len(READY)]
            parsed = parseStem(stem)
            try:
                if parsed is None:
                    raise Refused("its name is no <timestamp>-<messageId> stem")
                fields = decodeText(readEnvelopeBytes(self._dir, stem))
                if not isinstance(fields, dict) or fields.get("messageId") != parsed[1]:
                    raise Refused("it is not the envelope its name says")
            except (Refused, ProtocolViolation) as e:
                self.log.warn(
                    "removed {name} from the mailbox RPEngine reads: {reason}",
                    name=name,
                    reason=getattr(e, "reason", str(e)),
                )
                removePair(self._dir, stem)
                removed += 1
                continue
            if fields.get("type") == "ack":
                removePair(self._dir, stem)
                removed += 1
            else:
                self._stems[parsed[1]] = stem
                found += 1
        self.stems.last = latest
        return found, removed

    def holdAcks(self) -> None:
        """
        Keep acks back until L{flush}: the service reads a batch of
        RPEngine's files, hands them on, and only then writes the acks, all
        at once (one folder flush), so no message waits for its ack's
        trip to the disk.
        """
        self._holding = True

    def flush(self) -> None:
        self._holding = False
        held, self._held = self._held, []
        if not held:
            return
        try:
            writeEnvelopes(self._dir, held)
        except OSError as e:
            self.log.error("could not write acks to the mailbox: {error}", error=e.strerror or e)
            for stem, _ in held:
                removePair(self._dir, stem)
            return
        expires = self._clock.seconds() + ACK_LINGER
        for stem, _ in held:
            self._acks.append((expires, stem))
        self.written += len(held)
        self._onWrite()

    def write(self, messageId: str, payload: bytes, ack: bool) -> None:
        if ack and self._holding:
            self._held.append((self.stems.next(messageId), payload))
            return
        previous = self._stems.pop(messageId, None)
        if previous is not None:
            # The same message again: a copy still unread is withdrawn
            # first, so RPEngine reads it once, in its new place.
            removePair(self._dir, previous)
        stem = self.stems.next(messageId)
        try:
            writeEnvelope(self._dir, stem, payload)
        except OSError as e:
            # Not written: the session resends it when no ack comes.
            self.log.error(
                "could not write {messageId} to the mailbox: {error}",
                messageId=messageId,
                error=e.strerror or str(e),
            )
            removePair(self._dir, stem)
            return
        self.written += 1
        if ack:
            self._acks.append((self._clock.seconds() + ACK_LINGER, stem))
        else:
            self._stems[messageId] = stem
        self._onWrite()

    def unread(self, messageId: str) -> bool:
        stem = self._stems.get(messageId)
        return stem is not None and exists(self._dir, stem + READY)

    def acknowledged(self, messageId: str) -> None:
        stem = self._stems.pop(messageId, None)
        if stem is not None:
            removePair(self._dir, stem)

    def withdraw(self, messageId: str) -> bool:
        """
        Take back C{messageId} if RPEngine has not read it yet.
        """
        if not self.unread(messageId):
            return False
        removePair(self._dir, self._stems.pop(messageId))
        return True

    def tidy(self) -> None:
        """
        Remove our acks past their time, and forget files RPEngine consumed
        but never acknowledged (their sessions gave up on them).
        """
        now = self._clock.seconds()
        while self._acks and self._acks[0][0] <= now:
            removePair(self._dir, self._acks.popleft()[1])
        for messageId, stem in list(self._stems.items()):
            if not exists(self._dir, stem + READY):
                del self._stems[messageId]

    def oldestUnread(self) -> tuple[float, str] | None:
        """
        When the oldest message RPEngine has not read yet was written (in
        the clock's seconds), and its messageId.
        """
        for messageId, stem in sorted(self._stems.items(), key=lambda item: item[1]):
            if exists(self._dir, stem + READY):
                parsed = parseStem(stem)
                assert parsed is not None
                return parsed[0] / 1000, messageId
        return None

    def __len__(self) -> int:
        return len(self._stems)


@dataclass(frozen=True)
class Folders:
    """
    Descriptors of the mailbox's three folders, and the root's path.
    """

    root: str
    toEngine: int
    fromEngine: int
    audio: int


class MailboxEndpoint:
    """
    The sessions of one mailbox, and what file mode adds to them.

    @ivar session: the current mailbox session (live, or adopted and
        pending), or C{None} when the WebSocket took over or none began.
    """

    log = Logger()

    def __init__(
        self,
        middleware: EngineHost,
        clock: IReactorTime,
        folders: Folders,
        layout: AudioLayout,
        onWrite: Callable[[], None] = lambda: None,
    ) -> None:
        self.middleware = middleware
        self.link = middleware.link
        self.clock = clock
        self.folders = folders
        self.layout = layout
        self.ledger = SlotLedger(layout.slotCount)
        self.outbox = FileOutbox(folders.toEngine, clock, onWrite)
        self.segments = SegmentStream()
        self.session: MailboxSession | None = None
        #: Every sessionId this process gave out through this mailbox.
        self.sessionIds: set[str] = set()
        #: Renew the peer identity when this few slots are left.
        self.reserve = min(256, max(1, layout.slotCount // 8))
        self._renewWanted = False
        self._strangersLogged: set[str] = set()
        self._dropLogged: set[str] = set()
        self._unreadWarned: str | None = None
        self._later: list[IDelayedCall] = []
        self.refusedFiles = 0
        self.segmentsRead = 0
        #: Whether RPEngine still reads the folder (L{rpmiddleware.engine.mailbox.watch}).
        self.watch = ReaderWatch(clock, self.outbox, self.link, self._readerGone)

    # Life

    def start(self, adopt: bool = True) -> None:
        """
        Begin: unless told otherwise, offer a session to an RPEngine that
        may already be polling the folder (the middleware restarted under
        it); it becomes live once RPEngine shows it read the welcome.
        """
        if adopt:
            session = self._newSession()
            session.adopt(announce=False)
            self._adopted(session)

    def stop(self) -> None:
        for call in self._later:
            if call.active():
                call.cancel()
        self._later = []
        session, self.session = self.session, None
        if session is not None and not session.closed:
            self._end(session, withdraw=False)

    # Reading

    def refused(self, name: str, reason: str) -> None:
        """
        One file from RPEngine refused (and removed by the caller).
        """
        self.refusedFiles += 1
        self.log.warn(
            "refused {name} in the mailbox: {reason}",
            name=name,
            reason=reason,
            folder=self.folders.root,
        )

    def stranger(self, name: str) -> None:
        if name not in self._strangersLogged and len(self._strangersLogged) < 1024:
            self._strangersLogged.add(name)
            self.refused(name, "its name is no <13-digit timestamp>-<messageId>.ready")

    def read(self, stem: str) -> None:
        """
        Read, and hand on, the envelope C{stem} of RPEngine's folder; the
        caller removes its files afterwards.
        """
        try:
            fields = decodeText(readEnvelopeBytes(self.folders.fromEngine, stem))
        except Refused as e:
            self.refused(stem + READY, e.reason)
            return
        except ProtocolViolation as e:
            self.refused(stem + ".json", e.reason)
            return
        parsed = parseStem(stem)
        if not isinstance(fields, dict) or not isinstance(fields.get("type"), str):
            self.refused(stem + ".json", "it is not an envelope (a JSON object with a type)")
            return
        if parsed is not None and fields.get("messageId") != parsed[1]:
            self.refused(stem + ".json", "its messageId is not the one its name says")
            return
        self.watch.heard()
        if fields["type"] == "hello":
            self._hello(fields)
            return
        session = self.session
        if session is None or session.closed:
            self._dropped(
                fields,
                "no mailbox session (RPEngine connected over the WebSocket "
                "since, or has not said hello here)",
            )
            return
        stamped = fields.get("sessionId")
        if (
            session.pending
            and fields["type"] != "ack"
            and stamped != session.sessionId
            and stamped not in self.sessionIds
        ):
            # RPEngine has not read the welcome offered at start-up yet: this
            # is the previous middleware process's session, gone with it.
            self._dropped(fields, "it belongs to a session of an earlier middleware process")
            return
        session.received(fields)

    def _dropped(self, fields: dict[str, Any], why: str) -> None:
        key = str(fields.get("sessionId"))
        if key in self._dropLogged:
            return
        if len(self._dropLogged) < 256:
            self._dropLogged.add(key)
        self.log.info(
            "dropped {envelope} from the mailbox, and the rest of its session: {why}",
            envelope=summarize(fields),
            why=why,
        )

    # Sessions

    def _newSession(self) -> MailboxSession:
        middleware = self.middleware
        options = middleware.sessionOptions()
        options.ackEngineMessages = True
        writer = MailboxWriter(self.outbox, self._writerClosed)
        session = MailboxSession(
            writer,
            self.clock,
            options,
            self.ledger,
            self.sessionIds,
            onWelcome=self.link.welcomed,
            onEnvelope=self._delivered,
            onClosed=self.link.ended,
            onAcked=lambda s, envelope: self.outbox.acknowledged(str(envelope.messageId)),
            peer=f"mailbox:{self.folders.root}",
        )
        return session

    def _adopted(self, session: MailboxSession) -> None:
        if session.sessionId is not None:
            self.sessionIds.add(session.sessionId)
        self.session = session

    def _hello(self, hello: dict[str, Any]) -> None:
        current = self.session
        if current is not None and current.pending:
            self.log.info(
                "RPEngine said hello; the offered session {sessionId} is withdrawn",
                sessionId=current.sessionId,
            )
            self._end(current, withdraw=True)
            self.session = None
        session = self._newSession()
        session.received(hello)
        if session.sessionId is None:
            # Not a hello we could answer (logged by the session).
            session.settled = True
            session.connectionLost()
            return
        self._adopted(session)

    def _writerClosed(self, writer: MailboxWriter, code: int, reason: str) -> None:
        session = writer.session
        if session is None or session.closed:
            return
        self.log.info(
            "mailbox session {sessionId} ends: {reason}", sessionId=session.sessionId, reason=reason
        )
        self._end(session, withdraw=True)

    def _end(self, session: MailboxSession, withdraw: bool) -> None:
        """
        End C{session}: the requests the link will resend are first taken
        back from the folder if RPEngine has not read them, so that only the
        resent copy is ever played.
        """
        session.writer.closed = True
        if withdraw:
            for envelope in session.unacknowledged():
                if envelope.type in RESENDABLE and envelope.messageId:
                    self.outbox.withdraw(envelope.messageId)
        if session.pending:
            # Never announced, so nothing to settle; its welcome, if still
            # unread, is taken back.
            session.settled = True
            if session.welcomeId:
                self.outbox.withdraw(session.welcomeId)
        if self.session is session:
            self.session = None
        session.connectionLost()

    # RPEngine's messages

    def _delivered(self, session: EngineSession, envelope: Envelope) -> None:
        if envelope.type == "reply.audio.segment":
            self._segment(session, envelope)
            return
        self.segments.passed(envelope)
        if envelope.type == "request.error" and envelope.get("code") == AUDIO_TRANSPORT_FAILED:
            self.log.warn(
                "RPEngine stopped speaking for request {requestId}: it has used all {count} audio "
                "slots of peer identity {peer} and sends text only until it gets a new one, "
                "which this mailbox gives it as soon as no turn is open",
                requestId=envelope.requestId,
                count=self.layout.slotCount,
                peer=self.ledger.peerInstanceId,
            )
            self.ledger.used(self.layout.slotCount - 1)
            self._renewWanted = True
        self.link.received(session, envelope)
        self._renew()

    def _segment(self, session: EngineSession, segment: Envelope) -> None:
        """
        One phrase in a slot: read it, tell RPEngine the slot is free, and
        pass on what RPEngine's socket adapter would have sent.
        """
        slotIndex = int(segment["slotIndex"])
        if 0 <= slotIndex < self.layout.slotCount:
            self.ledger.used(slotIndex)
        try:
            name = slotNameOf(self.layout, segment.get("path"), slotIndex)
            audio = parseWav(readSlot(self.folders.audio, name))
            if audio.channels != 1 or audio.sampleRate != segment.get("sampleRate"):
                raise Refused(
                    f"the WAV is {audio.channels} channel(s) at {audio.sampleRate} Hz, the "
                    f"segment says 1 at {segment.get('sampleRate')} Hz"
                )
        except Refused as e:
            self.refusedFiles += 1
            self.log.warn(
                "refused audio segment {segment} of request {requestId} (slot {slot}): {reason}; "
                "that phrase is not played",
                segment=segment.get("segmentSequence"),
                requestId=segment.requestId,
                slot=slotIndex,
                reason=e.reason,
            )
            audio = None
        if audio is not None:
            self.segmentsRead += 1
            for envelope in self.segments.envelopes(segment, audio, session.sessionId):
                self.link.received(session, envelope)
        # The slot was read: RPEngine may put silence back.  In the next
        # reactor turn, so the chunks reach their client before this file's
        # trip to the disk.
        if 0 <= slotIndex < self.layout.slotCount and not session.closed:
            consumed = Envelope.build(
                "reply.audio.segment.consumed",
                requestId=segment.requestId,
                segmentSequence=segment.get("segmentSequence"),
                slotIndex=slotIndex,
                peerInstanceId=self.ledger.peerInstanceId,
            )
            self._later = [call for call in self._later if call.active()]
            self._later.append(self.clock.callLater(0, self._sendConsumed, session, consumed))
        if self.ledger.remaining <= self.reserve:
            self._renewWanted = True
            self._renew()

    def _checkReader(self) -> None:
        """
        Say so when RPEngine stops reading: over the mailbox nothing tells
        us that its tab closed, only that our messages stay where they are.
        """
        session = self.session
        if session is None or session.closed or session.pending:
            return
        oldest = self.outbox.oldestUnread()
        if oldest is None:
            return
        written, messageId = oldest
        waited = self.clock.seconds() - written
        if waited >= UNREAD_WARNING and messageId != self._unreadWarned:
            self._unreadWarned = messageId
            self.log.warn(
                "RPEngine has not read the mailbox {folder} for {seconds:.0f} s; is RPEngine "
                "open with this folder selected? Requests wait there until it reads them",
                folder=self.folders.root,
                seconds=waited,
                messageId=messageId,
            )

    def watchReader(self) -> None:
        """
        The service's every poll: judge whether RPEngine still reads the
        folder while something waits on it (L{ReaderWatch}).
        """
        self.watch.check(self.session)

    def _readerGone(self, session: MailboxSession, seconds: float) -> None:
        """
        RPEngine stopped reading the folder while turns waited on it: they
        end now, retryably, saying so; the session ends (the console and
        /metrics show RPEngine gone, and why), and a fresh welcome is
        offered, so that the tab, should it read again, is taken back
        without a hello.  What it had read of the ended requests is
        cancelled in the folder (a frozen tab that wakes stops them); what
        it had not is taken back.
        """
        root = self.folders.root
        requests = self.link.takeOpen(session)
        for envelope in requests:
            messageId = str(envelope.messageId or "")
            if messageId and self.outbox.withdraw(messageId):
                continue
            kind = (
                "voice.capture.cancel"
                if envelope.type == "voice.capture.start"
                else "request.cancel"
            )
            try:
                session.send(Envelope.build(kind, requestId=envelope.requestId))
            except EngineRefusal:
                pass
        self.log.warn(
            "RPEngine has not read the mailbox {folder} for {seconds:.1f} s while {count} "
            "request(s) waited on it: its tab was closed or is frozen. Ending them; the session "
            "comes back when RPEngine reads the folder again or says hello",
            folder=root,
            seconds=seconds,
            count=len(requests),
            sessionId=session.sessionId,
        )
        self.link.problem = (
            f"RPEngine's tab stopped reading the mailbox folder {root} (nothing read for "
            f"{seconds:.0f} s); open RPEngine with this folder selected"
        )
        self._end(session, withdraw=True)
        fresh = self._newSession()
        fresh.adopt(announce=False)
        self._adopted(fresh)
        self.link.abandon(
            requests,
            "engine_not_reading",
            f"RPEngine's tab stopped reading the mailbox folder {root} (nothing read for "
            f"{seconds:.0f} s): it was closed, or is frozen in the background. Open RPEngine "
            "with this folder selected, then ask again",
        )

    @staticmethod
    def _sendConsumed(session: EngineSession, consumed: Envelope) -> None:
        if not session.closed:
            session.send(consumed)

    # The peer identity

    def maintain(self) -> None:
        """
        The service's periodic care: tidy the outbox, say so if RPEngine
        stopped reading, and renew the peer identity if that is due.
        """
        self.outbox.tidy()
        self._checkReader()
        self._renew()

    def _renew(self) -> None:
        """
        Renew the peer identity, if its slots are (nearly) used up and no
        turn is open: a fresh C{welcome} under a new session gives RPEngine
        a new C{peerInstanceId} and slot 0 again.
        """
        if not self._renewWanted:
            return
        session = self.session
        if session is None or session.closed or session.pending:
            return
        if self.link.session is not session or self.link.openRequests() or self.link.waiting:
            return
        self._renewWanted = False
        used = self.ledger.nextSlot
        self.ledger.renew()
        self.segments.forgetAll()
        self.log.info(
            "gave RPEngine a new peer identity {peer} after {used} of {count} audio slots",
            peer=self.ledger.peerInstanceId,
            used=used,
            count=self.layout.slotCount,
        )
        fresh = self._newSession()
        fresh.adopt(announce=True)
        self._adopted(fresh)
