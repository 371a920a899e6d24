"""
What the parts of the memory plugin's class share: L{Memory} is written in
a few modules (its turns, its Python API, its attitude hooks, its metrics),
each a class of its own that L{Memory} is made of; this says, for the type
checker, what each part may use of the whole.  It holds nothing at run
time: L{Memory} sets every attribute and defines every method named here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from rpmiddleware.builtin.memory.conversation import Conversation, Key
from rpmiddleware.builtin.memory.settings import MemorySettings
from rpmiddleware.builtin.memory.store import MemoryStore

if TYPE_CHECKING:
    from rpmiddleware.builtin.memory.inflight import Completed, Turn
    from rpmiddleware.builtin.memory.lorebook import Entry as LoreEntry
    from rpmiddleware.builtin.memory.reflection import Reflections
    from rpmiddleware.builtin.memory.saves import Saves
    from rpmiddleware.builtin.memory.summarizer import Summaries


class MemoryParts:
    """
    The attributes and methods of L{Memory} its parts use (set and defined
    by L{Memory}, or by the part named beside one).
    """

    log: Logger
    settings: MemorySettings
    integrationId: str
    store: MemoryStore
    sessions: MemoryStore
    saves: Saves
    summaries: Summaries
    reflections: Reflections
    counts: dict[str, int]
    lostWrites: dict[str, int]
    _turns: dict[str, Turn]
    _completed: OrderedDict[Key, Completed]
    _heardLines: OrderedDict[str, list[tuple[Key, int, str]]]
    _known: dict[str, list[LoreEntry]]
    _clientOf: OrderedDict[Key, str]

    if TYPE_CHECKING:

        def storeFor(self, key: Key) -> MemoryStore: ...

        def conversation(self, key: Key) -> Conversation: ...

        def keyOf(self, fields: Mapping[str, Any], meta: Mapping[str, Any]) -> Key: ...

        def _tellIfLost(self, why: str | None, client: str, key: Key, what: str) -> None: ...

        def _holdUntil(self, done: Deferred[Any]) -> Deferred[Any]: ...

        # PythonAPI's.
        def _key(self, characterId: str, conversationId: str, integrationId: str | None) -> Key: ...
