"""
The memory plugin's Python API (L{IConversationMemory}): what a game's
Python code (and the client's C{memory} ops) reads and changes of its
conversations, saves and knowledge.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred

from rpmiddleware.builtin.memory.conversation import Key
from rpmiddleware.builtin.memory.parts import MemoryParts
from rpmiddleware.builtin.memory.planner import MAX_FACT


class PythonAPI(MemoryParts):
    """
    L{Memory}'s Python API methods: a part of the plugin's class, in a
    module of its own.
    """

    def _key(self, characterId: str, conversationId: str, integrationId: str | None) -> Key:
        return Key(integrationId or self.integrationId, characterId, conversationId)

    def read(
        self, characterId: str, conversationId: str, integrationId: str | None = None
    ) -> dict[str, Any]:
        return self.conversation(self._key(characterId, conversationId, integrationId)).asDict()

    def conversations(
        self, integrationId: str | None = None, characterId: str | None = None
    ) -> list[dict[str, Any]]:
        found = [
            *self.store.briefs(integrationId, characterId),
            *self.sessions.briefs(integrationId, characterId),
        ]
        return sorted(found, key=lambda brief: -brief["updated"])

    def conversationsLater(
        self, integrationId: str | None = None, characterId: str | None = None
    ) -> Deferred[list[dict[str, Any]]]:
        """L{conversations}, with the file read on the store's own thread."""

        def merged(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
            found = [*stored, *self.sessions.briefs(integrationId, characterId)]
            return sorted(found, key=lambda brief: -brief["updated"])

        return self.store.briefsLater(integrationId, characterId).addCallback(merged)

    def loaded(
        self, characterId: str, conversationId: str, integrationId: str | None = None
    ) -> Deferred[Any]:
        """Read the conversation on the store's own thread, if it is not loaded."""
        key = self._key(characterId, conversationId, integrationId)
        return self.storeFor(key).load(key)

    def edit(
        self,
        characterId: str,
        conversationId: str,
        seq: int,
        text: str | None,
        integrationId: str | None = None,
    ) -> None:
        key = self._key(characterId, conversationId, integrationId)
        conversation = self.conversation(key)
        if conversation.entry(seq) is None:
            raise KeyError(f"entry {seq}")
        self.storeFor(key).edit(conversation, seq, text)

    def pin(
        self, characterId: str, conversationId: str, fact: str, integrationId: str | None = None
    ) -> dict[str, Any]:
        if len(fact.strip()) > MAX_FACT:
            raise ValueError(f"a fact is at most {MAX_FACT} characters (what the model is shown)")
        key = self._key(characterId, conversationId, integrationId)
        return self.storeFor(key).pin(self.conversation(key), fact.strip()).asDict()

    def unpin(
        self, characterId: str, conversationId: str, factId: int, integrationId: str | None = None
    ) -> None:
        key = self._key(characterId, conversationId, integrationId)
        try:
            self.storeFor(key).unpin(self.conversation(key), factId)
        except KeyError:
            raise KeyError(f"fact {factId}")

    def remember(
        self,
        characterId: str,
        conversationId: str,
        text: str,
        importance: float = 0.5,
        source: str = "game",
        integrationId: str | None = None,
    ) -> Deferred[str | None]:
        """
        Keep a moment for the character (L{MemoryStore.remember}): recalled
        when a later line is about it.  Fires with C{None} once written, or
        why it was not.
        """
        key = self._key(characterId, conversationId, integrationId)
        return self.storeFor(key).remember(self.conversation(key), text, importance, source)

    def setSummary(
        self, characterId: str, conversationId: str, summary: str, integrationId: str | None = None
    ) -> None:
        key = self._key(characterId, conversationId, integrationId)
        conversation = self.conversation(key)
        self.storeFor(key).summarize(conversation, summary.strip(), conversation.summarizedThrough)

    def export(
        self, characterId: str, conversationId: str, integrationId: str | None = None
    ) -> dict[str, Any]:
        key = self._key(characterId, conversationId, integrationId)
        return self.storeFor(key).export(self.conversation(key))

    def restore(
        self,
        characterId: str,
        conversationId: str,
        document: Any,
        integrationId: str | None = None,
        empty: bool = False,
        unverified: bool = False,
    ) -> int:
        key = self._key(characterId, conversationId, integrationId)
        return len(self.storeFor(key).restore(key, document, empty, unverified).entries)

    def forget(
        self, characterId: str, conversationId: str, integrationId: str | None = None
    ) -> bool:
        key = self._key(characterId, conversationId, integrationId)
        self.summaries.forget(key)
        self.reflections.forget(key)
        return self.storeFor(key).forget(key)

    def save(
        self,
        saveId: str,
        conversationId: str,
        integrationId: str | None = None,
        characterId: str | None = None,
    ) -> Deferred[dict[str, Any]]:
        integrationId = integrationId or self.integrationId
        return self._holdUntil(self.saves.save(integrationId, conversationId, saveId, characterId))

    def loadSave(
        self, saveId: str, conversationId: str, integrationId: str | None = None
    ) -> Deferred[dict[str, Any]]:
        integrationId = integrationId or self.integrationId
        return self._holdUntil(self.saves.load(integrationId, conversationId, saveId))

    def listSaves(
        self, conversationId: str | None = None, integrationId: str | None = None
    ) -> Deferred[list[dict[str, Any]]]:
        return self.saves.list(integrationId or self.integrationId, conversationId)

    def dropSave(
        self, saveId: str, conversationId: str, integrationId: str | None = None
    ) -> Deferred[bool]:
        return self.saves.drop(integrationId or self.integrationId, conversationId, saveId)

    def prune(
        self,
        olderThanDays: float | None = None,
        keepEntries: int | None = None,
        keepSaves: int | None = None,
        maxBytes: int | None = None,
        conversationId: str | None = None,
        characterId: str | None = None,
        integrationId: str | None = None,
    ) -> Deferred[dict[str, Any]]:
        pruned = self.saves.prune(
            integrationId or self.integrationId,
            olderThanDays,
            keepEntries,
            keepSaves,
            maxBytes,
            conversationId,
            characterId,
        )
        return self._holdUntil(pruned)

    def storeSize(self) -> Deferred[dict[str, int]]:
        return self.saves.measure()

    def turnsInFlight(self) -> list[tuple[str, Key]]:
        """The players' turns in flight: request id and conversation."""
        return [(requestId, turn.key) for requestId, turn in self._turns.items()]

    def letGo(self, key: Key) -> None:
        """
        Conversation C{key} is about to be replaced (a save loaded): its
        summary or reflection in flight is cancelled, and a late cut of its
        last reply or of a line it heard no longer applies to it.
        """
        current = self.summaries.current
        context = getattr(self, "context", None)
        if current is not None and current.key == key and context is not None:
            self.summaries.stop(context)
        self.summaries.forget(key)
        # A reflection on what the save undoes must not reach the restored one.
        reflecting = self.reflections.current
        if reflecting is not None and reflecting.key == key and context is not None:
            self.reflections.stop(context)
        self.reflections.forget(key)
        self._completed.pop(key, None)
        for lineId, heard in list(self._heardLines.items()):
            kept = [h for h in heard if h[0] != key]
            if kept:
                self._heardLines[lineId] = kept
            else:
                del self._heardLines[lineId]

    def greeted(
        self, characterId: str, conversationId: str, integrationId: str | None = None
    ) -> None:
        key = self._key(characterId, conversationId, integrationId)
        self.conversation(key).greetingPending = True

    def know(
        self,
        text: str,
        keys: tuple[str, ...] = (),
        scope: str = "world",
        constant: bool = False,
        integrationId: str | None = None,
    ) -> int:
        integrationId = integrationId or self.integrationId
        entry = {"content": text.strip(), "keys": list(keys), "constant": constant}
        self._known.pop(integrationId, None)
        return self.store.know(integrationId, scope, entry)

    def unknow(self, knowledgeId: int, integrationId: str | None = None) -> bool:
        integrationId = integrationId or self.integrationId
        self._known.pop(integrationId, None)
        return self.store.unknow(integrationId, knowledgeId)
