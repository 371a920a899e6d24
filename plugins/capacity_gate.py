"""
capacity-gate: submit new work only while RPEngine has room for it.

RPEngine queues at most 20 requests (its captures, queued and active replies)
and answers work beyond that with C{capacity_exceeded}.  Several clients
share one RPEngine, so rather than let each of them learn that the hard way,
this plugin counts RPEngine's queue as RPEngine does and holds the rest in a
small local queue served round-robin between clients (FIFO within each),
releasing work as capacity returns.

The count: RPEngine answers each request with C{reply.accepted} (or a
refusal) and only then publishes C{capacity.update}, whose C{queueDepth}
includes it; it publishes one on every change, several per request
(crates/rp-engine-core/src/app.rs accept_reply, start_next_reply,
complete_if_ready, publish_capacity).  So the room left is the limit, less
the last depth RPEngine published, less the requests submitted that it has
not yet answered, which no update can include yet.  Counting the updates
themselves instead (room returns with each one) would let a burst of 22
clients overrun the queue.

Held requests are dropped from the chain and originated again later, never
held with a Deferred: a C{request.cancel} for a held request must reach this
plugin, which then answers C{reply.cancelled} itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from zope.interface import implementer

from rpmiddleware.plugin import (
    OPENING,
    TERMINAL,
    WITHDRAWING,
    Capacity,
    ChainPlugin,
    Envelope,
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IHeldWork,
    IPluginServices,
    PluginFactory,
    PluginSettings,
)

NAME = "capacity-gate"

#: Client id of requests that carry none (the in-process Python API).
DEFAULT_CLIENT = "api"
#: How many clients' last turn is remembered for fairness.
CLIENT_MEMORY = 1024
_PASS_META = ("decisions", "enteredAt", "origin")


@dataclass
class _Held:
    envelope: Envelope
    client: str
    #: Arrival order, kept when a request is put back, to break ties fairly.
    seq: int


@dataclass
class _Submitted:
    held: _Held
    #: Whether RPEngine answered it (reply.accepted): from then on it is in
    #: the queueDepth RPEngine publishes.
    accepted: bool = False


def clientOf(envelope: Envelope) -> str:
    client = envelope.meta.get("client")
    return client if isinstance(client, str) and client else DEFAULT_CLIENT


def _fresh(envelope: Envelope) -> Envelope:
    """
    A copy to send again: without the messageId RPEngine saw (it would be
    acknowledged as a duplicate and not processed) and the old sessionId.
    """
    fields = {k: v for k, v in envelope.fields.items() if k not in ("messageId", "sessionId")}
    return Envelope(fields, {k: v for k, v in envelope.meta.items() if k not in _PASS_META})


@implementer(IEnvelopePlugin, IHeldWork)
class CapacityGate(ChainPlugin):
    """
    See the module docstring and C{docs/plugins/capacity-gate.md}.
    """

    name = NAME
    log = Logger()

    def __init__(
        self, queueLimit: int = 32, assumeAfter: float = 2.0, assumedLimit: int = 1
    ) -> None:
        self.queueLimit = queueLimit
        self.assumeAfter = assumeAfter
        self._queues: dict[str, deque[_Held]] = {}
        self._lastServed: dict[str, int] = {}
        self._turn = 0
        self._seq = 0
        self._inFlight: dict[str, _Submitted] = {}
        self._live = False
        self._accepting: bool | None = None
        self._depth = 0
        self._limit = assumedLimit
        self._assumed = False
        self._timer: IDelayedCall | None = None
        self._releasing = False

    # What the console shows.

    def held(self) -> list[str]:
        """
        The requestIds held here, in the order they would be released.
        """
        queues = {c: list(q) for c, q in self._queues.items() if q}
        served = dict(self._lastServed)
        order: list[str] = []
        turn = self._turn
        while queues:
            client = min(queues, key=lambda c: (served.get(c, 0), queues[c][0].seq))
            order.append(queues[client].pop(0).envelope.requestId or "")
            turn += 1
            served[client] = turn
            if not queues[client]:
                del queues[client]
        return order

    def state(self) -> dict[str, Any]:
        return {
            "acceptingRequests": self._accepting,
            "queueDepth": self._depth,
            "queueLimit": self._limit,
            "held": self.held(),
            "inFlight": len(self._inFlight),
            "awaitingAcceptance": self._unanswered(),
            "assumed": self._assumed,
            "engineConnected": self._live,
        }

    # Sessions.

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self._cancelTimer()
        self._live, self._accepting, self._assumed = True, None, False
        self._depth = 0
        self._inFlight.clear()
        self._timer = context.reactor.callLater(self.assumeAfter, self._assume)

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        # Held work stays for the next session; what was in flight is the
        # engine link's to resend or fail.
        self._cancelTimer()
        self._live, self._accepting, self._assumed = False, None, False
        self._depth = 0
        self._inFlight.clear()

    def _cancelTimer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _assume(self) -> None:
        self._timer = None
        if not self._live or self._accepting is not None:
            return
        self.log.info(
            "no capacity.update {seconds}s into the session; assuming RPEngine accepts "
            "{limit} request(s)",
            seconds=self.assumeAfter,
            limit=self._limit,
        )
        self._accepting, self._assumed = True, True
        self._depth = 0
        self._release()

    # Game to engine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        requestId = envelope.requestId
        if requestId is None:
            return envelope
        if envelope.type in OPENING:
            return self._admit(envelope, context)
        # For a held request nothing started: all three withdrawals end it here.
        if envelope.type in WITHDRAWING and self._withdraw(requestId, context):
            return None
        return envelope

    def _admit(self, envelope: Envelope, context: IChainContext) -> Envelope | None:
        client = clientOf(envelope)
        self._seq += 1
        held = _Held(envelope, client, self._seq)
        if not self._heldCount() and self._canSubmit():
            self._submitted(held)
            return envelope
        resubmitted = bool(envelope.meta.get("resubmitted"))
        # Work the engine link sends again was admitted once already: it goes
        # first and is not refused for a full queue.
        if not resubmitted and self._heldCount() >= self.queueLimit:
            self._refuse(envelope, context)
            return None
        self._hold(held, front=resubmitted)
        self._release()
        return None

    def _unanswered(self) -> int:
        return sum(1 for submitted in self._inFlight.values() if not submitted.accepted)

    def _canSubmit(self) -> bool:
        return bool(
            self._live and self._accepting and self._depth + self._unanswered() < self._limit
        )

    def _heldCount(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def _hold(self, held: _Held, front: bool = False) -> None:
        queue = self._queues.setdefault(held.client, deque())
        if front:
            queue.appendleft(held)
        else:
            queue.append(held)

    def _next(self) -> _Held:
        """
        The head of the queue of the client served least recently (then the
        one waiting longest): round-robin, with no client starving another.
        """
        queues = self._queues
        client = min(
            (c for c in queues if queues[c]),
            key=lambda c: (self._lastServed.get(c, 0), queues[c][0].seq),
        )
        held = queues[client].popleft()
        if not queues[client]:
            del queues[client]
        return held

    def _submitted(self, held: _Held) -> None:
        envelope = held.envelope
        assert envelope.requestId is not None
        self._turn += 1
        self._lastServed.pop(held.client, None)
        self._lastServed[held.client] = self._turn
        if len(self._lastServed) > CLIENT_MEMORY:
            for client in list(self._lastServed)[: len(self._lastServed) - CLIENT_MEMORY]:
                if client not in self._queues:
                    del self._lastServed[client]
        kept = _Held(_fresh(envelope), held.client, held.seq)
        self._inFlight[envelope.requestId] = _Submitted(kept)

    def _release(self) -> None:
        """
        Send held work while RPEngine has room.  Re-entrant calls (a later
        plugin answering synchronously) leave the loop to the outer call.
        """
        context = self.context
        if self._releasing:
            return
        self._releasing = True
        try:
            while self._heldCount() and self._canSubmit():
                held = self._next()
                self._submitted(held)
                context.sendToEngine(held.envelope)
        finally:
            self._releasing = False

    def _withdraw(self, requestId: str, context: IChainContext) -> bool:
        for client, queue in self._queues.items():
            for held in queue:
                if held.envelope.requestId == requestId:
                    queue.remove(held)
                    if not queue:
                        del self._queues[client]
                    self._answer(context, "reply.cancelled", requestId=requestId)
                    return True
        return False

    def _refuse(self, envelope: Envelope, context: IChainContext) -> None:
        self.log.warn(
            "local queue full ({count} held); refusing {requestId}",
            count=self._heldCount(),
            requestId=envelope.requestId,
        )
        fields: dict[str, Any] = {
            "requestId": envelope.requestId,
            "code": "capacity_exceeded",
            "message": (
                f"RPEngine is busy and the middleware's local queue is full "
                f"({self.queueLimit} requests waiting); try again shortly"
            ),
            "retryable": True,
        }
        if envelope.messageId is not None:
            fields["sourceMessageId"] = envelope.messageId
        self._answer(context, "request.error", **fields)

    def _answer(self, context: IChainContext, kind: str, **fields: Any) -> None:
        session = context.session
        answer = Envelope.build(kind, session.sessionId if session else None, **fields)
        answer.meta["synthetic"] = True
        context.sendToGame(answer)

    # Engine to game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        if kind == "capacity.update":
            said = Capacity.fromEnvelope(
                envelope, Capacity(self._accepting is True, self._depth, self._limit)
            )
            assert said is not None
            self._update(said)
            self._release()
            return envelope
        requestId = envelope.requestId
        if kind == "reply.accepted" and requestId in self._inFlight:
            self._inFlight[requestId].accepted = True
            return envelope
        if kind not in TERMINAL:
            return envelope
        submitted = self._inFlight.pop(requestId, None) if requestId is not None else None
        if submitted is not None:
            if kind == "request.error" and envelope.get("code") == "capacity_exceeded":
                self._requeue(submitted)
                return None
            if submitted.accepted:
                # RPEngine publishes the smaller depth right after; counting
                # it now frees the place without waiting for that update.
                self._depth = max(0, self._depth - 1)
        self._release()
        return envelope

    def _update(self, said: Capacity) -> None:
        self._accepting = said.acceptingRequests
        self._depth = said.queueDepth
        self._limit = said.queueLimit
        self._assumed = False
        self._cancelTimer()

    def _requeue(self, submitted: _Submitted) -> None:
        """
        RPEngine had no room after all: believe it (no more work until a
        terminal message or capacity.update says otherwise) and put the
        request back first in its client's queue; the client never knows.
        """
        self._depth = max(self._depth, self._limit - self._unanswered())
        self.log.info(
            "RPEngine refused {requestId} with capacity_exceeded; holding it again",
            requestId=submitted.held.envelope.requestId,
        )
        self._hold(submitted.held, front=True)


class GateSettings(PluginSettings):
    """
    The C{[plugins.capacity-gate]} table.
    """

    #: Requests held at most; more are refused with capacity_exceeded.
    queue_limit: Annotated[int, msgspec.Meta(ge=0)] = 32
    #: Seconds into a session without capacity.update before assuming room.
    assume_after: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    #: Requests RPEngine is assumed to take then.
    assumed_limit: Annotated[int, msgspec.Meta(ge=1)] = 1


def buildCapacityGate(settings: GateSettings, services: IPluginServices) -> CapacityGate:
    """
    The plugin from its C{[plugins.capacity-gate]} table, read by the factory.
    """
    return CapacityGate(
        queueLimit=settings.queue_limit,
        assumeAfter=settings.assume_after,
        assumedLimit=settings.assumed_limit,
    )


capacityGate = PluginFactory(
    NAME,
    "Holds new requests while RPEngine is full and releases them fairly between clients "
    "as capacity returns.",
    buildCapacityGate,
    settings=GateSettings,
)
