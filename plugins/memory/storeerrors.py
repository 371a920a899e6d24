"""
What goes wrong in the memory store, and how a caller learns whether the
writes it gave were kept.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from twisted.internet.defer import Deferred, gatherResults, succeed


class StoreError(Exception):
    """
    The store cannot do what was asked (the file cannot be opened or
    written, or a document to import is wrong); the message says what.
    """


class InvalidDocument(StoreError):
    """A document to import is not an exported conversation."""


def describe(error: BaseException | None) -> str:
    """What went wrong, in words for a log and a game."""
    if isinstance(error, StoreError):
        return str(error)
    if isinstance(error, sqlite3.Error):
        return f"SQLite: {error}"
    return f"{type(error).__name__}: {error}"


def allKept(writes: Iterable[Deferred[str | None]], answer: Any) -> Deferred[Any]:
    """C{answer} once every write is committed; a L{StoreError} when one was not."""
    writes = list(writes)
    if not writes:
        return succeed(answer)

    def checked(whys: list[str | None]) -> Any:
        lost = [why for why in whys if why is not None]
        if lost:
            raise StoreError(f"not kept: {lost[0]}")
        return answer

    return gatherResults(writes).addCallback(checked)
