"""
Character Card V2 documents: validation, and the transfers that carry them.

A card's identity on the wire is the lowercase SHA-256 of RPEngine's
canonical JSON (L{rpmiddleware.cards.canonical}); L{CardHasher} (from
L{rpmiddleware.cards.hasher}, importable from here) reads each card the
middleware owns once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpmiddleware.cards.canonical import canonicalHash
from rpmiddleware.cards.hasher import CanonicalCard, CardHasher, OwnedDocument

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
    Check a Character Card V2 document as RPEngine does and return it
    unchanged.

    The rules are RPEngine's (C{crates/rp-engine-core/src/json_core.rs},
    C{validate_card_value}): every required C{data} field with its type, a
    name that is not blank, and for a C{character_book} its C{extensions}
    and C{entries} with each entry's C{keys}, C{content}, C{extensions},
    C{enabled} and C{insertion_order}.  A card that breaks one is answered
    with C{invalid_character_card}, so it is refused here first, by name.
    Unknown fields and extension data are allowed anywhere and kept.

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
    data = _object(document.get("data"), "data")
    for name, kind in REQUIRED_DATA_FIELDS.items():
        if name not in data:
            raise InvalidCard(f"data.{name}", "is missing (use an empty value if you have none)")
        if not isinstance(data[name], kind):
            raise InvalidCard(f"data.{name}", f"must be {_jsonType(kind)}")
    if not data["name"].strip():
        raise InvalidCard("data.name", "must not be empty")
    for listName in ("alternate_greetings", "tags"):
        _strings(data[listName], f"data.{listName}")
    if "character_book" in data:
        _checkBook(data["character_book"])
    return document


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidCard(where, "must be an object")
    return value


def _strings(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise InvalidCard(where, "must be an array of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidCard(f"{where}[{i}]", "must be a string")


def _isNumber(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_CHECKS: dict[str, tuple[Any, str]] = {
    "string": (lambda v: isinstance(v, str), "a string"),
    "number": (_isNumber, "a number"),
    "boolean": (lambda v: isinstance(v, bool), "a boolean"),
}

#: Optional fields of a character book and of its entries, with their types.
_BOOK_OPTIONAL = {
    "name": "string",
    "description": "string",
    "scan_depth": "number",
    "token_budget": "number",
    "recursive_scanning": "boolean",
}
_ENTRY_OPTIONAL = {
    "case_sensitive": "boolean",
    "name": "string",
    "priority": "number",
    "id": "number",
    "comment": "string",
    "selective": "boolean",
    "constant": "boolean",
}


def _optional(fields: dict[str, Any], types: dict[str, str], where: str) -> None:
    for name, kind in types.items():
        # RPEngine reads JSON null as present: it must have the type too.
        if name in fields:
            test, described = _CHECKS[kind]
            if not test(fields[name]):
                raise InvalidCard(f"{where}.{name}", f"must be {described}")


def _checkBook(value: Any) -> None:
    book = _object(value, "data.character_book")
    _optional(book, _BOOK_OPTIONAL, "data.character_book")
    _object(book.get("extensions"), "data.character_book.extensions")
    entries = book.get("entries")
    if not isinstance(entries, list):
        raise InvalidCard("data.character_book.entries", "must be an array")
    for i, item in enumerate(entries):
        where = f"data.character_book.entries[{i}]"
        entry = _object(item, where)
        _strings(entry.get("keys"), f"{where}.keys")
        if not isinstance(entry.get("content"), str):
            raise InvalidCard(f"{where}.content", "must be a string")
        _object(entry.get("extensions"), f"{where}.extensions")
        if not isinstance(entry.get("enabled"), bool):
            raise InvalidCard(f"{where}.enabled", "must be a boolean")
        if not _isNumber(entry.get("insertion_order")):
            raise InvalidCard(f"{where}.insertion_order", "must be a number")
        _optional(entry, _ENTRY_OPTIONAL, where)
        if "secondary_keys" in entry:
            _strings(entry["secondary_keys"], f"{where}.secondary_keys")
        if "position" in entry and entry["position"] not in ("before_char", "after_char"):
            raise InvalidCard(f"{where}.position", "must be before_char or after_char")


def snapshotTransfer(document: dict[str, Any], targetHash: str | None) -> dict[str, Any]:
    """
    The C{card} field of a request that sends the whole card; without
    C{targetHash} when it is C{None} (optional for a snapshot: RPEngine then
    computes it, docs/file-transport-v1.md).
    """
    transfer = {"format": CARD_FORMAT, "mode": "snapshot", "snapshot": document}
    if targetHash is not None:
        transfer["targetHash"] = targetHash
    return transfer


#: Names under which a snapshot transfer may carry the document: RPEngine
#: reads C{snapshot} (json_core.rs validate_card_transfer; session.rs); the
#: others are older spellings a game's own envelope may still use.
SNAPSHOT_DOCUMENT_FIELDS = ("snapshot", "card", "document")
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
