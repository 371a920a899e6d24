"""
The card cache's chain plugin: chooses each card transfer on the way to
RPEngine, in order, and learns from RPEngine's answers what it holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rpmiddleware.builtin.card_cache.store import ContentStore, Key, Sent, SessionCards, trim
from rpmiddleware.builtin.card_cache.transfers import candidatePatch, reproduces, transferSize
from rpmiddleware.plugin import (
    CARD_FORMAT,
    TERMINAL,
    CanonicalCard,
    CardHasher,
    ChainPlugin,
    Envelope,
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    InvalidCard,
    Timeline,
    applyPatch,
    hasTurns,
    inLaterTurn,
    snapshotTransfer,
    transferDocument,
    transferOperations,
    validateCard,
)

NAME = "card-cache"

#: Messages whose C{card} field this plugin rewrites.
CARD_BEARING = frozenset({"reply.request", "voice.capture.start", "character.sync"})
#: Messages after which RPEngine will not ask for the request's card again:
#: those that end it (the package exports this name).
ENDING = TERMINAL
#: Meta keys that describe one pass through the chain, not the request.
_PASS_META = ("decisions", "enteredAt", "origin")


def _settled(d: Deferred[Any]) -> Any:
    """
    The result of an already fired Deferred (raising its failure), so that
    the chain sees a plain value when no thread was needed.
    """
    box: list[Any] = []
    d.addBoth(box.append)
    result = box[0]
    if isinstance(result, Failure):
        result.raiseException()
    return result


@implementer(IEnvelopePlugin)
class CardCache(ChainPlugin):
    """
    Chooses each card transfer; see the package docstring and
    C{docs/plugins/card-cache.md}.

    @ivar deferred: how many diffs, patch checks and patch applications ran
        in a reactor turn of their own (for tests and the benchmarks).
    """

    name = NAME
    log = Logger()

    def __init__(
        self,
        cards: CardHasher,
        timeline: Timeline,
        storeSize: int = 64,
        deferThreshold: int = 32 * 1024,
        pendingLimit: int = 256,
    ) -> None:
        self._cards = cards
        self._timeline = timeline
        self._threshold = deferThreshold
        self._pendingLimit = pendingLimit
        self.store = ContentStore(storeSize)
        self._session = SessionCards()
        self._busy = False
        self._waiting: deque[tuple[Envelope, IChainContext, Deferred[Any]]] = deque()
        self.deferred = 0

    # Sessions.

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self._session = self._fresh()

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self._session = self._fresh()

    def _fresh(self) -> SessionCards:
        """
        A new session holds no card, but the requests still on their way
        stay known: over RPEngine's file mailbox a new RPEngine tab reads
        what was written for the old session before its own handshake
        (src/filesystem-mailbox-adapter.ts connect, then poll), so a
        reference meant for the old one can come back as
        C{card_resync_required} in the new one, and is healed as ever.
        """
        return SessionCards(sent=self._session.sent)

    def held(self) -> dict[Key, str]:
        """
        The card (by our hash) RPEngine holds, or is about to hold, for each
        C{(integrationId, characterId)} in the current session.
        """
        return dict(self._session.held)

    # Game to engine, in order.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        if self._busy or self._waiting:
            held: Deferred[Any] = Deferred()
            self._waiting.append((envelope, context, held))
            return held
        d = Deferred.fromCoroutine(self._outgoing(envelope, context))
        if d.called:
            return _settled(d)
        held = Deferred()
        self._busy = True
        d.addBoth(self._settle, held)
        return held

    def _settle(self, result: Any, held: Deferred[Any]) -> None:
        self._busy = False
        if isinstance(result, Failure):
            held.errback(result)
        else:
            held.callback(result)
        while self._waiting and not self._busy:
            envelope, context, nextHeld = self._waiting.popleft()
            d = Deferred.fromCoroutine(self._outgoing(envelope, context))
            if d.called:
                d.addBoth(self._release, nextHeld)
            else:
                self._busy = True
                d.addBoth(self._settle, nextHeld)

    def _release(self, result: Any, held: Deferred[Any]) -> None:
        if isinstance(result, Failure):
            held.errback(result)
        else:
            held.callback(result)

    async def _outgoing(self, envelope: Envelope, context: IChainContext) -> Envelope | None:
        transfer = envelope.get("card")
        if envelope.type not in CARD_BEARING or not isinstance(transfer, dict):
            return envelope
        try:
            targetHash, card = await self._resolve(transfer, context)
        except InvalidCard as e:
            self._refuse(envelope, context, str(e))
            return None
        key = (str(envelope.get("integrationId", "")), str(envelope.get("characterId", "")))
        if targetHash is None or (card is None and self._session.held.get(key) != targetHash):
            self._note(envelope, transfer)
            return envelope
        chosen = await self._cheapest(key, targetHash, card, context)
        envelope["card"] = chosen
        self._remember(envelope, key, chosen, card, targetHash)
        self._note(envelope, chosen, card)
        return envelope

    async def _resolve(
        self, transfer: Mapping[str, Any], context: IChainContext
    ) -> tuple[str | None, CanonicalCard | None]:
        """
        The target hash and canonical card a transfer stands for; the card
        is C{None} when this plugin does not know it.

        @raise InvalidCard: for a snapshot that is no valid card.
        """
        mode = transfer.get("mode")
        given = transfer.get("targetHash")
        if mode == "snapshot":
            document = transferDocument(transfer)
            if document is None:
                return None, None
            validateCard(document)
            card = await self._canonical(document)
            if given != card.hash:
                self.log.warn(
                    "snapshot targetHash {given} is not the card's canonical hash {actual}; "
                    "corrected",
                    given=given,
                    actual=card.hash,
                )
            return card.hash, self.store.put(card)
        if not isinstance(given, str):
            return None, None
        known = self.store.get(given)
        if known is not None:
            return given, known
        if mode == "patch":
            return given, await self._patched(transfer, given, context)
        return given, None

    async def _patched(
        self, transfer: Mapping[str, Any], targetHash: str, context: IChainContext
    ) -> CanonicalCard | None:
        """
        Learn the target of an incoming patch whose base this plugin knows, so
        that it can become a snapshot in a session that lacks the base.
        """
        base = self.store.get(transfer.get("baseHash"))
        operations = transferOperations(transfer)
        if base is None or operations is None:
            return None
        try:
            document = await self._inOwnTurn(
                base.size, context, applyPatch, base.document, operations
            )
            validateCard(document)
            # A new document made only for us: nobody else holds it.
            document = self._cards.adopt(document)
            card = await self._canonical(document)
        except Exception:
            # RPEngine judges a patch that does not apply; we pass it on.
            return None
        return self.store.put(card) if card.hash == targetHash else None

    async def _canonical(self, document: dict[str, Any]) -> CanonicalCard:
        try:
            return await self._cards.canonical(document)
        except ValueError as e:
            raise InvalidCard("card", f"is not canonical JSON ({e})")

    async def _cheapest(
        self,
        key: Key,
        targetHash: str,
        card: CanonicalCard | None,
        context: IChainContext,
    ) -> dict[str, Any]:
        session = self._session
        heldHash = session.held.get(key)
        if heldHash == targetHash or card is None:
            return {
                "format": CARD_FORMAT,
                "mode": "reference",
                "targetHash": session.engineHashOf(targetHash),
            }
        base = self.store.get(heldHash) if heldHash is not None else None
        # A patch needs RPEngine's hash of the result; where it hashed the
        # base differently from us, we cannot know it.
        trusted = heldHash not in session.engineHash and targetHash not in session.engineHash
        if heldHash is not None and base is not None and trusted:
            # Diff and check in turns of their own: each is a few ms for a large card.
            operations = await self._inOwnTurn(card.size, context, candidatePatch, base, card)
            if operations is not None and not await self._inOwnTurn(
                card.size, context, reproduces, base, card, operations
            ):
                operations = None
            # The session may have changed while the reactor served others.
            if self._session is not session or session.held.get(key) != heldHash:
                return await self._cheapest(key, targetHash, card, context)
            if operations is not None:
                return {
                    "format": CARD_FORMAT,
                    "mode": "patch",
                    "baseHash": heldHash,
                    "targetHash": targetHash,
                    "patch": operations,
                }
        return self._snapshot(card, targetHash)

    def _snapshot(self, card: CanonicalCard, targetHash: str) -> dict[str, Any]:
        """
        A snapshot, with C{targetHash} unless RPEngine hashes this card
        differently (it is optional: RPEngine computes it).
        """
        differs = targetHash in self._session.engineHash
        return snapshotTransfer(card.document, None if differs else targetHash)

    async def _inOwnTurn(
        self, size: int, context: IChainContext, work: Callable[..., Any], *args: Any
    ) -> Any:
        """
        C{work(*args)} in a reactor turn of its own when the card is large,
        so that the turn that received the card and this one each stay
        short (L{rpmiddleware.runtime.reactorturn}); inline for small cards.
        """
        if size <= self._threshold or not hasTurns(context.reactor):
            return work(*args)
        self.deferred += 1
        return await inLaterTurn(context.reactor, work, *args)

    def _remember(
        self,
        envelope: Envelope,
        key: Key,
        chosen: dict[str, Any],
        card: CanonicalCard | None,
        ourHash: str,
    ) -> None:
        session = self._session
        mode = chosen["mode"]
        if mode != "reference":
            # RPEngine resolves in order: what follows finds this card there.
            session.held[key] = ourHash
        requestId = envelope.requestId
        if requestId is None:
            if envelope.type == "character.sync":
                session.syncs[key] = ourHash
            return
        fields = {k: v for k, v in envelope.fields.items() if k not in ("messageId", "sessionId")}
        meta = {k: v for k, v in envelope.meta.items() if k not in _PASS_META}
        session.sent.pop(requestId, None)
        session.sent[requestId] = Sent(
            fields, meta, key, ourHash, mode, chosen.get("baseHash"), card
        )
        trim(session.sent, self._pendingLimit)

    def _note(
        self, envelope: Envelope, transfer: Any, card: CanonicalCard | None = None, **extra: Any
    ) -> None:
        requestId = envelope.requestId
        if requestId is not None:
            mode = transfer.get("mode") if isinstance(transfer, dict) else None
            self._timeline.note(
                requestId, cardMode=mode, cardBytes=transferSize(transfer, card), **extra
            )

    def _refuse(self, envelope: Envelope, context: IChainContext, message: str) -> None:
        self.log.warn(
            "refusing {type} {requestId}: {message}",
            type=envelope.type,
            requestId=envelope.requestId,
            message=message,
        )
        fields: dict[str, Any] = {
            "code": "invalid_character_card",
            "message": message,
            "retryable": False,
        }
        if envelope.requestId is not None:
            fields["requestId"] = envelope.requestId
        if envelope.messageId is not None:
            fields["sourceMessageId"] = envelope.messageId
        session = context.session
        answer = Envelope.build("request.error", session.sessionId if session else None, **fields)
        answer.meta["synthetic"] = True
        context.sendToGame(answer)

    # Engine to game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        session = self._session
        requestId = envelope.requestId
        if kind == "reply.accepted" and requestId is not None:
            sent = session.sent.pop(requestId, None)
            if sent is not None:
                self._learn(sent.targetHash, envelope.get("resolvedCardHash"), sent.key)
        elif kind == "character.synced":
            self._synced(envelope)
        elif kind == "request.error" and requestId is not None:
            if envelope.get("code") == "card_resync_required":
                return self._resync(envelope, requestId, context)
            session.sent.pop(requestId, None)
        elif kind in ENDING and requestId is not None:
            session.sent.pop(requestId, None)
        return envelope

    def _learn(self, ourHash: str, resolved: Any, key: Key) -> None:
        session = self._session
        if isinstance(resolved, str) and resolved and resolved != session.engineHashOf(ourHash):
            self.log.warn(
                "RPEngine hashes card {ourHash} as {resolved}; its hash is used from now on",
                ourHash=ourHash,
                resolved=resolved,
            )
        session.learn(ourHash, resolved, key)

    def _synced(self, envelope: Envelope) -> None:
        integrationId, characterId = envelope.get("integrationId"), envelope.get("characterId")
        if not (isinstance(integrationId, str) and isinstance(characterId, str)):
            return
        key = (integrationId, characterId)
        ourHash = self._session.syncs.pop(key, None)
        if ourHash is not None:
            self._learn(ourHash, envelope.get("targetHash"), key)

    def _resync(self, error: Envelope, requestId: str, context: IChainContext) -> Envelope | None:
        """
        RPEngine lost a card we thought it had: forget it and send the request
        again, once, with the whole card.
        """
        session = self._session
        sent = session.sent.get(requestId)
        if sent is not None:
            session.forget(sent.key)
        if sent is None or sent.resent or sent.card is None:
            session.sent.pop(requestId, None)
            return error
        # Without targetHash: should RPEngine hash this card differently from
        # us, the snapshot is still taken, and reply.accepted says its hash.
        transfer = snapshotTransfer(sent.card.document, None)
        again = Envelope({**sent.fields, "card": transfer}, dict(sent.meta))
        again.meta["cardResync"] = True
        sent.resent, sent.mode, sent.baseHash = True, "snapshot", None
        session.held[sent.key] = sent.targetHash
        self.log.info(
            "RPEngine asked for card {targetHash} again; resending {requestId} with a snapshot",
            targetHash=sent.targetHash,
            requestId=requestId,
        )
        self._note(again, transfer, sent.card, cardResync=True)
        context.sendToEngine(again)
        return None
