"""
The simulated RPEngine's per-session Character Card V2 cache.

RPEngine keeps the cards of one connection session by canonical hash and
accepts three transfers: a snapshot (the whole card), a patch against a card
it already has, and a reference to one it already has.  The hash is computed
here from first principles (RFC 8785 + SHA-256) rather than through
L{rpmiddleware.cards.canonicalHash}, so tests compare two independent
computations instead of trusting the middleware's own.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer
import rfc8785

from rpmiddleware.cards import InvalidCard, transferDocument, transferOperations, validateCard
from rpmiddleware.testing.requestchecks import RequestError

CARD_FORMAT = "chara_card_v2"
MODES = ("snapshot", "patch", "reference")
_HASH = re.compile(r"^[0-9a-f]{64}$")


class CardTransferError(RequestError):
    """
    A transfer RPEngine refuses; C{code} and C{retryable} go into the
    C{request.error} it sends.
    """


def simulatorHash(document: Any) -> str:
    """
    Lowercase hex SHA-256 over the RFC 8785 canonical JSON of C{document}.
    """
    try:
        canonical = rfc8785.dumps(document)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as e:
        raise CardTransferError("invalid_character_card", f"card is not canonical JSON: {e}")
    return hashlib.sha256(canonical).hexdigest()


def transferSize(transfer: Any) -> int:
    """
    Bytes of the C{card} field as it travels (compact UTF-8 JSON), so tests
    and benchmarks can see what patches and references save.
    """
    text = json.dumps(transfer, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


def _invalid(message: str) -> CardTransferError:
    return CardTransferError("invalid_character_card", message)


def _resync(message: str) -> CardTransferError:
    return CardTransferError("card_resync_required", message, retryable=True)


def _validated(document: Any) -> dict[str, Any]:
    try:
        return validateCard(document)
    except InvalidCard as e:
        raise _invalid(f"{e.field} {e.problem}")


class SessionCardStore:
    """
    Cards one session has accepted, by hash.  A new connection starts a new
    store: the seed says caches belong to one connection session.
    """

    def __init__(self, transfers: list[tuple[str, int]] | None = None) -> None:
        self.cards: dict[str, dict[str, Any]] = {}
        #: Every transfer received, as (mode, bytes of its JSON), in order;
        #: pass a list to keep one log across sessions.
        self.transfers: list[tuple[str, int]] = transfers if transfers is not None else []

    def resolve(self, transfer: Any) -> tuple[str, dict[str, Any]]:
        """
        Apply one C{card} field and return the accepted (hash, document).

        @raise CardTransferError: with the code RPEngine would send.
        """
        if not isinstance(transfer, Mapping):
            self.transfers.append(("missing", transferSize(transfer)))
            raise _invalid("card must be a Character Card V2 transfer object")
        mode = transfer.get("mode")
        self.transfers.append((str(mode), transferSize(transfer)))
        fmt = transfer.get("format")
        if fmt is not None and fmt != CARD_FORMAT:
            raise _invalid(f"card.format must be {CARD_FORMAT!r}, got {fmt!r}")
        if mode not in MODES:
            raise _invalid(f"card.mode must be one of {', '.join(MODES)}, got {mode!r}")
        target = transfer.get("targetHash")
        if not isinstance(target, str) or not _HASH.match(target):
            raise _invalid("card.targetHash must be a lowercase hex SHA-256")
        if mode == "reference":
            return target, self._reference(target)
        if mode == "snapshot":
            document = transferDocument(transfer)
            if document is None:
                raise _invalid("snapshot transfer carries no card document")
        else:
            document = self._patched(transfer)
        document = _validated(document)
        actual = simulatorHash(document)
        if actual != target:
            what = "the patched card" if mode == "patch" else "the card"
            raise _invalid(f"targetHash does not match {what} (canonical hash is {actual})")
        self.cards[target] = copy.deepcopy(document)
        return target, document

    def _reference(self, target: str) -> dict[str, Any]:
        document = self.cards.get(target)
        if document is None:
            raise _resync(f"card {target} is not cached in this session; send a snapshot")
        return document

    def _patched(self, transfer: Mapping[str, Any]) -> Any:
        base = transfer.get("baseHash")
        if not isinstance(base, str) or base not in self.cards:
            raise _resync(f"patch baseHash {str(base)[:64]} is not cached in this session")
        operations = transferOperations(transfer)
        if operations is None:
            raise _invalid("patch transfer carries no RFC 6902 operations")
        try:
            return jsonpatch.apply_patch(copy.deepcopy(self.cards[base]), operations)
        except (
            jsonpatch.JsonPatchException,
            jsonpointer.JsonPointerException,
            KeyError,
            IndexError,
            TypeError,
            ValueError,
            AttributeError,
        ) as e:
            raise _invalid(f"patch does not apply to card {base}: {e}")

    def clear(self) -> None:
        self.cards.clear()
