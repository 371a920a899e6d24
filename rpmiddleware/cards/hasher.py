"""
Canonical cards: each card document the middleware owns, with its hash.

A card's identity on the wire is the SHA-256 of RPEngine's canonical JSON
(L{rpmiddleware.cards.canonical}).  A client sends its card once and plays it for
hours; the Python API's game may send the same dict every turn.  Reading a
200 KB card costs milliseconds, so the hasher reads each card the middleware
owns once and finds it by identity afterwards.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorFromThreads, IReactorThreads
from twisted.internet.threads import deferToThreadPool

from rpmiddleware.cards.canonical import canonicalHash, isPlain, sortedJson
from rpmiddleware.runtime.reactorturn import inLaterTurn


class OwnedDocument(dict[str, Any]):
    """
    A card document the middleware owns: a dict that can be weakly
    referenced, so that L{CardHasher} remembers its hash exactly as long as
    something else keeps it.
    """

    __slots__ = ("__weakref__",)


@dataclass(frozen=True, eq=False)
class CanonicalCard:
    """
    A card document the middleware owns, with its canonical hash and its
    size in bytes of compact JSON.

    Owned means nobody changes C{document} again: that is what lets every
    later turn find the hash by identity in a microsecond instead of reading
    the whole card.  Documents in card transfers are shared this way; a
    plugin that wants another card builds a new one.
    """

    document: OwnedDocument
    hash: str
    size: int
    #: Whether the C encoder wrote it (L{rpmiddleware.cards.canonical.isPlain}).
    plain: bool = False


#: What a hasher remembers of an owned document: hash, size, plain.
_Facts = tuple[str, int, bool]


class CardHasher:
    """
    Canonical cards for documents, found by identity for owned ones.

    An L{OwnedDocument} (from L{adopt}, or in a L{CanonicalCard}) is never
    changed again, so its hash is computed once and then found by identity,
    for as long as something keeps the document.  Any other document may be
    a game's dict that changes in place between turns, so it is read each
    time: written as sorted JSON at once (the state the caller meant, about
    1.5 ms for 200 KB), and for a card of C{largeCard} bytes or more, parsed
    into a private copy in a later reactor turn and checked and hashed in the
    one after (about 1 ms each), so that no turn is long.  The rare card that needs the
    pure-Python canonical encoder (floats, unusual keys) is hashed in the
    reactor's thread pool when large, and its hash remembered by content.

    Hashes follow the JSON the card is written as on the wire: a key that is
    not a string, which JSON writes as a string, is hashed as that string.

    @param reactor: for later turns (any L{IReactorTime}: a test's Clock
        runs them when advanced) and its thread pool (if it has one);
        C{None} keeps everything on the calling turn.
    @param cacheSize: how many hashes of slow-encoder cards to remember by
        content (owned documents are remembered while they live).
    """

    def __init__(
        self, reactor: object = None, largeCard: int = 32 * 1024, cacheSize: int = 256
    ) -> None:
        self._reactor = reactor
        self._large = largeCard
        self._cacheSize = cacheSize
        self._owned: dict[int, tuple[weakref.ref[OwnedDocument], _Facts | None]] = {}
        self._slow: OrderedDict[bytes, str] = OrderedDict()
        #: How many canonical encodings this hasher has computed.
        self.computed = 0

    def adopt(self, document: dict[str, Any]) -> OwnedDocument:
        """
        Take ownership of C{document}, which the caller promises nobody will
        change again, and return the document to keep in its place (itself,
        or a new top-level dict over the same contents): its hash will be
        found by identity, and it needs no private copy.
        """
        if not isinstance(document, OwnedDocument):
            document = OwnedDocument(document)
        if id(document) not in self._owned:
            self._keep(document, None)
        return document

    def known(self, document: Any) -> CanonicalCard | None:
        """
        The canonical card for an owned C{document} already hashed, else
        C{None}; never reads the document.
        """
        owned = self._ownedOrNone(document)
        facts = None if owned is None else self._owned[id(owned)][1]
        return None if owned is None or facts is None else CanonicalCard(owned, *facts)

    def canonical(self, document: dict[str, Any]) -> Deferred[CanonicalCard]:
        """
        The canonical card for C{document}: itself if owned, else a private
        copy of it as it is now.

        @raise ValueError: (in the Deferred) for a document RPEngine cannot
            represent.
        """
        found = self.known(document)
        if found is not None:
            return succeed(found)
        try:
            text = sortedJson(document)
        except (TypeError, ValueError) as e:
            return fail(ValueError(f"cannot be written as JSON: {e}"))
        owned = self._ownedOrNone(document)
        if len(text) < self._large:
            return self._deferred(text, _parse(text) if owned is None else owned, False)
        if owned is not None:
            return inLaterTurn(self._reactor, self._deferred, text, owned, True)

        # Parsing the copy and checking it are a turn each (~1 ms per 100 KB).
        def check(copy: OwnedDocument) -> Deferred[CanonicalCard]:
            return inLaterTurn(self._reactor, self._deferred, text, copy, True)

        return inLaterTurn(self._reactor, _parse, text).addCallback(check)

    def canonicalNow(self, document: dict[str, Any]) -> CanonicalCard:
        """
        L{canonical} on this turn and thread, whatever the card's size.
        """
        found = self.known(document)
        if found is not None:
            return found
        try:
            text = sortedJson(document)
        except (TypeError, ValueError) as e:
            raise ValueError(f"cannot be written as JSON: {e}")
        owned = self._ownedOrNone(document)
        card = self._fromText(text, _parse(text) if owned is None else owned, False)
        assert isinstance(card, CanonicalCard)
        return card

    def withData(self, base: dict[str, Any], changes: dict[str, str]) -> CanonicalCard:
        """
        The canonical card for a copy of C{base} with some C{data} fields set
        to strings (a new owned document sharing the rest of C{base}): for a
        plugin that rewrites a card's text on every request, as the memory
        plugin does.  When C{base} is owned and already hashed as plain, so
        is the copy, which spares a walk of the whole card each time.
        """
        data = base.get("data")
        document = OwnedDocument(base)
        document["data"] = {**(data if isinstance(data, dict) else {}), **changes}
        found = self.known(base)
        if found is None:
            # Not the middleware's: the copy may share what a game changes.
            return self.canonicalNow(document)
        simple = all(type(k) is str and k.isascii() and type(v) is str for k, v in changes.items())
        if not found.plain or not simple:
            return self.canonicalNow(self.adopt(document))
        try:
            encoded = sortedJson(document).encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate: the canonical encoder refuses it in its own words.
            return self.canonicalNow(self.adopt(document))
        return self._card(document, hashlib.sha256(encoded).hexdigest(), len(encoded), True)

    def hash(self, document: dict[str, Any]) -> Deferred[str]:
        """
        The canonical hash of C{document}.
        """
        return self.canonical(document).addCallback(lambda card: card.hash)

    def hashNow(self, document: dict[str, Any]) -> str:
        """
        The canonical hash of C{document}, computed on this turn.
        """
        return self.canonicalNow(document).hash

    def _ownedOrNone(self, document: Any) -> OwnedDocument | None:
        entry = self._owned.get(id(document))
        if entry is not None and entry[0]() is document:
            assert isinstance(document, OwnedDocument)
            return document
        return None

    def _deferred(
        self, text: str, document: OwnedDocument, threads: bool
    ) -> Deferred[CanonicalCard]:
        try:
            card = self._fromText(text, document, threads)
        except Exception:
            return fail()
        return card if isinstance(card, Deferred) else succeed(card)

    def _fromText(
        self, text: str, document: OwnedDocument, threads: bool
    ) -> CanonicalCard | Deferred[CanonicalCard]:
        """
        The canonical card for C{document} (owned, or a private copy parsed
        from C{text}), which C{text} was written from.
        """
        if isPlain(document):
            try:
                encoded = text.encode("utf-8")
            except UnicodeEncodeError:
                pass  # a lone surrogate: the canonical encoder refuses it in its own words
            else:
                return self._card(document, hashlib.sha256(encoded).hexdigest(), len(encoded), True)
        raw = text.encode("utf-8", "surrogatepass")
        size, key = len(raw), hashlib.sha256(raw).digest()
        cached = self._slow.get(key)
        if cached is not None:
            return self._card(document, cached, size, False)
        reactor = self._reactor
        if (
            threads
            and IReactorThreads.providedBy(reactor)
            and IReactorFromThreads.providedBy(reactor)
        ):
            d = deferToThreadPool(
                reactor,  # type: ignore[arg-type]
                reactor.getThreadPool(),  # type: ignore[attr-defined]
                canonicalHash,
                document,
            )
            return d.addCallback(self._slowCard, document, key, size)
        return self._slowCard(canonicalHash(document), document, key, size)

    def _slowCard(
        self, value: str, document: OwnedDocument, key: bytes, size: int
    ) -> CanonicalCard:
        self._slow[key] = value
        self._slow.move_to_end(key)
        while len(self._slow) > self._cacheSize:
            self._slow.popitem(last=False)
        return self._card(document, value, size, False)

    def _card(self, document: OwnedDocument, value: str, size: int, plain: bool) -> CanonicalCard:
        self.computed += 1
        self._keep(document, (value, size, plain))
        return CanonicalCard(document, value, size, plain)

    def _keep(self, document: OwnedDocument, facts: _Facts | None) -> None:
        key = id(document)

        def forget(ref: weakref.ref[OwnedDocument]) -> None:
            # The id may already belong to a newer document.
            if self._owned.get(key, (None,))[0] is ref:
                del self._owned[key]

        self._owned[key] = (weakref.ref(document, forget), facts)


def _parse(text: str) -> OwnedDocument:
    """
    A private copy of a card from its sorted JSON: the state the caller
    gave, whatever has happened to its dict since.
    """
    return OwnedDocument(json.loads(text))
