"""
The memory plugin's attitude and reflection hooks (docs/memory.md,
Attitude and Reflection): reading and changing a character's attitude to
the player, telling the client when its level changes, and keeping what a
reflection answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpmiddleware.builtin.memory.attitude import (
    HIGHEST,
    LOWEST,
    Attitude,
    AttitudeError,
    LevelChange,
    stanceOf,
    valuesOf,
)
from rpmiddleware.builtin.memory.attitude import MAX_CHANGE as MAX_ATTITUDE_CHANGE
from rpmiddleware.builtin.memory.attitude import STATE as ATTITUDE_STATE
from rpmiddleware.builtin.memory.conversation import (
    Conversation,
    Key,
)
from rpmiddleware.builtin.memory.parts import MemoryParts
from rpmiddleware.builtin.memory.reflection import STATE as REFLECTION_STATE
from rpmiddleware.builtin.memory.reflection import Reflection
from rpmiddleware.plugin import (
    Envelope,
    toClient,
    trimmed,
)


class AttitudeHooks(MemoryParts):
    """
    L{Memory}'s attitude methods and its reflection hook: a part of the
    plugin's class, in a module of its own.
    """

    def attitude(
        self, characterId: str, conversationId: str, integrationId: str | None = None
    ) -> dict[str, Any]:
        key = self._key(characterId, conversationId, integrationId)
        return Attitude.fromState(self.conversation(key).state).asDict()

    def setAttitude(
        self,
        characterId: str,
        conversationId: str,
        values: Mapping[str, Any] | None = None,
        stance: str | None = None,
        integrationId: str | None = None,
        client: str = "api",
    ) -> dict[str, Any]:
        key = self._key(characterId, conversationId, integrationId)
        checked = valuesOf(values or {}, "set", LOWEST, HIGHEST)
        told = None if stance is None else stanceOf(stance)
        return self._changeAttitude(key, checked, True, told, "game", client)

    def adjustAttitude(
        self,
        characterId: str,
        conversationId: str,
        changes: Mapping[str, Any],
        stance: str | None = None,
        integrationId: str | None = None,
        client: str = "api",
    ) -> dict[str, Any]:
        key = self._key(characterId, conversationId, integrationId)
        checked = valuesOf(changes, "adjust", -MAX_ATTITUDE_CHANGE, MAX_ATTITUDE_CHANGE)
        told = None if stance is None else stanceOf(stance)
        return self._changeAttitude(key, checked, False, told, "game", client)

    def _changeAttitude(
        self,
        key: Key,
        changes: Mapping[str, int],
        absolute: bool,
        stance: str | None,
        source: str,
        client: str,
        step: int | None = None,
    ) -> dict[str, Any]:
        """
        Change a conversation's attitude (loaded: the caller saw to it),
        keep it with the conversation, and tell the client that plays it
        (and C{client}) which levels changed.
        """
        if not self.settings.attitude:
            raise AttitudeError("attitude is turned off (plugins.memory.attitude = false)")
        conversation = self.conversation(key)
        before = Attitude.fromState(conversation.state)
        after, moved = before.changed(changes, absolute, step, stance)
        if after != before:
            kept = self.storeFor(key).setState(conversation, ATTITUDE_STATE, after.asState())
            kept.addCallback(self._tellIfLost, client, key, "attitude")
        self.log.info(
            "{characterId}'s attitude changed by {source}: {line}",
            characterId=key.characterId,
            source=source,
            line=after.line(key.characterId, "the player"),
            levels=[m.asDict() for m in moved],
        )
        if moved:
            self._tellAttitude(key, moved, after, source, client)
        return {**after.asDict(), "changes": [m.asDict() for m in moved]}

    def _tellAttitude(
        self, key: Key, moved: list[LevelChange], after: Attitude, source: str, client: str
    ) -> None:
        """
        A C{memory-event} C{attitude} to the client that plays the
        conversation and to C{client}, when they are client sessions.
        """
        context = getattr(self, "context", None)
        if context is None:
            return
        message = {
            "type": "memory-event",
            "event": "attitude",
            **key.asDict(),
            "source": source,
            "changes": [m.asDict() for m in moved],
            "attitude": after.asDict(),
        }
        for to in dict.fromkeys((self._clientOf.get(key), client)):
            if to is not None and to not in ("api", "memory"):
                context.sendToGame(toClient(to, dict(message)))

    def _playedBy(self, key: Key, client: str) -> None:
        self._clientOf.pop(key, None)
        self._clientOf[key] = client
        while len(self._clientOf) > self.settings.cached:
            self._clientOf.popitem(last=False)

    def _attitudeEnvelope(self, envelope: Envelope) -> None:
        """
        An attitude change another plugin sent (L{ATTITUDE}: an action's
        effect): applied to the conversation its meta names, once loaded.
        """
        key = self.keyOf(envelope.fields, envelope.meta)
        client = str(envelope.meta.get("client") or "api")
        reason = str(envelope.get("reason") or "")

        def apply(_: object) -> None:
            try:
                change = valuesOf(
                    envelope.get("change"), "change", -MAX_ATTITUDE_CHANGE, MAX_ATTITUDE_CHANGE
                )
                self._changeAttitude(key, change, False, None, reason or "game", client)
            except AttitudeError as e:
                self.log.warn("attitude change for {key} not made: {why}", key=key.asDict(), why=e)

        d = self.storeFor(key).load(key).addCallback(apply)
        d.addErrback(lambda f: self.log.failure("attitude change for {key}", f, key=key.asDict()))

    def _reflected(self, conversation: Conversation, reflection: Reflection, through: int) -> None:
        """
        A reflection's checked answer: its details kept as memories of high
        importance, its attitude change made (each axis by at most
        C{reflection_step}), and how far it reached kept with the conversation.
        """
        key = conversation.key
        store = self.storeFor(key)
        for detail in reflection.details:
            try:
                kept = store.remember(
                    conversation, detail, self.settings.reflection_importance, "reflection"
                )
            except ValueError as e:
                self.log.warn("a reflection's detail was not kept: {why}", why=str(e))
                continue
            kept.addCallback(self._tellIfLost, "memory", key, "reflection")
        if self.settings.attitude and (reflection.change or reflection.stance):
            self._changeAttitude(
                key,
                reflection.change,
                False,
                reflection.stance,
                "reflection",
                self._clientOf.get(key, "memory"),
                step=self.settings.reflection_step,
            )
        done = store.setState(conversation, REFLECTION_STATE, {"through": through})
        done.addCallback(self._tellIfLost, "memory", key, "reflection")

    def _attitudeLine(
        self, conversation: Conversation, card: Mapping[str, Any], fields: Mapping[str, Any]
    ) -> str:
        """The one line the model is given of the attitude, or "" (neutral, or off)."""
        if not self.settings.attitude:
            return ""
        attitude = Attitude.fromState(conversation.state)
        if attitude.neutral:
            return ""
        data = card.get("data")
        character = trimmed(data.get("name")) if isinstance(data, Mapping) else ""
        player = trimmed((fields.get("player") or {}).get("displayName")) or "Player"
        return attitude.line(character, player)
