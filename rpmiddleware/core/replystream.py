"""
Reply streams: the Python API's handle on one turn.

In-process integrations (a game written in Python, the client endpoint, the
demo) ask L{rpmiddleware.core.middleware.Middleware} for a reply and get a
L{ReplyStream}: every envelope of that request as it arrives, a Deferred for
the end, and a way to cancel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from zope.interface import implementer

from rpmiddleware.plugin.interfaces import IReplyStream
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import TERMINAL, textOfDelta

StreamObserver = Callable[[Envelope], None]


class ReplyFailed(Exception):
    """
    RPEngine (or the middleware on its behalf) ended the request with
    C{request.error}.
    """

    def __init__(self, envelope: Envelope) -> None:
        self.envelope = envelope
        self.code = str(envelope.get("code", "request_failed"))
        self.message = str(envelope.get("message", ""))
        self.retryable = bool(envelope.get("retryable", False))
        super().__init__(f"{self.code}: {self.message}")


class ReplyCancelled(Exception):
    """
    The request ended with C{reply.cancelled}.
    """

    def __init__(self, envelope: Envelope) -> None:
        self.envelope = envelope
        super().__init__(f"request {envelope.requestId} was cancelled")


@implementer(IReplyStream)
class ReplyStream:
    log = Logger()

    def __init__(
        self,
        requestId: str,
        cancel: Callable[[ReplyStream], None],
        retainAudio: bool = True,
        retainText: bool = True,
    ) -> None:
        self.requestId = requestId
        self.retainAudio = retainAudio
        #: Whether text deltas stay in C{envelopes} once someone follows the
        #: stream.  Without, only their text is kept (for L{text}): a reply
        #: of 60 deltas is 60 envelopes the garbage collector passes over
        #: while the turn lasts.
        self.retainText = retainText
        self.envelopes: list[Envelope] = []
        #: The text of deltas not kept as envelopes, in order.
        self._deltaText: list[str] = []
        self.done: Deferred[Envelope] = Deferred()
        self._observers: list[StreamObserver] = []
        self._cancel = cancel
        self.finished = False
        self.cancelRequested = False
        #: What the cancel's C{meta} says besides the request's own (the
        #: speech the player was played: L{rpmiddleware.protocol.meta.PLAYED}).
        self.cancelMeta: dict[str, Any] = {}

    def subscribe(self, observer: StreamObserver) -> None:
        for envelope in self.envelopes:
            observer(envelope)
        if not self.finished:
            self._observers.append(observer)

    def cancel(self, meta: Mapping[str, Any] | None = None) -> None:
        """
        Ask RPEngine to stop this reply.  C{meta} goes on the cancel's
        envelope (never on the wire), for the plugins it passes.
        """
        if self.finished or self.cancelRequested:
            return
        self.cancelRequested = True
        self.cancelMeta = dict(meta or {})
        self._cancel(self)

    def _last(self, kind: str) -> Envelope | None:
        for envelope in reversed(self.envelopes):
            if envelope.type == kind:
                return envelope
        return None

    def text(self) -> str:
        """
        The reply text: RPEngine's complete display text once
        C{reply.text.completed} came (the only text with buffered response
        processing, which sends no deltas), the deltas so far before.
        """
        completed = self._last("reply.text.completed")
        if completed is not None and isinstance(completed.get("text"), str):
            return str(completed["text"])
        if self._deltaText:
            # Deltas kept as envelopes came before the first follower, so
            # before any kept only as text.
            kept = [textOfDelta(e.fields) for e in self.envelopes if e.type == "reply.text.delta"]
            return "".join(kept + self._deltaText)
        return "".join(
            textOfDelta(e.fields) for e in self.envelopes if e.type == "reply.text.delta"
        )

    def extractedContent(self) -> dict[str, list[str]]:
        """
        What the request's C{output.responseProcessing} rules captured, by
        rule id (empty without rules, or before the text completed).
        """
        completed = self._last("reply.text.completed")
        found = completed.get("extractedContent") if completed is not None else None
        return dict(found) if isinstance(found, dict) else {}

    def transcript(self) -> str | None:
        """
        The player's words as RPEngine heard them (voice captures asked with
        C{returnTranscript}, the default of L{Middleware.captureVoice}).
        """
        heard = self._last("voice.capture.transcript")
        return str(heard.get("text")) if heard is not None else None

    def received(self, envelope: Envelope) -> None:
        if self.finished:
            return
        kind = envelope.type
        if kind == "reply.audio.chunk":
            if self.retainAudio:
                self.envelopes.append(envelope)
        elif kind == "reply.text.delta" and not self.retainText and self._observers:
            self._deltaText.append(textOfDelta(envelope.fields))
        else:
            self.envelopes.append(envelope)
        for observer in list(self._observers):
            try:
                observer(envelope)
            except Exception:
                self.log.failure("reply stream observer failed on {type}", type=envelope.type)
        if kind not in TERMINAL:
            return
        self.finished = True
        # Nothing more reaches a finished stream's observers.  Letting them
        # go undoes the cycle a turn makes by following its stream (the turn
        # holds the stream, the stream its bound method), which would
        # otherwise keep every finished turn, its envelopes among them, for
        # the collector's next full pass.
        self._observers = []
        if kind == "reply.completed":
            self.done.callback(envelope)
        elif kind == "reply.cancelled":
            self.done.errback(ReplyCancelled(envelope))
        else:
            self.done.errback(ReplyFailed(envelope))
