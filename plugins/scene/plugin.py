"""
The scene plugin in the chain: one conversation of the player and several
characters, played with an RPEngine that plays one character per request.

A client with an open scene sends its turns as usual (C{text}, C{audio},
C{voice-capture}); each becomes a player's line in the scene:

  1. Toward RPEngine, the request is given to the character who answers
     (L{director.answerer}): its C{characterId}, its card, its voice, and a
     prompt context that tells it who else is there.  The characters who
     hear the player but do not answer hear the line
     (L{rpmiddleware.builtin.memory.api.HEARD}).
  2. Toward the game, every envelope of a line carries its speaker in
     C{meta["speaker"]}, so the client's turn tags each message with it.
     When a line is complete as text, another character may react
     (L{director.reactor}, at most C{reactions} a player turn): its request
     goes to RPEngine at once, with the line as its event, so it waits in
     RPEngine's queue while the line is still spoken, and the gap between
     the two lines is the model's time, not ours plus the playback.
  3. The client's turn is the whole exchange: the reactions' envelopes reach
     it under its request id, and it ends when the last line ends.  A
     cancel (the client's, or a barge-in) stops every line still to come.

Each character's memory holds what it heard, with the speaker's name, and
nothing it did not: the plugin tells memory through the chain, and knows
nothing of how memory keeps it.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from twisted.logger import Logger
from zope.interface import implementer

from rpmiddleware.builtin.memory.api import HEARD_ROLES, SAID, heard
from rpmiddleware.builtin.scene import director
from rpmiddleware.builtin.scene.api import IScenes
from rpmiddleware.builtin.scene.model import (
    MAX_CAST,
    PLAYER,
    Member,
    Scene,
    SceneError,
    checkHearing,
    configureScene,
    parseMember,
    parseScene,
)
from rpmiddleware.plugin import (
    AUTO_EVENT,
    CANCELLING,
    OPENING,
    TERMINAL,
    TURN_PLAYED,
    ChainPlugin,
    Envelope,
    IChainContext,
    IClientExtension,
    IEnvelopePlugin,
    Speech,
    addSceneText,
    answerOp,
    clientMessage,
    heardText,
    speechmarks,
    textOfDelta,
    toClient,
    trimmed,
)
from rpmiddleware.plugin import meta as metakeys

NAME = "scene"
CLIENT_TYPES = ("scene",)
#: The request meta key a Python API caller names the answering character with.
ADDRESSEE = "addressee"
#: What of a request's meta a reaction keeps (who asked, their rate, their
#: conversation and place, their playbook stage, where feelings come from,
#: the speech marks asked for).
_KEPT_META = (
    "client",
    "outputSampleRate",
    "conversation",
    "location",
    "scene",
    "stage",
    metakeys.FEELINGS,
    speechmarks.META,
)
_PROMPT_FIELDS = ("interactionMode", "promptScene", "promptDirective")
#: What a reaction's request takes of the game's: its output, the player and
#: the prompt context the game (or the playbook) gave it.
_BASE_FIELDS = ("output", "player", *_PROMPT_FIELDS)
OTHER, PLAYER_ROLE = HEARD_ROLES[1], HEARD_ROLES[0]
#: Spoken exchanges that ended kept for a late cut (L{TURN_PLAYED}): their
#: lines, at most this many exchanges.
ENDED_KEPT = 256


@dataclass
class _Exchange:
    """
    One player turn in a scene: the game's request and every line that
    answers it, each a request of its own to RPEngine.
    """

    requestId: str
    client: str
    scene: Scene
    #: What the reactions' requests take of the game's (L{_BASE_FIELDS}),
    #: as the game and the playbook made it.
    base: dict[str, Any]
    meta: dict[str, Any]
    player: str
    reactionsLeft: int
    lines: dict[str, Member] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    spoken: list[str] = field(default_factory=list)
    held: Envelope | None = None
    final: Envelope | None = None
    cancelled: bool = False
    #: The text deltas of each streaming line that passed toward the client,
    #: until the line is complete as text (a line cut short is heard as far
    #: as they go).
    partial: dict[str, list[str]] = field(default_factory=dict)
    #: The speech of each streaming line that passed toward the client,
    #: segment by segment (a line cut short while it is spoken is heard as
    #: far as its speech was played, when the cancel says).
    speech: dict[str, Speech] = field(default_factory=dict)
    #: The lines whose speech passed toward the client, in that order: a
    #: played amount (L{metakeys.PLAYED}) names one by its place here
    #: (L{metakeys.PLAYED_LINE}), else it is about the last of them.
    voiced: list[str] = field(default_factory=list)


@implementer(IEnvelopePlugin, IClientExtension, IScenes)
class ScenePlugin(ChainPlugin):
    name = NAME
    clientMessageTypes = CLIENT_TYPES
    log = Logger()

    def __init__(self, cards: Any, timeline: Any, integrationId: str = "rpmiddleware") -> None:
        self.cards = cards
        self.timeline = timeline
        self.integrationId = integrationId
        #: Client session id to its open scene.
        self.scenes: dict[str, Scene] = {}
        #: Each line's request id (the game's, and the reactions') to its
        #: exchange, while that line plays or waits.
        self._lines: dict[str, _Exchange] = {}
        #: The game's request id to its exchange, until the exchange's last
        #: line ends: a cancel of the game's turn finds it while a reaction
        #: plays, after the game's own line has ended.
        self._exchanges: dict[str, _Exchange] = {}
        #: Spoken exchanges that ended whole, by the game's request id: the
        #: player may still hear them, and cut one (L{TURN_PLAYED}).
        self._ended: OrderedDict[str, _Exchange] = OrderedDict()

    # The Python API (IScenes); the client's ops call it too.

    def _own(self, card: dict[str, Any]) -> tuple[dict[str, Any], str]:
        try:
            owned = self.cards.canonicalNow(card)
        except ValueError as e:
            raise SceneError(f"a cast card is not canonical JSON ({e})")
        return owned.document, owned.hash

    def openScene(self, description: Mapping[str, Any], client: str = "api") -> dict[str, Any]:
        made = parseScene(description, self.integrationId, self._own)
        self.scenes[client] = made
        self.log.info(
            "client {client} opened scene {sceneId} with {cast}",
            client=client,
            sceneId=made.sceneId,
            cast=list(made.cast),
        )
        return made.describe()

    def _running(self, client: str) -> Scene:
        found = self.scenes.get(client)
        if found is None:
            raise SceneError("no scene is open; send scene open first")
        return found

    def join(self, member: Mapping[str, Any], client: str = "api") -> dict[str, Any]:
        running = self._running(client)
        made = parseMember(member, "scene.member", self._own)
        if made.characterId not in running.cast and len(running.cast) >= MAX_CAST:
            raise SceneError(f"the scene has {MAX_CAST} characters already; at most {MAX_CAST}")
        before = running.cast.get(made.characterId)
        running.cast[made.characterId] = made
        try:
            checkHearing(running)
        except SceneError:
            if before is None:
                del running.cast[made.characterId]
            else:
                running.cast[made.characterId] = before
            raise
        return running.describe()

    def leave(self, characterId: str, client: str = "api") -> dict[str, Any]:
        running = self._running(client)
        if characterId not in running.cast:
            raise SceneError(f"scene.characterId {characterId!r} is not in the scene")
        if len(running.cast) == 1:
            raise SceneError("scene.characterId is the last character; close the scene instead")
        del running.cast[characterId]
        return running.describe()

    def address(self, characterId: str, client: str = "api") -> dict[str, Any]:
        running = self._running(client)
        if characterId not in running.cast:
            raise SceneError(f"scene.characterId {characterId!r} is not in the scene")
        running.nextAddressee = characterId
        return running.describe()

    def closeScene(self, client: str = "api") -> bool:
        return self.scenes.pop(client, None) is not None

    def scene(self, client: str = "api") -> dict[str, Any] | None:
        found = self.scenes.get(client)
        return found.describe() if found is not None else None

    def clientSessionEnded(self, client: str, context: IChainContext) -> None:
        self.scenes.pop(client, None)
        for requestId in [r for r, e in self._ended.items() if e.client == client]:
            del self._ended[requestId]

    # Toward RPEngine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        if kind in OPENING:
            # Ours, and a line sent again (resubmitted in a new RPEngine
            # session, already given its character), pass as they are.
            if envelope.meta.get(metakeys.ORIGIN) != NAME and envelope.requestId not in self._lines:
                running = self.scenes.get(str(envelope.meta.get(metakeys.CLIENT) or "api"))
                if running is not None:
                    self._begin(envelope, running, context)
            return envelope
        if kind in CANCELLING:
            exchange = self._exchanges.get(envelope.requestId or "")
            if exchange is not None:
                return self._withdraw(exchange, envelope, context)
            return envelope
        if kind == TURN_PLAYED:
            ended = self._ended.pop(envelope.requestId or "", None)
            if ended is not None:
                self._playedAfterEnd(ended, envelope, context)
                return None
            return envelope
        message = clientMessage(envelope, CLIENT_TYPES)
        if message is not None:
            self._clientMessage(str(envelope.meta.get(metakeys.CLIENT) or "api"), message, context)
            return None
        return envelope

    def _begin(self, envelope: Envelope, running: Scene, context: IChainContext) -> None:
        """A player's line: given to the character who answers it."""
        fields, meta = envelope.fields, envelope.meta
        requestId = envelope.requestId or ""
        event = fields.get("event")
        text = trimmed(event.get("text")) if isinstance(event, Mapping) else ""
        capture = envelope.type == "voice.capture.start"
        answering = director.answerer(
            running, None if capture else text, str(fields.get("characterId")), meta.get(ADDRESSEE)
        )
        running.nextAddressee = None
        player = trimmed((fields.get("player") or {}).get("displayName")) or "Player"
        exchange = _Exchange(
            requestId,
            str(meta.get(metakeys.CLIENT) or "api"),
            running,
            {name: fields[name] for name in _BASE_FIELDS if name in fields},
            dict(meta),
            player,
            running.reactions,
        )
        self._speak(fields, answering, running, player)
        meta[metakeys.SPEAKER] = answering.asSpeaker()
        meta.setdefault("scene", running.sceneId)
        exchange.meta.setdefault("scene", running.sceneId)
        exchange.lines[requestId] = answering
        exchange.pending.add(requestId)
        self._lines[requestId] = exchange
        self._exchanges[requestId] = exchange
        self._note(exchange)
        if text and not capture:
            self._hearPlayer(exchange, answering, text, context)

    def _speak(self, fields: dict[str, Any], member: Member, running: Scene, player: str) -> None:
        """
        Make C{fields} a request of C{member}'s: its id, card and voice, and
        the scene in its prompt context.
        """
        fields["characterId"] = member.characterId
        fields["integrationId"] = running.integrationId
        fields["card"] = dict(member.transfer)
        output = fields.get("output")
        if (
            member.voice
            and isinstance(output, Mapping)
            and isinstance(output.get("audio"), Mapping)
        ):
            fields["output"] = {**output, "audio": {**output["audio"], "voice": member.voice}}
        addSceneText(fields, sceneText(running, member, player), running.sceneId)

    def _hearPlayer(
        self, exchange: _Exchange, answering: Member, text: str, context: IChainContext
    ) -> None:
        for listener in exchange.scene.listeners(PLAYER):
            if listener is not answering:
                line = f"(to {answering.name}) {text}"
                self._tell(exchange, listener, PLAYER_ROLE, exchange.player, line, context)

    def _tell(
        self,
        exchange: _Exchange,
        listener: Member,
        role: str,
        speaker: str,
        text: str,
        context: IChainContext,
        cutOff: bool = False,
        lineId: str | None = None,
    ) -> None:
        """C{listener} heard C{speaker} say C{text}: its memory is told."""
        meta: dict[str, Any] = {
            k: exchange.meta[k] for k in ("client", "conversation") if k in exchange.meta
        }
        envelope = heard(
            exchange.scene.integrationId,
            listener.characterId,
            role,
            speaker,
            text,
            meta,
            cutOff,
            lineId,
        )
        context.sendToEngine(envelope)

    def _withdraw(self, exchange: _Exchange, envelope: Envelope, context: IChainContext) -> Any:
        """
        The game cancelled its turn (or barged in): every line playing or
        waiting is cancelled upstream now, whichever it is (the game's own
        line may have ended while a reaction plays), and no line is asked
        for after this; the turn ends when they have.

        How much of the speech was played (L{metakeys.PLAYED}) is about the
        line that was playing (L{_playedLine}): it goes on that line's
        cancel, or, when that line already completed upstream (its speech
        still playing while a later line waits or streams), in a
        L{TURN_PLAYED} of its own request, so its speaker and those who
        heard it remember it as far as it was played.  The later lines
        whose speech passed were not heard at all (none of their speech was
        played), and are told so the same way, the newest first, before
        that line: an entry is cut only while it is the newest.  Earlier
        lines stay whole.
        """
        exchange.cancelled = True
        played = self._played(exchange, envelope.meta.get(metakeys.PLAYED))
        game = exchange.requestId
        for requestId in reversed(list(exchange.lines)):
            amount = played.get(requestId)
            if requestId == game:
                continue
            if requestId in exchange.pending:
                cancel = Envelope.build("request.cancel", requestId=requestId)
                cancel.meta.update({metakeys.ORIGIN: NAME, metakeys.CLIENT: exchange.client})
                if amount is not None:
                    # How much of this line's speech was played: its speaker
                    # remembers it as far as the player heard it.
                    cancel.meta[metakeys.PLAYED] = amount
                context.sendToEngine(cancel)
            elif amount is not None:
                self._sendPlayed(exchange, requestId, amount, context)
        self._heardInPart(exchange, context, played)
        if game in exchange.pending:
            if game in played:
                envelope.meta[metakeys.PLAYED] = played[game]
            else:
                envelope.meta.pop(metakeys.PLAYED, None)
            return envelope
        if game in played:
            self._sendPlayed(exchange, game, played[game], context)
        return None

    def _played(self, exchange: _Exchange, played: Any) -> dict[str, dict[str, Any]]:
        """
        What was played of each line, by its request id, given a played
        amount (L{metakeys.PLAYED}) of the turn: that amount for the line
        that was playing, the one its C{line} names
        (L{metakeys.PLAYED_LINE}: its place among the lines whose speech
        passed toward the client), else the last of them; none for the
        later lines whose speech passed; nothing for earlier lines (played
        whole) nor for lines that never spoke.  Empty when nobody knows, or
        when C{line} names no line that spoke.
        """
        if not isinstance(played, Mapping) or not exchange.voiced:
            return {}
        line = played.get(metakeys.PLAYED_LINE, len(exchange.voiced) - 1)
        if type(line) is not int or not 0 <= line < len(exchange.voiced):
            self.log.warn(
                "scene {sceneId}: what was played of turn {turnId} names line {line}, but "
                "{count} of its lines spoke; nothing of it is cut",
                sceneId=exchange.scene.sceneId,
                turnId=exchange.requestId,
                line=line,
                count=len(exchange.voiced),
            )
            return {}
        playing = exchange.voiced[line]
        amount = {k: v for k, v in played.items() if k != metakeys.PLAYED_LINE}
        found = {playing: amount}
        order = list(exchange.lines)
        silent = {"samples": 0, "sampleRate": amount.get("sampleRate")}
        for later in order[order.index(playing) + 1 :]:
            if later in exchange.voiced:
                found[later] = silent
        return found

    def _sendPlayed(
        self, exchange: _Exchange, requestId: str, played: Mapping[str, Any], context: IChainContext
    ) -> None:
        """
        Line C{requestId} completed upstream (told whole to those who hear
        it, remembered whole by its speaker) was played only C{played}:
        memory cuts it (L{TURN_PLAYED}).
        """
        envelope = Envelope.build(TURN_PLAYED, requestId=requestId, played=dict(played))
        envelope.meta.update({metakeys.ORIGIN: NAME, metakeys.CLIENT: exchange.client})
        context.sendToEngine(envelope)

    def _playedAfterEnd(
        self, exchange: _Exchange, envelope: Envelope, context: IChainContext
    ) -> None:
        """
        A spoken exchange that ended whole upstream was cut while the
        player heard it (L{TURN_PLAYED} of the game's request, its played
        amount about the turn's line that was playing): each line's own
        request is told what of it was played (L{_played}), the latest
        first, so memory cuts the line that was playing and forgets the
        later ones, for their speakers and for those who heard them.
        """
        played = self._played(exchange, envelope.get("played"))
        order = list(exchange.lines)
        for requestId in reversed(order):
            amount = played.get(requestId)
            if amount is not None:
                self._sendPlayed(exchange, requestId, amount, context)

    def _heardInPart(
        self, exchange: _Exchange, context: IChainContext, played: Mapping[str, Any]
    ) -> None:
        """
        The lines cut short while they streamed: those who hear the speaker
        heard them as far as the client got them, marked as cut off (the
        speaker's own memory keeps its line so, by the memory plugin's rule
        for a withdrawn request).  When the cancel says how much of a
        line's speech was played (C{played}, L{_played}: the line that was
        playing, and none of the later lines that spoke), they heard it as
        far as its sentences were played whole (L{heardText}), as the
        speaker remembers it.
        """
        running = exchange.scene
        current = self.scenes.get(exchange.client) is running
        for requestId, parts in exchange.partial.items():
            text = "".join(parts)
            speech = exchange.speech.get(requestId)
            amount = played.get(requestId)
            heardUpTo = speech.heardSegments(amount) if speech is not None else None
            if amount is not None and heardUpTo is not None:
                text = heardText(text, False, heardUpTo)[0]
            text = text.strip()
            speaker = exchange.lines.get(requestId)
            if not text or speaker is None or not current:
                continue
            for listener in running.listeners(speaker.characterId):
                self._tell(exchange, listener, OTHER, speaker.name, text, context, cutOff=True)
        exchange.partial.clear()
        exchange.speech.clear()

    # Toward the game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        requestId = envelope.requestId or ""
        exchange = self._lines.get(requestId)
        if exchange is None:
            return envelope
        speaker = exchange.lines[requestId]
        if requestId != exchange.requestId:
            envelope = envelope.replace(requestId=exchange.requestId)
        kind = envelope.type
        if kind.startswith("reply."):
            envelope.meta[metakeys.SPEAKER] = speaker.asSpeaker()
        if kind in TERMINAL:
            return self._lineEnded(exchange, requestId, envelope, context)
        if kind == "reply.text.delta" and not exchange.cancelled:
            exchange.partial.setdefault(requestId, []).append(textOfDelta(envelope.fields))
        elif kind in ("reply.audio.start", "reply.audio.chunk") and not exchange.cancelled:
            speech = exchange.speech.setdefault(requestId, Speech())
            if requestId not in exchange.voiced:
                exchange.voiced.append(requestId)
            if kind == "reply.audio.start":
                speech.started(envelope.fields)
            else:
                speech.chunk(envelope.fields)
        elif kind == "reply.text.completed":
            exchange.partial.pop(requestId, None)
            self._lineSaid(exchange, speaker, str(envelope.get("text") or ""), context, requestId)
        elif kind == "voice.capture.transcript" and requestId == exchange.requestId:
            words = trimmed(envelope.get("text"))
            if words:
                self._hearPlayer(exchange, speaker, words, context)
        return envelope

    def _lineSaid(
        self,
        exchange: _Exchange,
        speaker: Member,
        text: str,
        context: IChainContext,
        lineId: str | None = None,
    ) -> None:
        """
        A line is complete as text: those who heard it hear it (whole,
        named by C{lineId}, its request id, so that memory cuts what they
        heard should the player cut its speech), and one of them may react
        at once.
        """
        if exchange.cancelled:
            # Withdrawn while this line's text was on its way: the client
            # never gets it, so no one hears it and no one reacts to it.
            return
        running = exchange.scene
        cid = speaker.characterId
        running.lastSpeaker = cid
        if cid in running.spoken:
            running.spoken.remove(cid)
        running.spoken.append(cid)
        exchange.spoken.append(cid)
        self._note(exchange)
        text = text.strip()
        if not text:
            return
        current = self.scenes.get(exchange.client) is running and cid in running.cast
        listeners = running.listeners(cid) if current else []
        reacting = None
        if current and exchange.reactionsLeft > 0 and not exchange.cancelled:
            reacting = director.reactor(running, cid, text, exchange.spoken)
        for listener in listeners:
            if listener is not reacting:
                self._tell(exchange, listener, OTHER, speaker.name, text, context, lineId=lineId)
        if reacting is not None:
            exchange.reactionsLeft -= 1
            self._react(exchange, reacting, speaker, text, context, lineId)

    def _react(
        self,
        exchange: _Exchange,
        reacting: Member,
        speaker: Member,
        text: str,
        context: IChainContext,
        lineId: str | None = None,
    ) -> None:
        base = exchange.base
        requestId = uuid.uuid4().hex
        fields: dict[str, Any] = {
            "requestId": requestId,
            "eventId": uuid.uuid4().hex,
            "event": {"text": f"{speaker.name}: {text}"},
        }
        fields.update(base)
        self._speak(fields, reacting, exchange.scene, exchange.player)
        fields["interactionMode"] = AUTO_EVENT
        envelope = Envelope.build("reply.request", **fields)
        envelope.meta.update({k: exchange.meta[k] for k in _KEPT_META if k in exchange.meta})
        envelope.meta.update(
            {
                metakeys.ORIGIN: NAME,
                metakeys.TURN: exchange.requestId,
                metakeys.SPEAKER: reacting.asSpeaker(),
                SAID: {"role": OTHER, "speaker": speaker.name, "text": text, "lineId": lineId},
            }
        )
        exchange.lines[requestId] = reacting
        exchange.pending.add(requestId)
        self._lines[requestId] = exchange
        self.log.info(
            "scene {sceneId}: {reacting} reacts to {speaker} (turn {turnId})",
            sceneId=exchange.scene.sceneId,
            reacting=reacting.characterId,
            speaker=speaker.characterId,
            turnId=exchange.requestId,
        )
        context.sendToEngine(envelope)

    def _lineEnded(
        self, exchange: _Exchange, requestId: str, envelope: Envelope, context: IChainContext
    ) -> Envelope | None:
        """
        One line ended: the turn ends with the last of them, as the game's
        line ended, or as the last reply completed.
        """
        exchange.pending.discard(requestId)
        exchange.partial.pop(requestId, None)
        exchange.speech.pop(requestId, None)
        self._lines.pop(requestId, None)
        kind = envelope.type
        if kind == "reply.completed":
            exchange.held = envelope
        elif requestId == exchange.requestId or exchange.cancelled:
            exchange.final = exchange.final or envelope
            if not exchange.cancelled:
                exchange.cancelled = True
                self._withdraw(exchange, envelope, context)
        else:
            self.log.warn(
                "scene {sceneId}: a reaction ended with {kind} ({code}); the turn ends there",
                sceneId=exchange.scene.sceneId,
                kind=kind,
                code=envelope.get("code") or envelope.get("reason"),
            )
        if exchange.pending:
            return None
        self._exchanges.pop(exchange.requestId, None)
        if exchange.voiced and not exchange.cancelled and exchange.final is None:
            # Its speech may still be playing: kept, should the player cut it.
            self._ended[exchange.requestId] = exchange
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
        return exchange.final or exchange.held or envelope

    def _note(self, exchange: _Exchange) -> None:
        """The console's view of the turn: the scene, its cast, who spoke."""
        if self.timeline is None:
            return
        self.timeline.note(
            exchange.requestId,
            scene={
                "sceneId": exchange.scene.sceneId,
                "cast": [m.name for m in exchange.scene.cast.values()],
                "speakers": [
                    exchange.scene.cast[c].name if c in exchange.scene.cast else c
                    for c in exchange.spoken
                ],
            },
        )

    # The client's scene message.

    def _clientMessage(self, client: str, message: dict[str, Any], context: IChainContext) -> None:
        def run() -> dict[str, Any]:
            return {"scene": self._op(client, message.get("op"), message)}

        context.sendToGame(toClient(client, answerOp(message, "scene-state", run)))

    def _op(self, client: str, op: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        if op == "open":
            return self.openScene(message, client)
        if op == "join":
            return self.join(message.get("member"), client)  # type: ignore[arg-type]
        if op in ("leave", "address"):
            characterId = message.get("characterId")
            if not isinstance(characterId, str):
                raise SceneError("scene.characterId must be a string")
            return (self.leave if op == "leave" else self.address)(characterId, client)
        if op == "set":
            running = self._running(client)
            configureScene(running, message)
            return running.describe()
        if op == "close":
            self.closeScene(client)
            return None
        if op == "state":
            return self.scene(client)
        raise SceneError("scene.op must be one of open, join, leave, address, set, close, state")


def sceneText(running: Scene, member: Member, player: str) -> str:
    """
    What a character is told of the scene: who is there, that it speaks
    for itself alone, and the scene's own context.
    """
    others = [m.name for m in running.cast.values() if m is not member]
    present = ", ".join([*others, f"{player} (the player)"])
    lines = [
        f"This is a scene with several people. You are {member.name}: speak only as "
        f"{member.name}, never for anyone else, and do not write anyone's name before "
        "your words.",
        f"Also present: {present}. Lines of others are shown as Name: words.",
    ]
    if running.context:
        lines.append(f"Scene: {running.context}")
    return "\n".join(lines)


__all__ = ["NAME", "ScenePlugin", "sceneText"]
