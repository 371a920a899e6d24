"""
The simulated RPEngine's Character Card V2 cache for one connection session.

Follows RPEngine's C{crates/rp-engine-core/src/session.rs}
(C{CardSessionCore::resolve_value}): one card per integration and character
(the key is C{integrationId + "\\0" + characterId}), and three transfers:

  - a snapshot carries the whole card (C{targetHash} optional);
  - a patch carries RFC 6902 operations against the cached card of that
    key, whose hash must equal C{baseHash};
  - a reference names the cached card of that key by C{targetHash}.

A missing base or reference, a hash mismatch or a patch that does not apply
is C{card_resync_required}; a reconstructed card that is not a valid
Character Card V2 is C{invalid_character_card}.  Patches follow RPEngine's
own RFC 6902 implementation (C{crates/rp-engine-core/src/json_core.rs}
C{apply_patch_value}); hashes are RPEngine's (SHA-256 of the canonical JSON,
L{rpmiddleware.cards.canonical.canonicalHash}).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from rpmiddleware.cards.canonical import canonicalHash
from rpmiddleware.cards.validation import InvalidCard, validateCard
from rpmiddleware.protocol.envelope import jsonBytes
from rpmiddleware.testing.requestchecks import RequestError


class CardTransferError(RequestError):
    """
    A transfer RPEngine refuses; C{code} and C{retryable} go into the
    C{request.error} it sends.
    """


class PatchFailed(ValueError):
    """
    An RFC 6902 patch that does not apply.
    """


def simulatorHash(document: Any) -> str:
    """
    The hash RPEngine gives a card: lowercase hex SHA-256 over its
    canonical JSON (session.rs hash_value).
    """
    try:
        return canonicalHash(document)
    except (TypeError, ValueError) as e:
        raise CardTransferError("invalid_character_card", f"the card is not JSON: {e}")


def _resync(message: str) -> CardTransferError:
    return CardTransferError("card_resync_required", message, retryable=True)


def cacheKey(integrationId: str, characterId: str) -> str:
    return f"{integrationId}\0{characterId}"


class SessionCardStore:
    """
    Cards one session has accepted, one per integration and character.
    RPEngine clears it on C{welcome} and when the connection closes.
    """

    def __init__(self, transfers: list[tuple[str, int]] | None = None) -> None:
        #: key -> (hash, card)
        self.cards: dict[str, tuple[str, Any]] = {}
        #: Every transfer received, as (mode, bytes of its JSON), in order;
        #: pass a list to keep one log across sessions.
        self.transfers: list[tuple[str, int]] = transfers if transfers is not None else []

    def resolve(
        self, transfer: Any, integrationId: str = "", characterId: str = ""
    ) -> tuple[str, Any]:
        """
        Apply one C{card} field for a character and return the accepted
        (hash, card).

        @raise CardTransferError: with the code RPEngine would send.
        """
        mode = transfer.get("mode") if isinstance(transfer, Mapping) else None
        logged = str(mode) if isinstance(transfer, Mapping) else "missing"
        # Bytes of the card field as it travels, so tests and benchmarks see
        # what patches and references save.
        self.transfers.append((logged, len(jsonBytes(transfer))))
        if not isinstance(transfer, Mapping):
            raise _resync("the card transfer is not an object")
        target = transfer.get("targetHash")
        target = target.lower() if isinstance(target, str) and target else None
        key = cacheKey(integrationId, characterId)
        cached = self.cards.get(key)
        if mode == "snapshot":
            if "snapshot" not in transfer:
                raise _resync("a snapshot transfer needs the card under snapshot")
            card = copy.deepcopy(transfer["snapshot"])
        elif mode == "reference":
            if target is None:
                raise _resync("a reference transfer needs a targetHash")
            if cached is None or cached[0] != target:
                raise _resync("no card with that targetHash is cached for this character")
            return cached
        elif mode == "patch":
            if target is None:
                raise _resync("a patch transfer needs a targetHash")
            base = transfer.get("baseHash")
            if cached is None or cached[0] != (base if isinstance(base, str) else ""):
                raise _resync("the patch's baseHash is not the card cached for this character")
            operations = transfer.get("patch")
            if not isinstance(operations, list):
                raise _resync("the patch is not a list of operations")
            try:
                card = applyPatch(copy.deepcopy(cached[1]), operations)
            except PatchFailed as e:
                raise _resync(f"the patch does not apply: {e}")
        else:
            raise _resync(f"unknown card transfer mode {mode!r}")
        try:
            validateCard(card)
        except InvalidCard as e:
            raise CardTransferError(
                "invalid_character_card", f"not a valid Character Card V2: {e.field} {e.problem}"
            )
        actual = simulatorHash(card)
        if target is not None and actual != target:
            raise _resync(f"the card's hash {actual} is not the targetHash")
        self.cards[key] = (actual, card)
        return actual, card

    def clear(self) -> None:
        self.cards.clear()


# RFC 6902, as json_core.rs applies it.

_INDEX = re.compile(r"\+?[0-9]+\Z")


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchFailed(f"{pointer!r} is not a JSON pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(token: str, length: int, allowEnd: bool) -> int:
    if not _INDEX.match(token) or (len(token) > 1 and token.startswith("0")):
        raise PatchFailed(f"array index {token!r} is out of range")
    value = int(token)
    if value > length or (not allowEnd and value == length):
        raise PatchFailed(f"array index {token!r} is out of range")
    return value


def _step(current: Any, token: str) -> Any:
    if isinstance(current, list):
        return current[_index(token, len(current), False)]
    if isinstance(current, dict):
        if token not in current:
            raise PatchFailed(f"no member {token!r}")
        return current[token]
    raise PatchFailed("the path goes through a value that is not a container")


def _read(root: Any, path: str) -> Any:
    current = root
    for token in _tokens(path):
        current = _step(current, token)
    return current


def _parent(root: Any, path: str) -> tuple[Any, str]:
    tokens = _tokens(path)
    if not tokens:
        raise PatchFailed("the path has no parent")
    current = root
    for token in tokens[:-1]:
        current = _step(current, token)
    return current, tokens[-1]


def _set(root: Any, path: str, value: Any, replace: bool) -> Any:
    if path == "":
        return value
    parent, key = _parent(root, path)
    if isinstance(parent, list):
        if key == "-" and not replace:
            parent.append(value)
        elif replace:
            parent[_index(key, len(parent), False)] = value
        else:
            parent.insert(_index(key, len(parent), True), value)
    elif isinstance(parent, dict):
        if replace and key not in parent:
            raise PatchFailed(f"replace: no member {key!r}")
        parent[key] = value
    else:
        raise PatchFailed("the parent is not a container")
    return root


def _remove(root: Any, path: str) -> tuple[Any, Any]:
    """
    (new root, removed value).
    """
    if path == "":
        return None, root
    parent, key = _parent(root, path)
    if isinstance(parent, list):
        return root, parent.pop(_index(key, len(parent), False))
    if isinstance(parent, dict):
        if key not in parent:
            raise PatchFailed(f"remove: no member {key!r}")
        return root, parent.pop(key)
    raise PatchFailed("the parent is not a container")


def _same(left: Any, right: Any) -> bool:
    """
    JSON equality as RPEngine's C{test} decides it (by canonical form): a
    boolean is not a number, and 1 is not 1.0.
    """
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)


def applyPatch(root: Any, operations: list[Any]) -> Any:
    """
    Apply RFC 6902 C{operations} to C{root} (changed in place) and return
    the result.

    @raise PatchFailed: naming what did not apply.
    """
    for operation in operations:
        if not isinstance(operation, dict):
            raise PatchFailed("an operation is not an object")
        op = operation.get("op")
        path = operation.get("path")
        if not isinstance(op, str):
            raise PatchFailed("an operation has no op")
        if not isinstance(path, str):
            raise PatchFailed("an operation has no path")
        if op in ("add", "replace"):
            if "value" not in operation:
                raise PatchFailed(f"{op} has no value")
            root = _set(root, path, copy.deepcopy(operation["value"]), op == "replace")
        elif op == "remove":
            root, _ = _remove(root, path)
        elif op in ("copy", "move"):
            source = operation.get("from")
            if not isinstance(source, str):
                raise PatchFailed(f"{op} has no from")
            if op == "copy":
                value = copy.deepcopy(_read(root, source))
            else:
                root, value = _remove(root, source)
            root = _set(root, path, value, False)
        elif op == "test":
            if "value" not in operation:
                raise PatchFailed("test has no value")
            if not _same(_read(root, path), operation["value"]):
                raise PatchFailed(f"test of {path!r} failed")
        else:
            raise PatchFailed(f"unsupported op {op!r}")
    return root
