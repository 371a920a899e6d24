"""
Character Card V2 documents: validation and the canonical hash RPEngine checks.

A card's identity on the wire is the lowercase SHA-256 of its RFC 8785
canonical JSON (L{rpmiddleware.canonical}).  L{CardHasher} gives each card
document the middleware owns a L{CanonicalCard}, so that a card sent on
every turn is read once, not on every turn.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IReactorFromThreads, IReactorThreads
from twisted.internet.threads import deferToThreadPool

from rpmiddleware.canonical import canonicalJson, plainJson

CARD_FORMAT = "chara_card_v2"
CARD_SPEC_VERSION = "2.0"

#: The fields of C{data} that Character Card V2 requires, and their JSON types.
REQUIRED_DATA_FIELDS: dict[str, type] = {
    "name": str,
    "description": str,
    "personality": str,
    "scenario": str,
    "first_mes": str,
    "mes_example": str,
    "creator_notes": str,
    "system_prompt": str,
    "post_history_instructions": str,
    "alternate_greetings": list,
    "tags": list,
    "creator": str,
    "character_version": str,
    "extensions": dict,
}


class InvalidCard(ValueError):
    """
    A card that is not a valid Character Card V2; C{field} names the culprit.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid character card: {field} {problem}")
        self.field = field
        self.problem = problem


_JSON_TYPE_NAMES: dict[type, str] = {str: "a string", list: "an array", dict: "an object"}


def _jsonType(value: type) -> str:
    return _JSON_TYPE_NAMES[value]


def validateCard(document: Any) -> dict[str, Any]:
    """
    Check a Character Card V2 document and return it unchanged.

    Unknown fields and extension data are allowed anywhere and kept as they
    are: the seed promises they are preserved.

    @raise InvalidCard: naming the first field that is wrong.
    """
    if not isinstance(document, dict):
        raise InvalidCard("card", "must be a JSON object")
    if document.get("spec") != CARD_FORMAT:
        raise InvalidCard("spec", f"must be {CARD_FORMAT!r}, got {document.get('spec')!r}")
    if document.get("spec_version") != CARD_SPEC_VERSION:
        raise InvalidCard(
            "spec_version",
            f"must be {CARD_SPEC_VERSION!r}, got {document.get('spec_version')!r}",
        )
    data = document.get("data")
    if not isinstance(data, dict):
        raise InvalidCard("data", "must be an object")
    for name, kind in REQUIRED_DATA_FIELDS.items():
        if name not in data:
            raise InvalidCard(f"data.{name}", "is missing (use an empty value if you have none)")
        if not isinstance(data[name], kind):
            raise InvalidCard(f"data.{name}", f"must be {_jsonType(kind)}")
    for listName in ("alternate_greetings", "tags"):
        for i, item in enumerate(data[listName]):
            if not isinstance(item, str):
                raise InvalidCard(f"data.{listName}[{i}]", "must be a string")
    book = data.get("character_book")
    if book is not None:
        if not isinstance(book, dict):
            raise InvalidCard("data.character_book", "must be an object")
        entries = book.get("entries")
        if not isinstance(entries, list):
            raise InvalidCard("data.character_book.entries", "must be an array")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise InvalidCard(f"data.character_book.entries[{i}]", "must be an object")
            if not isinstance(entry.get("keys"), list):
                raise InvalidCard(f"data.character_book.entries[{i}].keys", "must be an array")
            if not isinstance(entry.get("content"), str):
                raise InvalidCard(f"data.character_book.entries[{i}].content", "must be a string")
    return document


def canonicalHash(document: Any) -> str:
    """
    Lowercase hex SHA-256 over the RFC 8785 canonical JSON of C{document}.
    """
    return hashlib.sha256(canonicalJson(document)).hexdigest()


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
    #: Whether the C encoder wrote it (L{rpmiddleware.canonical.plainJson}).
    plain: bool = False


#: What a hasher remembers of an owned document: hash, size, plain.
_Facts = tuple[str, int, bool]


def _contentKey(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class CardHasher:
    """
    Canonical cards: hashes and private copies, found by identity for
    documents the middleware owns.

    An L{OwnedDocument} (from L{adopt}, or in a L{CanonicalCard}) is never
    changed again, so its hash is computed once and then found by identity,
    for as long as something keeps the document.  Any other document may be
    a game's dict that changes in place between turns, so its canonical JSON
    is computed each time (about 3 ms for 200 KB, see
    L{rpmiddleware.canonical}) and a private copy is made from it.  The rare
    card that needs the pure-Python RFC 8785 encoder (floats, unusual keys)
    is canonicalised in the reactor's thread pool when it is larger than
    C{threadThreshold} bytes, and its hash is also remembered by content.

    @param reactor: for its thread pool; C{None} (tests with a fake reactor)
        keeps everything on the calling thread.
    """

    def __init__(
        self,
        reactor: IReactorThreads | None = None,
        threadThreshold: int = 32 * 1024,
        cacheSize: int = 256,
    ) -> None:
        self._reactor = reactor
        self._threshold = threadThreshold
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
        facts = self._facts(document)
        return None if facts is None else CanonicalCard(document, *facts)

    def canonical(self, document: dict[str, Any]) -> Deferred[CanonicalCard]:
        """
        The canonical card for C{document}: itself if owned, else a private
        copy.

        @raise ValueError: (in the Deferred) for a document RFC 8785 cannot
            represent.
        """
        found = self.known(document)
        if found is not None:
            return succeed(found)
        fast = self._fast(document)
        if fast is not None:
            return succeed(fast)
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        key = _contentKey(text)
        cachedHash = self._slow.get(key)
        reactor = self._reactor
        if (
            cachedHash is not None
            or reactor is None
            or len(text) < self._threshold
            or not IReactorThreads.providedBy(reactor)
            or not IReactorFromThreads.providedBy(reactor)
        ):
            try:
                return succeed(self._slowCard(document, text, key, cachedHash))
            except Exception:
                return fail()
        d = deferToThreadPool(
            reactor,  # type: ignore[arg-type]
            reactor.getThreadPool(),
            canonicalHash,
            document,
        )
        return d.addCallback(lambda value: self._slowCard(document, text, key, value))

    def canonicalNow(self, document: dict[str, Any]) -> CanonicalCard:
        """
        L{canonical} on this thread, whatever the card's size.
        """
        found = self.known(document) or self._fast(document)
        if found is not None:
            return found
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        key = _contentKey(text)
        return self._slowCard(document, text, key, self._slow.get(key))

    def hash(self, document: dict[str, Any]) -> Deferred[str]:
        """
        The canonical hash of C{document}.
        """
        return self.canonical(document).addCallback(lambda card: card.hash)

    def hashNow(self, document: dict[str, Any]) -> str:
        """
        The canonical hash of C{document}, computed on this thread.
        """
        return self.canonicalNow(document).hash

    def _adopted(self, document: Any) -> bool:
        entry = self._owned.get(id(document))
        return entry is not None and entry[0]() is document

    def _facts(self, document: Any) -> _Facts | None:
        entry = self._owned.get(id(document))
        return entry[1] if entry is not None and entry[0]() is document else None

    def _owning(self, document: dict[str, Any], parse: Any) -> OwnedDocument:
        if self._adopted(document):
            assert isinstance(document, OwnedDocument)
            return document
        return OwnedDocument(json.loads(parse))

    def _fast(self, document: dict[str, Any]) -> CanonicalCard | None:
        """
        The canonical card from the C encoder, when it can write this one.
        """
        encoded = plainJson(document)
        if encoded is None:
            return None
        owned = self._owning(document, encoded)
        return self._card(owned, hashlib.sha256(encoded).hexdigest(), len(encoded), True)

    def _slowCard(
        self, document: dict[str, Any], text: str, key: bytes, value: str | None
    ) -> CanonicalCard:
        if value is None:
            value = canonicalHash(document)
        self._slow[key] = value
        self._slow.move_to_end(key)
        while len(self._slow) > self._cacheSize:
            self._slow.popitem(last=False)
        owned = self._owning(document, text)
        return self._card(owned, value, len(text.encode("utf-8", "surrogatepass")), False)

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


def snapshotTransfer(document: dict[str, Any], targetHash: str) -> dict[str, Any]:
    """
    The C{card} field of a request that sends the whole card.
    """
    return {"format": CARD_FORMAT, "mode": "snapshot", "targetHash": targetHash, "card": document}


#: Names under which a snapshot transfer may carry the document (we write the
#: first; see docs/protocol-choices.md).
SNAPSHOT_DOCUMENT_FIELDS = ("card", "document", "snapshot")
#: Names under which a patch transfer may carry its RFC 6902 operations.
PATCH_OPERATION_FIELDS = ("patch", "operations", "ops")


def transferDocument(transfer: Mapping[str, Any]) -> dict[str, Any] | None:
    """
    The card document inside a snapshot transfer, under any accepted name, or
    with the card's own fields merged into the transfer object.
    """
    for name in SNAPSHOT_DOCUMENT_FIELDS:
        value = transfer.get(name)
        if isinstance(value, dict):
            return value
    if transfer.get("spec") == CARD_FORMAT:
        return {k: v for k, v in transfer.items() if k not in ("format", "mode", "targetHash")}
    data = transfer.get("data")
    if isinstance(data, dict) and data.get("spec") == CARD_FORMAT:
        return data
    return None


def transferOperations(transfer: Mapping[str, Any]) -> list[Any] | None:
    for name in PATCH_OPERATION_FIELDS:
        value = transfer.get(name)
        if isinstance(value, list):
            return value
    return None
