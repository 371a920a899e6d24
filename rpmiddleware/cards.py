"""
Character Card V2 documents: validation, and the transfers that carry them.

A card's identity on the wire is the lowercase SHA-256 of its RFC 8785
canonical JSON (L{rpmiddleware.canonical}); L{CardHasher} (from
L{rpmiddleware.cardhasher}, importable from here) reads each card the
middleware owns once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpmiddleware.canonical import canonicalHash
from rpmiddleware.cardhasher import CanonicalCard, CardHasher, OwnedDocument

__all__ = [
    "CARD_FORMAT",
    "CanonicalCard",
    "CardHasher",
    "InvalidCard",
    "OwnedDocument",
    "canonicalHash",
    "snapshotTransfer",
    "transferDocument",
    "transferOperations",
    "validateCard",
]

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
