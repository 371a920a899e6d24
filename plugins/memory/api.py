"""
The memory plugin's Python API, for games that embed the middleware:
C{middleware.plugin(IConversationMemory)} finds it.

A conversation is named by its character (C{characterId}, and
C{integrationId}, the configured one by default) and the game's
C{conversationId} (a save slot).  Requests name theirs with
C{meta={"conversation": id}} (and C{"location"}, C{"scene"} for scoped
knowledge) in C{Middleware.requestReply}.
"""

from __future__ import annotations

from typing import Any

from zope.interface import Attribute, Interface

from rpmiddleware.builtin.memory.attitude import AXES
from rpmiddleware.plugin import Envelope


class IConversationMemory(Interface):
    store = Attribute("The MemoryStore of games' conversations.")
    chosen = Attribute("Client session id to the conversationId its game chose (dict).")
    where = Attribute("Client session id to its Where (location, scene) (dict).")

    def read(characterId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """The conversation as a dict (entries, summary, facts)."""

    def conversations(integrationId=None, characterId=None):  # type: ignore[no-untyped-def]
        """Brief dicts of the stored conversations, newest first."""

    def edit(characterId, conversationId, seq, text, integrationId=None):  # type: ignore[no-untyped-def]
        """Change entry C{seq}'s text, or remove it (C{text} None); KeyError if none."""

    def pin(characterId, conversationId, fact, integrationId=None):  # type: ignore[no-untyped-def]
        """Pin a fact the character always knows; returns its id."""

    def unpin(characterId, conversationId, factId, integrationId=None):  # type: ignore[no-untyped-def]
        """Unpin a fact; KeyError if none."""

    def remember(
        characterId, conversationId, text, importance=0.5, source="game", integrationId=None
    ):  # type: ignore[no-untyped-def]
        """
        Keep a moment (importance 0 to 1; source e.g. "reflection", "game")
        that recall finds when a later line is about it; a Deferred firing
        with None once written, or why not.  ValueError if wrong.
        """

    def setSummary(characterId, conversationId, summary, integrationId=None):  # type: ignore[no-untyped-def]
        """Replace the running summary."""

    def attitude(characterId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """
        The character's attitude to the player: C{{"axes": {trust: {value,
        level}, ...}, "stance": str}} (docs/memory.md, Attitude).
        """

    def setAttitude(
        characterId, conversationId, values=None, stance=None, integrationId=None, client="api"
    ):  # type: ignore[no-untyped-def]
        """
        Set axes (C{{"trust": 40}}, each -100 to 100) and/or the stance; the
        attitude after, as L{attitude} gives it, with C{"changes"}: the
        levels that changed (each told to the game).  AttitudeError if wrong.
        """

    def adjustAttitude(
        characterId, conversationId, changes, stance=None, integrationId=None, client="api"
    ):  # type: ignore[no-untyped-def]
        """
        L{setAttitude}, adding C{changes} (C{{"trust": -10}}) to the axes.
        C{client}: a client session also told of the levels that changed.
        """

    def export(characterId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """The conversation as a JSON document for the game's save file."""

    def restore(
        characterId, conversationId, document, integrationId=None, empty=False, unverified=False
    ):  # type: ignore[no-untyped-def]  # noqa: E501
        """
        Replace the conversation with an exported document; StoreError if
        wrong, if it has no entries and C{empty} is not true, or if it has the
        older, unsealed format and C{unverified} is not true.
        """

    def loaded(characterId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """A Deferred that fires once the conversation is loaded (read off the reactor)."""

    def conversationsLater(integrationId=None, characterId=None):  # type: ignore[no-untyped-def]
        """C{conversations}, as a Deferred, the file read off the reactor."""

    def forget(characterId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """Remove the conversation; whether there was one."""

    def save(saveId, conversationId, integrationId=None, characterId=None):  # type: ignore[no-untyped-def]  # noqa: E501
        """
        Snapshot every character's conversation under C{conversationId} (or
        only C{characterId}'s) as the game's save C{saveId}, replacing one of
        that name: a Deferred of its brief, once written.
        """

    def loadSave(saveId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """
        Restore save C{saveId}: its conversations as saved, the others under
        C{conversationId} forgotten.  A Deferred of what was restored and
        forgotten; it fails with SaveRefused while a turn of that conversation
        is in flight, KeyError when there is no such save.
        """

    def listSaves(conversationId=None, integrationId=None):  # type: ignore[no-untyped-def]
        """A Deferred of the saves' briefs (of one conversation id, or all), newest first."""

    def dropSave(saveId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """Delete a save: a Deferred of whether there was one."""

    def prune(  # type: ignore[no-untyped-def]
        olderThanDays=None,
        keepEntries=None,
        keepSaves=None,
        maxBytes=None,
        conversationId=None,
        characterId=None,
        integrationId=None,
    ):
        """
        Forget old entries (summaries, facts and memories stay) and saves: a
        Deferred of what went (C{removed}) and the store's C{size} after.
        """

    def storeSize():  # type: ignore[no-untyped-def]
        """A Deferred of the store's size: bytes, conversations, entries, saves."""

    def greeted(characterId, conversationId, integrationId=None):  # type: ignore[no-untyped-def]
        """The player saw the card's first_mes: it opens the conversation."""

    def know(text, keys=(), scope="world", constant=False, integrationId=None):  # type: ignore[no-untyped-def]
        """Add world knowledge (scope world, character:ID, location:NAME or scene:NAME)."""

    def unknow(knowledgeId, integrationId=None):  # type: ignore[no-untyped-def]
        """Remove world knowledge; whether there was such."""


# What other plugins tell memory through the chain (a scene's lines, an
# action's outcome): envelopes and meta, never a call, so memory can be left
# out or replaced and the sender does not change.

#: Toward RPEngine: a line C{characterId}'s conversation should hold, though
#: it was no request of that character's (another character's line it heard
#: in a scene, the player's line to someone else, an action's outcome).
#: Fields: C{integrationId}, C{characterId}, C{role} (C{"player"},
#: C{"other"} or C{"event"}), C{speaker}, C{text}, and C{cutOff: true}
#: for a line heard only in part (another character's line cut short by a
#: barge-in: it is remembered as far as it was heard, marked as cut off);
#: C{lineId}, the request id of the line heard whole (when the player then
#: cuts that line's speech, the entry is cut as its speaker's is, while it
#: is the newest of the listener's conversation);
#: C{meta} names the conversation as a request's does (C{client},
#: C{conversation}).  Memory records it and drops it; without memory the
#: engine end drops it.
HEARD = "x-memory.heard"

#: A request's C{meta} key for the line its turn opens with, when that is
#: not the player's words in C{event.text}: a dict with C{role},
#: C{speaker} and C{text} (a scene's character answering another), and
#: C{lineId} as L{HEARD}'s.
SAID = "said"

#: The roles a heard or said line may have.
HEARD_ROLES = ("player", "other", "event")

#: The attitude axes a change may name (docs/memory.md, Attitude).
ATTITUDE_AXES = AXES

#: Toward RPEngine: C{characterId}'s attitude to the player changes by
#: C{change} (C{{"trust": -10, ...}}, added to each axis), because of
#: C{reason} (what happened, e.g. an action done: for the log and the game's
#: event).  C{meta} names the conversation as a request's does.  Memory
#: applies it and drops it; without memory the engine end drops it.
ATTITUDE = "x-memory.attitude"


def attitudeChange(
    integrationId: str,
    characterId: str,
    change: dict[str, int],
    reason: str,
    meta: dict[str, Any] | None = None,
) -> Envelope:
    """An L{ATTITUDE} envelope."""
    envelope = Envelope.build(
        ATTITUDE, integrationId=integrationId, characterId=characterId, change=dict(change)
    )
    envelope.fields["reason"] = reason
    envelope.meta.update(meta or {})
    return envelope


def heard(
    integrationId: str,
    characterId: str,
    role: str,
    speaker: str,
    text: str,
    meta: dict[str, Any] | None = None,
    cutOff: bool = False,
    lineId: str | None = None,
) -> Envelope:
    """
    An L{HEARD} envelope: C{characterId} heard C{speaker} say C{text}
    (only that much of a line cut short, with C{cutOff}).  C{lineId}: the
    request id of the line heard whole, should the player cut its speech
    later (the entry is then cut as the speaker's is).
    """
    if role not in HEARD_ROLES:
        raise ValueError(f"role must be one of {', '.join(HEARD_ROLES)}")
    envelope = Envelope.build(
        HEARD,
        integrationId=integrationId,
        characterId=characterId,
        role=role,
        speaker=speaker,
        text=text,
    )
    if cutOff:
        envelope.fields["cutOff"] = True
    if lineId:
        envelope.fields["lineId"] = lineId
    envelope.meta.update(meta or {})
    return envelope
