"""
What a card transfer costs on the wire, and the patch that may replace a
snapshot: checked, and only when it is smaller than the card.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rpmiddleware.plugin import CanonicalCard, applyPatch, canonicalHash, diff, knownPlainJson


def jsonSize(value: Any) -> int:
    """
    Bytes of C{value} as compact UTF-8 JSON: what a transfer costs on the wire.
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


def transferSize(transfer: Any, card: CanonicalCard | None) -> int:
    """
    L{jsonSize} of a card transfer, without encoding a snapshot's card again
    when its canonical size is known (compact JSON in any key order has the
    same length).
    """
    if (
        card is None
        or not isinstance(transfer, dict)
        or transfer.get("snapshot") is not card.document
    ):
        return jsonSize(transfer)
    return jsonSize({**transfer, "snapshot": 0}) - 1 + card.size


def candidatePatch(base: CanonicalCard, target: CanonicalCard) -> list[dict[str, Any]] | None:
    """
    RFC 6902 operations turning C{base} into C{target}, or C{None} when
    there are none short enough (see L{rpmiddleware.cards.diff}) or they are
    not smaller than C{target} itself.  Unchecked: see L{reproduces}.
    """
    operations = diff(base.document, target.document)
    if operations is None or jsonSize(operations) >= target.size:
        return None
    return operations


def reproduces(base: CanonicalCard, target: CanonicalCard, operations: list[Any]) -> bool:
    """
    Whether C{operations} applied to C{base} give exactly C{target}: the
    same canonical hash, because Python's C{==}, which the diff relies on,
    calls C{true} equal to C{1}.  When the C encoder wrote both cards, the
    patched one is made only of their parts and needs no walk before it.
    """
    patched = applyPatch(base.document, operations)
    if base.plain and target.plain:
        return hashlib.sha256(knownPlainJson(patched)).hexdigest() == target.hash
    return canonicalHash(patched) == target.hash


def smallerPatch(base: CanonicalCard, target: CanonicalCard) -> list[dict[str, Any]] | None:
    """
    A checked patch from C{base} to C{target} (L{candidatePatch} then
    L{reproduces}), or C{None}.
    """
    operations = candidatePatch(base, target)
    if operations is None or not reproduces(base, target, operations):
        return None
    return operations
