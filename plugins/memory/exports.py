"""
Exported conversations (a game's saves): the document's format, the
checksum that seals it, and reading one back (L{parseExport},
L{readExport}), refusing what is not a whole, unchanged export.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from rpmiddleware.builtin.memory.conversation import (
    ROLES,
    STATUSES,
    Conversation,
    Entry,
    Fact,
    Key,
    MemoryItem,
)
from rpmiddleware.builtin.memory.storeerrors import InvalidDocument

EXPORT_FORMAT = "rpmiddleware.memory/2"
#: The exports made before they were sealed (no entry count, no checksum):
#: imported only when the game says it takes them as they are.
UNSEALED_FORMAT = "rpmiddleware.memory/1"


def checksum(body: dict[str, Any]) -> str:
    """
    SHA-256 of an exported conversation's content (summary, facts' texts,
    entries), each number as the float or int it means, so that a game's
    JSON library (which may write C{5.0} as C{5}) does not change it.
    """
    content = [
        body.get("summary"),
        body.get("summarizedThrough"),
        [f.get("text") if isinstance(f, dict) else f for f in body.get("facts") or []],
        [
            [
                e.get("seq"),
                e.get("role"),
                e.get("speaker", ""),
                e.get("text"),
                e.get("status", "complete"),
                float(e.get("at", 0.0)) if isinstance(e.get("at", 0.0), int | float) else 0.0,
            ]
            if isinstance(e, dict)
            else e
            for e in body.get("entries") or []
        ],
    ]
    if body.get("state"):
        # Sealed with the rest when there is some (older exports have none),
        # its keys in order (a game's JSON library may write them in any).
        content.append(["state", json.dumps(body["state"], sort_keys=True)])
    if body.get("memories"):
        # Sealed with the rest when there are some (older exports have none).
        content.append(["memories", [_sealedMemory(m) for m in body["memories"]]])
    digest = hashlib.sha256()
    for piece in _inPieces(content):
        digest.update(piece.encode("ascii"))
    return digest.hexdigest()


#: Items of a long list JSON-encoded in one call (L{_inPieces}).
PIECE = 256


def _inPieces(content: list[Any]) -> Iterator[str]:
    """
    C{json.dumps(content, ensure_ascii=True, separators=(",", ":"))}, the
    same text, in pieces: a long list in it (the entries) a few hundred
    items at a time, so that no one call holds Python's lock for long (a
    save seals conversations of thousands of entries on the store's thread
    while the reactor runs).
    """
    yield "["
    for i, item in enumerate(content):
        if i:
            yield ","
        if isinstance(item, list) and len(item) > PIECE:
            yield "["
            for start in range(0, len(item), PIECE):
                if start:
                    yield ","
                yield _compact(item[start : start + PIECE])[1:-1]
            yield "]"
        else:
            yield _compact(item)
    yield "]"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def _sealedMemory(item: Any) -> Any:
    """A memory as its checksum sees it: numbers as the floats they mean."""
    if not isinstance(item, dict):
        return item

    def number(value: Any) -> Any:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else value

    return [
        item.get("text"),
        number(item.get("importance", 0.5)),
        number(item.get("at", 0.0)),
        item.get("source", "game"),
    ]


def parseExport(key: Key, document: Any) -> Conversation:
    """
    An exported document read as L{MemoryStore.restore} reads it (one with
    no entries taken), for L{MemoryStore.replace}: a save's documents are
    each read, on the store's thread, before any conversation is replaced.

    @raise InvalidDocument: naming what is wrong with it.
    """
    return readExport(key, document, True, False)


def readExport(
    key: Key, document: Any, empty: bool = False, unverified: bool = False
) -> Conversation:
    """
    An exported document read as L{MemoryStore.restore} reads it: one with
    no entries is refused unless C{empty}, one of the older, unsealed
    format unless C{unverified}.

    @raise InvalidDocument: naming what is wrong with it.
    """
    if not isinstance(document, dict):
        raise InvalidDocument(
            f'an imported conversation must be an object with format "{EXPORT_FORMAT}"'
        )
    got = document.get("format")
    unsealed = got == UNSEALED_FORMAT
    if got != EXPORT_FORMAT and not unsealed:
        raise InvalidDocument(
            f'an imported conversation must have format "{EXPORT_FORMAT}"; this one has '
            + (json.dumps(got) if isinstance(got, str) else "none")
        )
    if unsealed and not unverified:
        raise InvalidDocument(
            f'this export has the older format "{UNSEALED_FORMAT}", which carries no entry '
            "count or checksum, so a cut or changed one cannot be told from a whole one: send "
            "unverified: true to import it as it is (then export it again to seal it)"
        )
    if "entries" not in document:
        raise InvalidDocument("the document has no entries (it is not a whole export)")
    count, sealed = document.get("entryCount"), document.get("checksum")
    if unsealed:
        count, sealed = len(document["entries"]) if isinstance(document["entries"], list) else 0, ""
    elif isinstance(count, bool) or not isinstance(count, int) or not isinstance(sealed, str):
        raise InvalidDocument("the document has no entryCount and checksum (not a whole export)")
    if isinstance(document["entries"], list) and len(document["entries"]) != count:
        raise InvalidDocument(
            f"the document holds {len(document['entries'])} entries but was exported with "
            f"{count}: it was cut or changed"
        )
    if not document["entries"] and not empty:
        raise InvalidDocument(
            "the document has no entries; importing it would leave the conversation empty "
            "(send empty: true if that is meant)"
        )
    summary = document.get("summary", "")
    through = document.get("summarizedThrough", 0)
    if not isinstance(summary, str):
        raise InvalidDocument("summary must be a string")
    if isinstance(through, bool) or not isinstance(through, int) or through < 0:
        raise InvalidDocument("summarizedThrough must be a whole number of at least 0")
    entries: list[Entry] = []
    raw = document["entries"]
    if not isinstance(raw, list):
        raise InvalidDocument("entries must be a list")
    last = 0
    for i, item in enumerate(raw):
        where = f"entries[{i}]"
        if not isinstance(item, dict):
            raise InvalidDocument(f"{where} must be an object")
        seq, role, text = item.get("seq"), item.get("role"), item.get("text")
        status, speaker = item.get("status", "complete"), item.get("speaker", "")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq <= last:
            raise InvalidDocument(f"{where}.seq must be a whole number above the one before it")
        if role not in ROLES:
            raise InvalidDocument(f"{where}.role must be one of {', '.join(ROLES)}")
        if status not in STATUSES:
            raise InvalidDocument(f"{where}.status must be one of {', '.join(STATUSES)}")
        if not isinstance(text, str) or not isinstance(speaker, str):
            raise InvalidDocument(f"{where}.text and .speaker must be strings")
        at = item.get("at", 0.0)
        entries.append(
            Entry(
                seq, role, text, status, speaker, float(at) if isinstance(at, int | float) else 0.0
            )
        )
        last = seq
    facts = []
    rawFacts = document.get("facts", [])
    if not isinstance(rawFacts, list):
        raise InvalidDocument("facts must be a list")
    for i, item in enumerate(rawFacts):
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            raise InvalidDocument(f"facts[{i}] must be a non-empty string or an object with text")
        facts.append(Fact(i + 1, text.strip()))
    state = document.get("state", {})
    if not isinstance(state, dict) or not all(isinstance(k, str) and k for k in state):
        raise InvalidDocument("state must be an object of named values")
    memories = _parseMemories(document.get("memories", []))
    if not unsealed and checksum(document) != sealed:
        raise InvalidDocument(
            "the document's checksum does not match its content: it was changed after export"
        )
    found = Conversation(key, entries, summary, through, facts, state=dict(state))
    found.memories = memories
    return found


def _parseMemories(raw: Any) -> list[MemoryItem]:
    """An export's C{memories} (none in exports made before them)."""
    if not isinstance(raw, list):
        raise InvalidDocument("memories must be a list")
    found = []
    for i, item in enumerate(raw):
        where = f"memories[{i}]"
        if not isinstance(item, dict):
            raise InvalidDocument(f"{where} must be an object")
        text, importance = item.get("text"), item.get("importance", 0.5)
        at, source = item.get("at", 0.0), item.get("source", "game")
        if not isinstance(text, str) or not text.strip():
            raise InvalidDocument(f"{where}.text must be a non-empty string")
        if (
            isinstance(importance, bool)
            or not isinstance(importance, int | float)
            or not 0 <= importance <= 1
        ):
            raise InvalidDocument(f"{where}.importance must be a number from 0 to 1")
        if not isinstance(source, str) or not source:
            raise InvalidDocument(f"{where}.source must be a non-empty string")
        when = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
        found.append(MemoryItem(i + 1, text.strip(), float(importance), when, source))
    return found
