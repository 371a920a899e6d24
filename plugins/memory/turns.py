"""
The memory plugin's turn bookkeeping: what a player's turn in flight will
add to its conversation (L{Turn}), what the player heard of a reply
(C{heard}, C{played} and a late cut), and keeping a turn when it ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpmiddleware.builtin.memory.api import HEARD_ROLES
from rpmiddleware.builtin.memory.conversation import (
    CHARACTER,
    COMPLETE,
    INTERRUPTED,
    OTHER,
    PLAYER,
    UNHEARD,
    Key,
)
from rpmiddleware.builtin.memory.inflight import Completed, Turn
from rpmiddleware.builtin.memory.parts import MemoryParts
from rpmiddleware.plugin import (
    Envelope,
    heardText,
    meta,
    trimmed,
)

#: A character's mood as the feelings plugin writes it on a reply (meta
#: L{meta.MOOD}): kept with the conversation under this state name, and given
#: back on the conversation's next request.
MOOD_META, MOOD_STATE = meta.MOOD, "mood"
#: Completed spoken replies kept for a late cut (L{TURN_PLAYED}): the last of
#: each conversation, until its next turn starts, at most this many.
COMPLETED_KEPT = 256


def lineOf(fields: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """
    The entry a heard or said line makes (L{HEARD}, L{SAID}), or C{None}
    when it has no valid role or no words.
    """
    role, speaker, text = fields.get("role"), fields.get("speaker"), fields.get("text")
    if role not in HEARD_ROLES or not isinstance(text, str) or not text.strip():
        return None
    speaker = trimmed(speaker) if isinstance(speaker, str) else ""
    if role == OTHER and not speaker:
        return None
    status = INTERRUPTED if fields.get("cutOff") is True else COMPLETE
    return (str(role), speaker, text.strip(), status)


class TurnBook(MemoryParts):
    """
    L{Memory}'s turns, heard lines and ends of turns: a part of the
    plugin's class, in a module of its own.
    """

    def _heard(self, envelope: Envelope) -> None:
        """
        A line a character heard without being asked (L{HEARD}): it joins
        that character's conversation now, so the next request of theirs
        holds it.
        """
        line = lineOf(envelope.fields)
        if line is None:
            self.log.warn(
                "dropped a heard line without role, speaker and text for {characterId}",
                characterId=envelope.get("characterId"),
            )
            return
        key = self.keyOf(envelope.fields, envelope.meta)
        playing = self._playing(key)
        if playing is not None:
            # Heard while the character's own line plays: it happened after
            # that line began, so it is remembered after it.
            playing.after.append(line)
            return
        client = str(envelope.meta.get("client") or "api")
        conversation = self.conversation(key)
        self._heardWhole(envelope.get("lineId"), key, conversation.nextSeq, client)
        kept = self.storeFor(key).append(conversation, line)
        kept.addCallback(self._tellIfLost, client, key, "heard line")

    def _heardWhole(self, lineId: Any, key: Key, seq: int, client: str) -> None:
        """Entry C{seq} of C{key} holds line C{lineId}, heard whole."""
        if not isinstance(lineId, str) or not lineId:
            return
        self._heardLines.setdefault(lineId, []).append((key, seq, client))
        self._heardLines.move_to_end(lineId)
        while len(self._heardLines) > COMPLETED_KEPT:
            self._heardLines.popitem(last=False)

    def _cutHeard(self, lineId: str, text: str) -> None:
        """
        Line C{lineId}, heard whole, was played only as far as C{text}:
        the entries of those who heard it are cut so (or removed, when
        C{text} is empty), each only while it is the newest of that
        listener's conversation; else it is logged and left whole.
        """
        for key, seq, client in self._heardLines.pop(lineId, []):
            store = self.storeFor(key)
            conversation = store.cached(key)
            newest = conversation.entries[-1] if conversation and conversation.entries else None
            if (
                conversation is None
                or newest is None
                or newest.seq != seq
                or seq <= conversation.summarizedThrough
            ):
                self.log.warn(
                    "line {lineId} heard by {key} was played only in part, but that entry is "
                    "no longer the newest of the conversation; it is left whole",
                    lineId=lineId,
                    key=key.asDict(),
                )
                continue
            kept = store.cut(conversation, seq, text)
            kept.addCallback(self._tellIfLost, client, key, "heard line")

    def _playedAfterEnd(self, envelope: Envelope) -> None:
        """
        A reply remembered whole when RPEngine completed it was cut off
        while its speech still played (L{TURN_PLAYED}): its entry is cut to
        the sentences played whole, marked as cut off (or removed, when not
        even the first was), as a cancel would have cut it.  Only while
        that entry is still the newest of its conversation: what came after
        it was heard after it, and stays as it is.
        """
        requestId = envelope.requestId or ""
        done = next((d for d in self._completed.values() if d.requestId == requestId), None)
        if done is None:
            self.log.info(
                "no completed reply {requestId} to cut to what was played (its conversation "
                "moved on, or it was not spoken)",
                requestId=requestId,
            )
            return
        del self._completed[done.key]
        sentences = done.speech.heardSegments(envelope.get("played"))
        if sentences is None:
            return
        text, whole = heardText(done.reply, True, sentences)
        if whole:
            return
        self._cutHeard(requestId, text.strip())
        store = self.storeFor(done.key)
        conversation = store.cached(done.key)
        newest = conversation.entries[-1] if conversation and conversation.entries else None
        if (
            conversation is None
            or newest is None
            or newest.seq != done.seq
            or done.seq <= conversation.summarizedThrough
        ):
            self.log.warn(
                "reply {requestId} of {key} was heard only in part, but its entry is no longer "
                "the newest of the conversation; it is left whole",
                requestId=requestId,
                key=done.key.asDict(),
            )
            return
        kept = store.cut(conversation, done.seq, text.strip())
        kept.addCallback(self._tellIfLost, done.client, done.key, "turn")

    def _playing(self, key: Key) -> Turn | None:
        """The newest turn of C{key}'s conversation still in flight, if any."""
        found = None
        for turn in self._turns.values():
            if turn.key == key:
                found = turn
        return found

    def _keepMood(self, turn: Turn, mood: Any) -> None:
        """The mood a reply left its character in, kept with the conversation."""
        if not isinstance(mood, Mapping):
            return
        conversation = self.conversation(turn.key)
        try:
            kept = self.storeFor(turn.key).setState(conversation, MOOD_STATE, dict(mood))
        except ValueError as e:
            self.log.warn("a mood that JSON cannot write was not kept: {why}", why=str(e))
            return
        kept.addCallback(self._tellIfLost, turn.client, turn.key, "mood")

    def _ended(self, turn: Turn, kind: str, played: Any = None) -> None:
        """
        Remember a turn that ended (C{kind} its terminal type) or was
        withdrawn (C{kind} the cancel that passed toward RPEngine): the
        one rule for every way a turn ends.  A completed reply is
        remembered whole.  Any other end keeps the reply as far as it
        passed toward the client, the whole text once
        C{reply.text.completed} passed, else the deltas, marked as cut off
        unless it was whole; a turn that failed (C{request.error}) before
        any of its reply passed leaves nothing, so the game may ask again.
        A cancel that says how much of the reply's speech the player was
        played (C{played}, L{meta.PLAYED}) keeps the reply only as far as
        the sentences that speech said whole (L{heard}), once any speech
        passed toward the client.  What the character heard while the turn
        played follows it.
        """
        reply = turn.completed if turn.completed is not None else "".join(turn.parts)
        whole = kind == "reply.completed" or turn.completed is not None
        sentences = None
        cutHeard: str | None = None
        if played is not None and turn.speech is not None:
            sentences = turn.speech.heardSegments(played)
        if sentences is not None:
            reply, whole = heardText(reply, turn.completed is not None, sentences)
            if turn.completed is not None and not whole:
                # Those who heard it whole (told at its text's end) heard
                # only this much.
                cutHeard = reply.strip()
        conversation = self.conversation(turn.key)
        said: list[tuple[str, str, str, str]] = []
        if kind == "request.error" and not reply.strip():
            pass
        elif turn.player is not None:
            said.append(turn.player)
        elif kind == "reply.completed" or reply.strip():
            # A capture that never told its words.
            said.append((PLAYER, "", "", UNHEARD))
        status = COMPLETE if whole else INTERRUPTED
        seq = None
        if reply.strip() and said:
            seq = conversation.nextSeq + len(said)
            said.append((CHARACTER, turn.character, reply.strip(), status))
        # What the character heard while its line played comes after it.
        said.extend(turn.after)
        if seq is not None and kind == "reply.completed" and turn.speech is not None:
            # Its speech may still be playing: kept, should the player cut it.
            self._completed.pop(turn.key, None)
            self._completed[turn.key] = Completed(
                turn.requestId, turn.key, seq, reply, turn.speech, turn.client
            )
            while len(self._completed) > COMPLETED_KEPT:
                self._completed.popitem(last=False)
        if turn.heardLine is not None and said and said[0] is turn.player:
            self._heardWhole(turn.heardLine, turn.key, conversation.nextSeq, turn.client)
        if said:
            kept = self.storeFor(turn.key).append(conversation, *said)
            kept.addCallback(self._tellIfLost, turn.client, turn.key, "turn")
            self.summaries.kept(turn.key)
            self.reflections.noted(conversation)
            if conversation.unsummarizedTokens() > self.settings.summarize_after_tokens:
                self.summaries.dueFor(turn.key)
        if cutHeard is not None:
            self._cutHeard(turn.requestId, cutHeard)
