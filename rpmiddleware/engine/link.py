"""
The engine end of the chain: which RPEngine session is live, and what happens
to work when there is none.

Rules (docs/engine-endpoint.md explains why):
  - the newest RPEngine connection wins: when a second one completes its
    handshake the older one is closed with code 4001;
  - with no RPEngine, requests wait here (bounded) and enter the chain again,
    in order, when a session starts, so per-session plugins such as the card
    cache see them fresh;
  - when a session ends, a request RPEngine never acknowledged is sent again in
    the next session, and one it had acknowledged ends with a retryable
    C{engine_disconnected} error: it is gone with the session, and sending it
    again could play the same turn twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from rpmiddleware.engine.session import CLOSE_SUPERSEDED, EngineSession
from rpmiddleware.plugin.interfaces import IEngineSessionInfo
from rpmiddleware.protocol.envelope import Direction, Envelope, summarize
from rpmiddleware.protocol.messages import MESSAGES, WITHDRAWING
from rpmiddleware.protocol.rules import EngineRefusal, checkOutgoing


class ChainEnd(Protocol):
    """
    What the engine link uses of the chain (L{rpmiddleware.core.chain.PluginChain}
    provides it): the link is built after the chain and given it, and the
    chain knows nothing of the link.
    """

    def sendToGame(self, envelope: Envelope) -> Deferred[None]:
        """An envelope from RPEngine (or the link's own answer) enters the chain."""

    def sendToEngine(self, envelope: Envelope) -> Deferred[None]:
        """A waiting or resent request enters the chain again at the game end."""

    def engineSessionStarted(self, session: IEngineSessionInfo) -> None: ...

    def engineSessionEnded(self, session: IEngineSessionInfo) -> None: ...


#: Messages that still mean something in a later session.
RESENDABLE = frozenset({"reply.request", "voice.capture.start", "character.sync"})
#: What the chain writes into meta on a pass; not carried into a new pass.
_CHAIN_META = frozenset({"enteredAt", "decisions", "origin"})


class EngineLink:
    """
    Holds the live L{EngineSession} and the requests waiting for one.

    @param chain: where envelopes from RPEngine, the link's own answers and
        the requests that waited go, and who hears of sessions.
    """

    log = Logger()

    def __init__(self, chain: ChainEnd, waitingLimit: int = 64) -> None:
        self.session: EngineSession | None = None
        self.chain = chain
        self.waitingLimit = waitingLimit
        self._waiting: deque[Envelope] = deque()
        self._open: dict[str, tuple[EngineSession, Envelope]] = {}
        self._resubmitted: list[Envelope] = []
        self._stateObservers: list[Callable[[EngineSession | None], None]] = []
        #: Why no RPEngine is connected, when the transport knows (the file
        #: mailbox: its tab stopped reading the folder); cleared when a
        #: session starts.
        self.problem: str | None = None
        #: How many times a transport judged its RPEngine gone (abandon).
        self.abandoned = 0

    @property
    def connected(self) -> bool:
        return self.session is not None

    @property
    def waiting(self) -> list[Envelope]:
        return list(self._waiting)

    def observeState(self, observer: Callable[[EngineSession | None], None]) -> Callable[[], None]:
        """
        Call C{observer} with the new session (or C{None}) whenever it changes.

        @return: a callable that stops it.
        """
        self._stateObservers.append(observer)

        def stop() -> None:
            if observer in self._stateObservers:
                self._stateObservers.remove(observer)

        return stop

    def _stateChanged(self) -> None:
        for observer in list(self._stateObservers):
            try:
                observer(self.session)
            except Exception:
                self.log.failure("engine state observer failed")

    # The end of the game-to-engine direction.

    def send(self, envelope: Envelope) -> None:
        spec = MESSAGES.get(envelope.type)
        if spec is None or Direction.TO_ENGINE not in spec.directions:
            # Middleware-internal envelopes (a plugin's own types) that no
            # plugin consumed must not reach RPEngine, which would refuse them.
            self.log.warn(
                "dropped {envelope} at the engine end: RPEngine does not take {type}",
                envelope=summarize(envelope.fields),
                type=envelope.type,
            )
            return
        session = self.session
        try:
            self._check(envelope)
            if session is None or session.closed:
                self._holdWithoutEngine(envelope)
                return
            session.send(envelope)
        except EngineRefusal as refusal:
            self._refused(envelope, refusal)
            return
        if spec.opensRequest and envelope.requestId:
            self._open[envelope.requestId] = (session, envelope)

    @staticmethod
    def _check(envelope: Envelope) -> None:
        """
        Refuse here what RPEngine would refuse, so that the turn ends at once
        with the field named, instead of with RPEngine's untied
        C{invalid_payload} or C{invalid_character_card}.  This is the one
        check of what leaves the chain: it happens before the envelope is
        sent or waits for a session, and the session only stamps the head
        fields (messageId, timestamp, sessionId) and judges the size.
        """
        checkOutgoing(envelope.fields)

    def _refused(self, envelope: Envelope, refusal: EngineRefusal) -> None:
        self.log.warn(
            "not sending {envelope}: RPEngine would refuse it ({field} {problem})",
            envelope=summarize(envelope.fields),
            field=refusal.field,
            problem=refusal.problem,
        )
        if envelope.type in WITHDRAWING or not envelope.requestId:
            return
        self._answer(
            envelope,
            "request.error",
            code=refusal.code,
            message=f"RPEngine would refuse this {envelope.type}: {refusal}",
            retryable=False,
            field=refusal.field,
        )

    def _holdWithoutEngine(self, envelope: Envelope) -> None:
        kind = envelope.type
        if kind in RESENDABLE:
            if len(self._waiting) >= self.waitingLimit:
                self.log.warn(
                    "no RPEngine and {count} requests already waiting; refusing {envelope}",
                    count=len(self._waiting),
                    envelope=summarize(envelope.fields),
                )
                self._answer(
                    envelope,
                    "request.error",
                    code="engine_unavailable",
                    message=(
                        f"RPEngine is not connected and {self.waitingLimit} requests are "
                        "already waiting for it"
                    ),
                    retryable=True,
                    sourceMessageId=envelope.messageId,
                )
                return
            envelope.fields.pop("messageId", None)
            envelope.fields.pop("sessionId", None)
            for key in _CHAIN_META:
                envelope.meta.pop(key, None)
            self._waiting.append(envelope)
            self.log.info(
                "no RPEngine connected; {envelope} waits ({count} waiting)",
                envelope=summarize(envelope.fields),
                count=len(self._waiting),
            )
            return
        if kind in WITHDRAWING:
            for waiting in list(self._waiting):
                if waiting.requestId and waiting.requestId == envelope.requestId:
                    self._waiting.remove(waiting)
                    self._answer(waiting, "reply.cancelled")
                    return
        self.log.info(
            "no RPEngine connected; dropped {envelope}, which means nothing to a later session",
            envelope=summarize(envelope.fields),
        )

    def _answer(self, request: Envelope, kind: str, **fields: Any) -> None:
        sessionId = self.session.sessionId if self.session is not None else None
        if request.requestId:
            fields["requestId"] = request.requestId
        answer = Envelope.build(kind, sessionId, **fields)
        answer.meta["synthetic"] = True
        self.chain.sendToGame(answer)

    # Callbacks from EngineSession.

    def welcomed(self, session: EngineSession) -> None:
        previous, self.session = self.session, session
        self.problem = None
        if previous is not None and not previous.closed:
            self.log.warn(
                "a second RPEngine connected ({new}); closing the older one ({old})",
                new=session.peer,
                old=previous.peer,
            )
            previous.close(CLOSE_SUPERSEDED, "replaced by a newer RPEngine connection")
            # The old connection's close completes later; its requests are
            # settled now so that the new session can take them.
            self.ended(previous)
        chain = self.chain
        chain.engineSessionStarted(session)
        self._stateChanged()
        waiting, self._waiting = self._waiting, deque()
        for envelope in waiting:
            chain.sendToEngine(envelope)

    def received(self, session: EngineSession, envelope: Envelope) -> None:
        if session is not self.session:
            return
        if envelope.meta.get("malformed"):
            # Ends a request only while it is open in this session.
            owner = self._open.get(envelope.requestId or "")
            if owner is None or owner[0] is not session:
                self.log.debug(
                    "malformed ending for request {requestId}, which is not open; dropped",
                    requestId=envelope.requestId,
                )
                return
        spec = MESSAGES[envelope.type]
        if spec.terminal and envelope.requestId:
            self._open.pop(envelope.requestId, None)
        self.chain.sendToGame(envelope)

    def ended(self, session: EngineSession) -> None:
        if session.sessionId is None or session.settled:
            return
        session.settled = True
        if self.session is session:
            self.session = None
            self._stateChanged()
        chain = self.chain
        chain.engineSessionEnded(session)
        unacked = {e.messageId for e in session.unacknowledged()}
        lost = [
            (requestId, envelope)
            for requestId, (owner, envelope) in self._open.items()
            if owner is session
        ]
        for requestId, envelope in lost:
            del self._open[requestId]
            if envelope.messageId in unacked:
                unacked.discard(envelope.messageId)
                self._resubmit(envelope, session.fileMode)
            else:
                self._answer(
                    envelope,
                    "request.error",
                    code="engine_disconnected",
                    message="RPEngine disconnected during this reply; it can be asked again",
                    retryable=True,
                    sourceMessageId=envelope.messageId,
                )
        for envelope in session.unacknowledged():
            if envelope.messageId in unacked and envelope.type == "character.sync":
                self._resubmit(envelope, session.fileMode)
        self._waiting.extendleft(reversed(self._resubmitted))
        self._resubmitted.clear()

    def _resubmit(self, envelope: Envelope, keepMessageId: bool = False) -> None:
        """
        Send C{envelope} again in the next session: through the chain now if
        a session is live (a newer RPEngine replaced the old one), otherwise
        at the head of the waiting line, which enters the chain when one
        starts.  It never counts against the waiting limit: it was accepted
        once already.

        @param keepMessageId: resend it under the same messageId.  Over the
            WebSocket it gets a new one: a tab that read it before the
            connection dropped cancelled it then, and would take the same id
            for a duplicate and never answer.  A message written to the file
            mailbox keeps its id: a tab never cancels on the mailbox's
            account, so one that read it is still answering it and takes the
            copy for a duplicate, and any other tab plays it once.
        """
        # The caller's annotations (client, outputSampleRate) go along; what the
        # chain recorded about the first pass does not.
        meta = {k: v for k, v in envelope.meta.items() if k not in _CHAIN_META}
        dropped = ("sessionId",) if keepMessageId else ("messageId", "sessionId")
        again = Envelope(
            {k: v for k, v in envelope.fields.items() if k not in dropped},
            {**meta, "resubmitted": True},
        )
        self.log.info(
            "resending {envelope}, which RPEngine never acknowledged, in the next session",
            envelope=summarize(again.fields),
        )
        if self.session is None:
            self._resubmitted.append(again)
        else:
            self.chain.sendToEngine(again)

    def openRequests(self) -> list[str]:
        return list(self._open)

    def takeOpen(self, session: EngineSession) -> list[Envelope]:
        """
        Forget the requests open in C{session}, oldest first, so that its
        end neither resends nor fails them: the caller ends them
        (L{abandon}).
        """
        taken = [envelope for owner, envelope in self._open.values() if owner is session]
        for envelope in taken:
            self._open.pop(str(envelope.requestId), None)
        return taken

    def abandon(self, requests: list[Envelope], code: str, message: str) -> None:
        """
        End C{requests} (from L{takeOpen}) with a retryable C{request.error}
        C{code}: their RPEngine is judged gone, so they are neither resent
        nor left waiting.
        """
        self.abandoned += 1
        for envelope in requests:
            self._answer(
                envelope,
                "request.error",
                code=code,
                message=message,
                retryable=True,
                sourceMessageId=envelope.messageId,
            )
