"""
The moderation plugin: checks what the player says before RPEngine hears it,
and what the character says before the game shows it.

Local rules (words and regular expressions) run on every piece of text,
including the streamed C{reply.text.delta}s: a word split across two deltas
is still caught because the plugin holds back only the shortest tail that
could still become a match, and emits the rest at once.  An optional remote
service (an OpenAI-compatible C{/v1/moderations} endpoint) classifies whole
texts: the player's message and transcript, and the completed reply.  It does
not see deltas, because a round trip per delta would stall every reply by the
service's latency, and a classifier judges a sentence, not a word piece.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import treq
from treq.client import HTTPClient
from twisted.internet.defer import Deferred, TimeoutError, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool
from zope.interface import implementer

from rpmiddleware.envelope import Envelope
from rpmiddleware.interfaces import (
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IPluginServices,
)
from rpmiddleware.messages import MESSAGES, textOfDelta
from rpmiddleware.plugin import ChainPlugin, PluginFactory, rejectUnknownSettings

NAME = "moderation"
ACTIONS = ("mask", "block", "cancel")
FAIL_POLICIES = ("open", "closed")
#: Raw text already emitted that is kept to find matches that began in it.
CONTEXT_CHARS = 256
_WORD_CHAR = re.compile(r"\w")
_DELTA_FIELDS = ("text", "delta", "content")
_OPENING = ("reply.request", "voice.capture.start")
_WITHDRAWING = ("request.cancel", "voice.capture.cancel")
_KNOWN = {
    "words",
    "patterns",
    "action",
    "input_action",
    "output_action",
    "mask_char",
    "max_hold_chars",
    "remote_url",
    "remote_model",
    "remote_timeout",
    "fail_policy",
}


def _choice(settings: Mapping[str, Any], key: str, choices: Sequence[str], default: str) -> str:
    value = settings.get(key, default)
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _strings(settings: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = settings.get(key, [])
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{key} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class ModerationSettings:
    """
    The plugin's TOML table, checked.
    """

    words: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    action: str = "mask"
    input_action: str = ""
    output_action: str = ""
    mask_char: str = "*"
    max_hold_chars: int = 64
    remote_url: str = ""
    remote_model: str = "omni-moderation-latest"
    remote_timeout: float = 2.0
    fail_policy: str = "open"

    @property
    def inputAction(self) -> str:
        return self.input_action or self.action

    @property
    def outputAction(self) -> str:
        return self.output_action or self.action

    @classmethod
    def fromMapping(cls, settings: Mapping[str, Any]) -> ModerationSettings:
        rejectUnknownSettings(NAME, settings, _KNOWN)
        patterns = _strings(settings, "patterns")
        for index, pattern in enumerate(patterns):
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"patterns[{index}] is not a valid regular expression: {e}")
        maskChar = settings.get("mask_char", cls.mask_char)
        if not isinstance(maskChar, str) or len(maskChar) != 1:
            raise ValueError(f"mask_char must be a single character, got {maskChar!r}")
        hold = settings.get("max_hold_chars", cls.max_hold_chars)
        if type(hold) is not int or hold < 1:
            raise ValueError(f"max_hold_chars must be a positive whole number, got {hold!r}")
        url = settings.get("remote_url", cls.remote_url)
        if not isinstance(url, str) or (url and not url.startswith(("http://", "https://"))):
            raise ValueError(f"remote_url must be an http:// or https:// URL or empty, got {url!r}")
        model = settings.get("remote_model", cls.remote_model)
        if not isinstance(model, str):
            raise ValueError(f"remote_model must be a string, got {model!r}")
        timeout = settings.get("remote_timeout", cls.remote_timeout)
        if type(timeout) not in (int, float) or timeout <= 0:
            raise ValueError(
                f"remote_timeout must be a positive number of seconds, got {timeout!r}"
            )
        return cls(
            words=_strings(settings, "words"),
            patterns=patterns,
            action=_choice(settings, "action", ACTIONS, cls.action),
            input_action=_choice(settings, "input_action", ("", *ACTIONS), ""),
            output_action=_choice(settings, "output_action", ("", *ACTIONS), ""),
            mask_char=maskChar,
            max_hold_chars=hold,
            remote_url=url,
            remote_model=model,
            remote_timeout=float(timeout),
            fail_policy=_choice(settings, "fail_policy", FAIL_POLICIES, cls.fail_policy),
        )


@dataclass(frozen=True)
class Hit:
    """
    One rule matching C{text[start:end]}.
    """

    start: int
    end: int
    rule: str

    def describe(self) -> str:
        kind = "word" if self.rule.startswith("words") else "pattern"
        return f"it matched a blocked {kind} ({self.rule})"


class Rules:
    """
    The local rules, and where a stream of text may safely be cut.
    """

    def __init__(self, words: Sequence[str], patterns: Sequence[str], maxHold: int = 64) -> None:
        self._words = [w.lower() for w in words]
        self._longestWord = max((len(w) for w in words), default=0)
        self._maxHold = maxHold
        self._hasPatterns = bool(patterns)
        self._rules = [
            (f"words[{i}]", re.compile(rf"(?<!\w){re.escape(w)}(?!\w)", re.IGNORECASE))
            for i, w in enumerate(words)
        ] + [(f"patterns[{i}]", re.compile(p)) for i, p in enumerate(patterns)]

    def __bool__(self) -> bool:
        return bool(self._rules)

    def hits(self, text: str) -> list[Hit]:
        found = [
            Hit(m.start(), m.end(), name)
            for name, regex in self._rules
            for m in regex.finditer(text)
            if m.end() > m.start()
        ]
        return sorted(found, key=lambda h: (h.start, h.end))

    def scan(self, context: str, text: str, final: bool) -> tuple[int, list[Hit]]:
        """
        How much of C{text} may be emitted now, and the matches inside that
        part (clipped to it, relative to C{text}).

        @param context: raw text already emitted just before C{text}, so
            that word boundaries and matches that began there are seen.
        @param final: no more text follows: everything may be emitted.
        """
        full = context + text
        offset, end = len(context), len(full)
        hold = end
        confirmed = []
        for hit in self.hits(full):
            if hit.end <= offset:
                continue
            if not final and hit.end == end:
                # More text could still extend it or undo it ("darn" + "ed").
                hold = min(hold, max(hit.start, offset))
            else:
                confirmed.append(hit)
        if not final:
            hold = min(hold, self._possibleStart(full, offset))
        return hold - offset, [
            Hit(max(h.start, offset) - offset, min(h.end, hold) - offset, h.rule)
            for h in confirmed
            if max(h.start, offset) < hold
        ]

    def _possibleStart(self, full: str, offset: int) -> int:
        """
        The earliest position at or after C{offset} where a match could
        begin that more text would complete.
        """
        end = len(full)
        start = end
        for i in range(max(offset, end - self._longestWord + 1), end):
            if i > 0 and _WORD_CHAR.match(full[i - 1]):
                continue
            tail = full[i:].lower()
            if any(len(w) > len(tail) and w.startswith(tail) for w in self._words):
                start = i
                break
        if self._hasPatterns and end > offset and _WORD_CHAR.match(full[-1]):
            # Regular expressions cannot say what could still match: hold
            # the unfinished last word, as far back as max_hold_chars.
            word = end
            while word > max(offset, end - self._maxHold) and _WORD_CHAR.match(full[word - 1]):
                word -= 1
            start = min(start, word)
        return start


def _timedOut(result: Any, timeout: float) -> Failure:
    """
    Whatever the cancelled request failed with (treq wraps the cancellation
    in ResponseNeverReceived), the cause was the timeout.
    """
    return Failure(TimeoutError(f"no answer within {timeout:g} s"))


def masked(text: str, hits: Sequence[Hit], char: str) -> str:
    chars = list(text)
    for hit in hits:
        chars[hit.start : hit.end] = char * (hit.end - hit.start)
    return "".join(chars)


def maskedWhole(text: str, char: str) -> str:
    """
    A text the remote service flagged as a whole: every visible character.
    """
    return re.sub(r"\S", char, text)


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


Verdict = str | None


@implementer(IEnvelopePlugin)
class Moderation(ChainPlugin):
    """
    Masks, blocks or cancels text that matches the rules or that the
    remote service flags.
    """

    name = NAME
    log = Logger()

    def __init__(self, settings: ModerationSettings | None = None, reactor: Any = None) -> None:
        self.settings = s = settings or ModerationSettings()
        self.rules = Rules(s.words, s.patterns, s.max_hold_chars)
        self.reactor = reactor
        self._replies: dict[str, _Reply] = {}
        self._pool: HTTPConnectionPool | None = None
        self._client: HTTPClient | None = None
        if s.remote_url:
            if reactor is None:
                raise ValueError("remote_url needs a reactor")
            # Persistent connections: a check should not pay a TCP handshake.
            self._pool = HTTPConnectionPool(reactor, persistent=True)
            self._client = HTTPClient(Agent(reactor, pool=self._pool))

    def close(self) -> Deferred[Any]:
        """
        Close the connections kept open to the remote service.
        """
        if self._pool is None:
            return succeed(None)
        return self._pool.closeCachedConnections()

    # The remote service.

    def _checkRemotely(self, text: str) -> Deferred[Verdict]:
        """
        Fires with C{None} when C{text} may pass, else with the reason it
        may not; never fails.
        """
        assert self._client is not None
        s = self.settings
        body = {"input": text, "model": s.remote_model}
        d: Deferred[Any] = self._client.post(s.remote_url, json=body)
        d.addCallback(self._readVerdict)
        d.addTimeout(s.remote_timeout, self.reactor, onTimeoutCancel=_timedOut)
        return d.addErrback(self._remoteFailed)

    def _readVerdict(self, response: Any) -> Deferred[Verdict]:
        def parse(content: bytes) -> Verdict:
            if response.code != 200:
                raise ValueError(f"HTTP {response.code}")
            try:
                flagged = json.loads(content)["results"][0]["flagged"]
            except (ValueError, LookupError, TypeError):
                raise ValueError("an answer without results[0].flagged")
            if not isinstance(flagged, bool):
                raise ValueError("results[0].flagged is not a boolean")
            return "it was flagged by the moderation service" if flagged else None

        return treq.content(response).addCallback(parse)

    def _remoteFailed(self, failure: Failure) -> Verdict:
        if failure.check(TimeoutError):
            why = f"no answer within {self.settings.remote_timeout:g} s"
        else:
            why = str(failure.value) or type(failure.value).__name__
        closed = self.settings.fail_policy == "closed"
        self.log.warn(
            "the moderation service failed ({why}); fail_policy is {policy}, so the text {result}",
            why=why,
            policy=self.settings.fail_policy,
            result="is treated as flagged" if closed else "passes",
        )
        if closed:
            return f"the moderation service could not check it ({why}) and fail_policy is closed"
        return None

    # Toward RPEngine: the player's message.

    @property
    def active(self) -> bool:
        """
        Whether there is anything to check with: without rules or a service
        the plugin passes everything and keeps no state.
        """
        return bool(self.rules) or self._client is not None

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        kind, requestId = envelope.type, envelope.requestId
        if requestId is None or not self.active:
            return envelope
        if kind in _OPENING:
            self._replies[requestId] = _Reply(requestId, envelope.messageId)
        elif kind in _WITHDRAWING:
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
        if self._client is None:
            return envelope
        return self._holdInput(envelope, context, text)

    def _holdInput(self, envelope: Envelope, context: IChainContext, text: str) -> Deferred[Any]:
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

        return self._checkRemotely(text).addCallback(decided)

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
        spec = MESSAGES.get(kind)
        terminal = spec is not None and spec.terminal
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
        if self._client is None or not text:
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

        return self._gate(reply, context, self._checkRemotely(text), decided)

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
        spec = MESSAGES.get(envelope.type)
        if spec is None or not spec.terminal:
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


def _build(settings: Mapping[str, Any], services: IPluginServices) -> Moderation:
    return Moderation(ModerationSettings.fromMapping(settings), services.reactor)


moderation = PluginFactory(
    NAME,
    "Masks, blocks or cancels player and character text by word lists, patterns or a service.",
    _build,
)
