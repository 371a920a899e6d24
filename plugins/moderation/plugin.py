"""
The moderation plugin's chain plugin: what it checks of each envelope, and
what it does with what it finds (mask, block or cancel).

Local rules (L{rpmiddleware.builtin.moderation.rules}) run on every piece of
text, including the streamed C{reply.text.delta}s; the remote service
(L{rpmiddleware.builtin.moderation.remote}) classifies whole texts, and
while it decides, the envelope it checks and every later one of its request
wait.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rpmiddleware.builtin.moderation.remote import ModerationService, Verdict
from rpmiddleware.builtin.moderation.rules import CONTEXT_CHARS, Hit, Rules, masked, maskedWhole
from rpmiddleware.builtin.moderation.settings import NAME, ModerationSettings
from rpmiddleware.plugin import (
    CANCELLING,
    OPENING,
    TERMINAL,
    ChainPlugin,
    Envelope,
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    textOfDelta,
)

_DELTA_FIELDS = ("text", "delta", "content")


@dataclass
class _Reply:
    """
    What the plugin keeps about one request's reply.
    """

    requestId: str
    sourceMessageId: str | None = None
    pending: str = ""
    context: str = ""
    nextSequence: int = 0
    textField: str = "text"
    cut: bool = False
    #: While a remote check holds one of this request's envelopes, the ones
    #: after it wait here, so that nothing overtakes it.
    gate: list[tuple[Envelope, Deferred[Any]]] | None = None
    #: The game withdrew the request while its text was being checked.
    withdrawn: bool = False
    held: bool = False


@implementer(IEnvelopePlugin)
class Moderation(ChainPlugin):
    """
    Masks, blocks or cancels text that matches the rules or that the
    remote service flags.
    """

    name = NAME
    #: A bug here must not let unchecked text through: the chain ends the
    #: envelope's request instead of passing it on (rpmiddleware.core.chain).
    failClosed = True
    log = Logger()

    def __init__(
        self, settings: ModerationSettings | None = None, reactor: Any = None, http: Any = None
    ) -> None:
        """
        @param http: what the remote service's requests go through
            (L{ModerationService}); treq on C{reactor} by default.
        """
        self.settings = s = settings or ModerationSettings()
        self.rules = Rules(s.words, s.patterns, s.max_hold_chars)
        self.reactor = reactor
        self._replies: dict[str, _Reply] = {}
        #: The remote service, when C{remote_url} names one.
        self.service = ModerationService(s, reactor, http) if s.remote_url else None

    def close(self) -> Deferred[Any]:
        """
        Close the connections kept open to the remote service.
        """
        if self.service is None:
            return succeed(None)
        return self.service.close()

    # Toward RPEngine: the player's message.

    @property
    def active(self) -> bool:
        """
        Whether there is anything to check with: without rules or a service
        the plugin passes everything and keeps no state.
        """
        return bool(self.rules) or self.service is not None

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        kind, requestId = envelope.type, envelope.requestId
        if requestId is None or not self.active:
            return envelope
        if kind in OPENING:
            self._replies[requestId] = _Reply(requestId, envelope.messageId)
        elif kind in CANCELLING:
            reply = self._replies.get(requestId)
            if reply is not None and reply.held:
                reply.withdrawn = True
                return None
        if kind != "reply.request":
            return envelope
        event = envelope.get("event")
        text = event.get("text") if isinstance(event, dict) else None
        if not isinstance(text, str) or not text:
            return envelope
        assert isinstance(event, dict)
        hits = self.rules.hits(text) if self.rules else []
        if hits:
            if self.settings.inputAction != "mask":
                self._refuse(envelope, context, hits[0].describe())
                return None
            envelope["event"] = event = {
                **event,
                "text": masked(text, hits, self.settings.mask_char),
            }
        if self.service is None:
            return envelope
        return self._holdInput(envelope, context, self.service, text)

    def _holdInput(
        self, envelope: Envelope, context: IChainContext, service: ModerationService, text: str
    ) -> Deferred[Any]:
        reply = self._replies[envelope.requestId or ""]
        reply.held = True

        def decided(verdict: Verdict) -> Envelope | None:
            reply.held = False
            if reply.withdrawn:
                self._answer(envelope, context, "reply.cancelled")
                self._replies.pop(reply.requestId, None)
                return None
            if verdict is None:
                return envelope
            if self.settings.inputAction == "mask":
                envelope["event"] = {
                    **envelope["event"],
                    "text": maskedWhole(text, self.settings.mask_char),
                }
                return envelope
            self._refuse(envelope, context, verdict)
            return None

        return service.check(text).addCallback(decided)

    def _refuse(self, envelope: Envelope, context: IChainContext, reason: str) -> None:
        self._replies.pop(envelope.requestId or "", None)
        self.log.info(
            "moderation blocked the player's message in {requestId}: {reason}",
            requestId=envelope.requestId,
            reason=reason,
        )
        self._answer(
            envelope,
            context,
            "request.error",
            sourceMessageId=envelope.messageId,
            code="content_blocked",
            message=f"the player's message was blocked by moderation: {reason}",
            retryable=False,
        )

    def _answer(self, envelope: Envelope, context: IChainContext, kind: str, **fields: Any) -> None:
        if envelope.requestId is not None:
            fields["requestId"] = envelope.requestId
        fields = {k: v for k, v in fields.items() if v is not None}
        answer = Envelope.build(kind, envelope.sessionId, **fields)
        answer.meta["synthetic"] = True
        context.sendToGame(answer)

    # Toward the game: transcripts and the character's text.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        requestId = envelope.requestId
        if requestId is None or not self.active:
            return envelope
        reply = self._replies.get(requestId)
        if reply is not None and reply.gate is not None:
            waiting: Deferred[Any] = Deferred()
            reply.gate.append((envelope, waiting))
            return waiting
        return self._toGame(envelope, context)

    def _toGame(self, envelope: Envelope, context: IChainContext) -> Any:
        requestId = envelope.requestId or ""
        reply = self._replies.get(requestId)
        if reply is None:
            reply = self._replies[requestId] = _Reply(requestId)
        kind = envelope.type
        terminal = kind in TERMINAL
        if terminal:
            del self._replies[requestId]
        if reply.cut:
            return None
        if kind == "reply.text.delta" and self.rules:
            return self._delta(reply, envelope, context)
        if kind == "reply.accepted" and isinstance(envelope.get("transcript"), str):
            return self._checkText(reply, envelope, context, "transcript", "input")
        if kind == "reply.text.completed" or terminal:
            if not self._release(reply, envelope, context):
                return None
            if kind == "reply.text.completed" and isinstance(envelope.get("text"), str):
                return self._checkText(reply, envelope, context, "text", "output")
        return envelope

    def _delta(self, reply: _Reply, envelope: Envelope, context: IChainContext) -> Envelope | None:
        reply.textField = next(
            (f for f in _DELTA_FIELDS if isinstance(envelope.get(f), str)), "text"
        )
        emitted, hit = self._advance(reply, textOfDelta(envelope.fields), final=False)
        if hit is not None and self.settings.outputAction != "mask":
            self._cut(reply, envelope, context, hit.describe())
            return None
        if not emitted:
            return None
        envelope[reply.textField] = emitted
        envelope["sequence"] = reply.nextSequence
        reply.nextSequence += 1
        return envelope

    def _advance(self, reply: _Reply, piece: str, final: bool) -> tuple[str, Hit | None]:
        text = reply.pending + piece
        hold, hits = self.rules.scan(reply.context, text, final)
        out = text[:hold]
        reply.context = (reply.context + out)[-CONTEXT_CHARS:]
        reply.pending = text[hold:]
        if not hits:
            return out, None
        return masked(out, hits, self.settings.mask_char), hits[0]

    def _release(self, reply: _Reply, current: Envelope, context: IChainContext) -> bool:
        """
        Emit the held tail as one more delta ahead of C{current}; C{False}
        when the tail completed a match that ends the reply.
        """
        if not reply.pending:
            return True
        emitted, hit = self._advance(reply, "", final=True)
        if hit is not None and self.settings.outputAction != "mask":
            self._cut(reply, current, context, hit.describe())
            return False
        delta = Envelope.build(
            "reply.text.delta",
            current.sessionId,
            requestId=reply.requestId,
            sequence=reply.nextSequence,
            **{reply.textField: emitted},
        )
        delta.meta["synthetic"] = True
        reply.nextSequence += 1
        context.sendToGame(delta)
        return True

    def _checkText(
        self,
        reply: _Reply,
        envelope: Envelope,
        context: IChainContext,
        name: str,
        side: str,
    ) -> Any:
        """
        Check a whole text field (a transcript or the completed reply),
        locally and then, if configured, remotely.
        """
        text: str = envelope[name]
        action = self.settings.inputAction if side == "input" else self.settings.outputAction
        hits = self.rules.hits(text) if self.rules else []
        if hits:
            if action != "mask":
                self._cut(reply, envelope, context, hits[0].describe(), side)
                return None
            envelope[name] = masked(text, hits, self.settings.mask_char)
        if self.service is None or not text:
            return envelope

        def decided(verdict: Verdict) -> Envelope | None:
            if reply.cut:
                return None
            if verdict is None:
                return envelope
            if action == "mask":
                envelope[name] = maskedWhole(text, self.settings.mask_char)
                return envelope
            self._cut(reply, envelope, context, verdict, side)
            return None

        return self._gate(reply, context, self.service.check(text), decided)

    def _gate(
        self,
        reply: _Reply,
        context: IChainContext,
        check: Deferred[Verdict],
        decide: Callable[[Verdict], Envelope | None],
    ) -> Deferred[Any]:
        """
        Hold an envelope until C{check} fires, and every later envelope of
        its request behind it.
        """
        reply.gate = []
        held: Deferred[Any] = Deferred()

        def decided(verdict: Verdict) -> None:
            try:
                held.callback(decide(verdict))
            except Exception:
                held.errback(Failure())
            self._drain(reply, context)

        check.addCallback(decided)
        return held

    def _drain(self, reply: _Reply, context: IChainContext) -> None:
        queued, reply.gate = reply.gate or [], None
        while queued:
            if reply.gate is not None:
                # A released envelope started another check: the rest wait again.
                reply.gate.extend(queued)
                return
            envelope, waiting = queued.pop(0)
            try:
                result = self._toGame(envelope, context)
            except Exception:
                waiting.errback(Failure())
                continue
            if isinstance(result, Deferred):
                result.chainDeferred(waiting)
            else:
                waiting.callback(result)

    def _cut(
        self,
        reply: _Reply,
        envelope: Envelope,
        context: IChainContext,
        reason: str,
        side: str = "output",
    ) -> None:
        """
        End a reply: cancel it upstream, drop the rest of it, and tell the game.
        """
        reply.cut = True
        reply.pending = ""
        what = "the player's speech" if side == "input" else "the character's reply"
        self.log.info(
            "moderation stopped {what} in {requestId}: {reason}",
            what=what,
            requestId=reply.requestId,
            reason=reason,
        )
        if envelope.type not in TERMINAL:
            # A terminal from RPEngine means there is nothing left to cancel.
            cancel = Envelope.build("request.cancel", envelope.sessionId, requestId=reply.requestId)
            cancel.meta["synthetic"] = True
            context.sendToEngine(cancel)
        self._answer(
            envelope,
            context,
            "request.error",
            sourceMessageId=reply.sourceMessageId,
            code="content_blocked",
            message=f"{what} was stopped by moderation: {reason}",
            retryable=False,
        )

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self._replies = {k: r for k, r in self._replies.items() if r.held or r.gate is not None}
