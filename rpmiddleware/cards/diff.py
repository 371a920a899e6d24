"""
RFC 6902 patches between versions of a card, in time linear in its size.

C{jsonpatch.make_patch} looks for moves inside arrays, which makes it
quadratic: on a 200 KB card it takes 0.3 ms for one changed lorebook entry but
200 ms for one entry inserted at the front and 21 s for the lorebook reversed
(measured; see docs/benchmarks.md), in a thread that holds the GIL all along.
A game's edits between turns are small and local, so L{diff} does what a
person would: skip equal values (identity first, then C-speed C{==}), recurse
into objects key by key, trim arrays to the middle that differs by their
common prefix and suffix, pair the middle element by element and add or
remove the rest, and give up past L{OPERATION_LIMIT} operations.  Its patch
can be longer than the shortest one; card-cache sends a snapshot whenever a
patch is not smaller or there is none.

Python's C{==} calls C{True} equal to C{1}, which JSON does not, so a patch
from L{diff} must be checked against the target's canonical hash before it is
sent (card-cache does).  Applying uses C{jsonpatch} on a copy-on-write copy
(L{applyPatch}): only the containers a patch changes are copied, where
C{jsonpatch.apply_patch} deep-copies the whole card (4 ms for 200 KB).
"""

from __future__ import annotations

from typing import Any

import jsonpatch

Operation = dict[str, Any]


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a == b)


#: The most operations L{diff} writes before it gives up: applying a patch
#: costs about 15 us an operation on each side, and a change this large is
#: no longer the small edit a patch is for (a snapshot is sent instead).
OPERATION_LIMIT = 128


class _TooLong(Exception):
    pass


def diff(base: Any, target: Any, limit: int = OPERATION_LIMIT) -> list[Operation] | None:
    """
    RFC 6902 operations that turn C{base} into C{target} (up to Python's
    C{True == 1}; see the module docstring), or C{None} when that takes more
    than C{limit} operations.  Neither input is changed, and operation values
    are C{target}'s own objects, not copies.
    """
    operations = _Operations(limit)
    try:
        operations.compare("", base, target)
    except _TooLong:
        return None
    return operations.written


class _Operations:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.written: list[Operation] = []

    def write(self, operation: Operation) -> None:
        if len(self.written) >= self.limit:
            raise _TooLong()
        self.written.append(operation)

    def compare(self, path: str, a: Any, b: Any) -> None:
        if _same(a, b):
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in a:
                if key not in b:
                    self.write({"op": "remove", "path": f"{path}/{_escape(key)}"})
            for key, value in b.items():
                where = f"{path}/{_escape(key)}"
                if key in a:
                    self.compare(where, a[key], value)
                else:
                    self.write({"op": "add", "path": where, "value": value})
        elif isinstance(a, list) and isinstance(b, list):
            self.compareLists(path, a, b)
        else:
            self.write({"op": "replace", "path": path, "value": b})

    def compareLists(self, path: str, a: list[Any], b: list[Any]) -> None:
        shorter = min(len(a), len(b))
        start = 0
        while start < shorter and _same(a[start], b[start]):
            start += 1
        end = 0
        while end < shorter - start and _same(a[-1 - end], b[-1 - end]):
            end += 1
        oldMiddle, newMiddle = len(a) - start - end, len(b) - start - end
        paired = min(oldMiddle, newMiddle)
        for i in range(start, start + paired):
            self.compare(f"{path}/{i}", a[i], b[i])
        at = f"{path}/{start + paired}"
        for _ in range(oldMiddle - paired):
            self.write({"op": "remove", "path": at})
        for i in range(start + paired, start + newMiddle):
            self.write({"op": "add", "path": f"{path}/{i}", "value": b[i]})


def _pointer(path: Any) -> list[str] | None:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        return None
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _private(node: Any, copied: dict[int, Any]) -> Any:
    """
    C{node} if this patching made it, else a shallow copy that it made.
    """
    if not isinstance(node, dict | list) or id(node) in copied:
        return node
    node = node.copy()
    copied[id(node)] = node
    return node


def _copyAlong(root: Any, parts: list[str], copied: dict[int, Any]) -> None:
    """
    Make every container on the way to the parent of C{parts} one of this
    patching's own copies, so that changing that parent in place changes
    nothing shared.  Stops quietly where the path does not exist: the
    operation then fails with the error C{jsonpatch} gives.
    """
    node = root
    for part in parts[:-1]:
        if isinstance(node, dict):
            key: Any = part
            if key not in node:
                return
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            key = int(part)
        else:
            return
        child = _private(node[key], copied)
        node[key] = child
        node = child


def applyPatch(base: Any, operations: list[Any]) -> Any:
    """
    C{base} with RFC 6902 C{operations} applied, sharing every part the
    patch does not touch with C{base}.  Neither C{base} nor the operations
    are changed (C{jsonpatch.apply_patch} changes an added value in place
    when a later operation writes inside it, corrupting the patch it was
    given); the result must be treated as immutable, like C{base}.

    @raise jsonpatch.JsonPatchException: or C{jsonpointer.JsonPointerException},
        for a patch that does not apply.
    """
    if not isinstance(operations, list):
        raise jsonpatch.InvalidJsonPatch("a patch must be an array of operations")
    copied: dict[int, Any] = {}
    root = base
    for operation in operations:
        # Copies are made op by op, so a container an earlier operation put
        # in place is copied before a later one writes inside it.
        root = _private(root, copied)
        if isinstance(operation, dict):
            for field in ("path", "from"):
                parts = _pointer(operation.get(field))
                if parts:
                    _copyAlong(root, parts, copied)
        root = jsonpatch.JsonPatch([operation]).apply(root, in_place=True)
    return root
