"""
Which of our requests RPEngine is working on now, as far as it tells us.

RPEngine keeps one queue of replies (at most 20) and works on one reply at a
time, in the order it accepted them, beside at most one microphone capture
(C{crates/rp-engine-core/src/app.rs}: C{accept_reply} pushes to the back of
C{queue} and answers C{reply.accepted} with the C{queueDepth} counting it;
C{start_next_reply} takes the front when nothing is C{active};
C{stt_completed} turns a capture with words into a reply at the back of the
queue; C{capacity.update} carries only C{queueDepth}, C{queueLimit} and
C{acceptingRequests}, no request id).  So a request is RPEngine's active one
when:

  - its stream has started (text, speech or capture reports for it since
    it was accepted): RPEngine sends those only for its active reply or its
    capture;
  - or it is the oldest accepted reply still open here (nothing ahead of it
    in RPEngine's queue; a C{reply.accepted} whose C{queueDepth} is 1 says
    RPEngine holds nothing else, so what was ahead of it here is forgotten);
  - or RPEngine's last C{capacity.update} says its queue is empty while the
    request is still open here: RPEngine holds nothing of it, so it is not
    waiting its turn.

A request behind others waits its turn: the client's stall rule
(L{rpmiddleware.client.turns.Turn}) only times the active one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from twisted.logger import Logger

from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import TERMINAL, Capacity

#: What RPEngine sends only for the reply or capture it is working on.
STREAM_TYPES = frozenset(
    {
        "reply.text.delta",
        "reply.text.completed",
        "reply.audio.start",
        "reply.audio.chunk",
        "reply.audio.completed",
        "reply.audio.segment",
        "voice.capture.state",
        "voice.capture.level",
        "voice.capture.audio.start",
        "voice.capture.audio.chunk",
        "voice.capture.audio.completed",
    }
)
#: Capture reports: the request is at the microphone, not in the reply queue.
_CAPTURE_TYPES = frozenset({"voice.capture.state", "voice.capture.level"})
#: What an update that says no depth is read against: not an empty queue.
_UNSAID_DEPTH = Capacity(queueDepth=1)


class _Entry:
    __slots__ = ("capturing", "started")

    def __init__(self) -> None:
        self.started = False
        self.capturing = False


class EngineQueue:
    """
    RPEngine's queue as its messages show it; fed every envelope that
    reaches the game end (a router observer), emptied when the session
    changes.
    """

    log = Logger()

    def __init__(self) -> None:
        #: Accepted, still-open requests in the order RPEngine accepted them
        #: (a capture moves to the back when its words are in).
        self._order: OrderedDict[str, _Entry] = OrderedDict()
        self._empty = False
        self._waiting: dict[str, list[Callable[[], None]]] = {}

    def received(self, envelope: Envelope) -> None:
        kind = envelope.type
        if kind == "capacity.update":
            # A depth it did not say is not an empty queue.
            said = Capacity.fromEnvelope(envelope, _UNSAID_DEPTH)
            self._empty = said is not None and said.queueDepth == 0
            if self._empty:
                self._changed()
            return
        requestId = envelope.requestId
        if not requestId:
            return
        if kind in TERMINAL:
            self._order.pop(requestId, None)
            self._waiting.pop(requestId, None)
            self._changed()
            return
        if kind == "reply.accepted":
            if requestId not in self._order:
                self._order[requestId] = _Entry()
                self._empty = False
            depth = envelope.get("queueDepth")
            if depth == 1 and not isinstance(depth, bool):
                # RPEngine counts this one alone: whatever we still had
                # ahead of it ended without our hearing, and waits for
                # nothing there.
                for other in [r for r in self._order if r != requestId]:
                    del self._order[other]
            self._changed()
            return
        entry = self._order.get(requestId)
        if entry is None:
            return
        if kind == "voice.capture.transcript":
            # Its words go to the back of the reply queue (stt_completed).
            entry.capturing = entry.started = False
            self._order.move_to_end(requestId)
            self._changed()
        elif kind in STREAM_TYPES:
            capturing = kind in _CAPTURE_TYPES or entry.capturing
            if not entry.started or capturing != entry.capturing:
                # Only a change can make a waiting request active: a reply's
                # every chunk is no reason to look again.
                entry.started = True
                entry.capturing = capturing
                self._changed()

    def reset(self, session: object = None) -> None:
        """
        A session began or ended: what RPEngine held went with it.
        """
        self._order.clear()
        self._empty = False

    def isActive(self, requestId: str) -> bool:
        """
        Whether RPEngine is working on C{requestId} now (see the module's
        rules); C{False} for a request it has not accepted.
        """
        entry = self._order.get(requestId)
        if entry is None:
            return False
        if entry.started or entry.capturing or self._empty:
            return True
        for other, ahead in self._order.items():
            if other == requestId:
                return True
            if not ahead.capturing:
                return False
        return False

    def position(self, requestId: str) -> int | None:
        """
        How many open replies RPEngine accepted before C{requestId}.
        """
        if requestId not in self._order:
            return None
        ahead = 0
        for other, entry in self._order.items():
            if other == requestId:
                return ahead
            if not entry.capturing:
                ahead += 1
        return None

    def whenActive(self, requestId: str, callback: Callable[[], None]) -> None:
        """
        Call C{callback} once, as soon as C{requestId} is RPEngine's active
        request (now, if it already is); never if it ends first.
        """
        if self.isActive(requestId):
            callback()
            return
        self._waiting.setdefault(requestId, []).append(callback)

    def _changed(self) -> None:
        for requestId in [r for r in self._waiting if self.isActive(r)]:
            for callback in self._waiting.pop(requestId, []):
                try:
                    callback()
                except Exception:
                    self.log.failure("a wait for request {requestId} failed", requestId=requestId)
