"""
The memory plugin in the chain: it remembers each conversation as the client
got it, and gives every request the conversation so far.

Toward RPEngine it sees every request a game makes: it finds the request's
conversation (L{keyOf}), plans what the model is given
(L{rpmiddleware.builtin.memory.planner}) and sends the planned card in place
of the game's.  Toward the game it reads what the character said, as it
passes on to the client: the deltas until the client cancelled or barged in,
the whole text of a completed reply.  At the end of a turn the player's line
and the reply are one change of the store; a turn that failed leaves
nothing.  Between turns it has RPEngine condense what no longer fits
(L{rpmiddleware.builtin.memory.summarizer}), and it stops that request the
moment a player's turn arrives.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rpmiddleware.builtin.memory import ops
from rpmiddleware.builtin.memory.api import ATTITUDE, HEARD, SAID, IConversationMemory
from rpmiddleware.builtin.memory.attitude import (
    Attitude,
    levelOf,
)
from rpmiddleware.builtin.memory.attitudehooks import AttitudeHooks
from rpmiddleware.builtin.memory.conversation import (
    CHARACTER,
    COMPLETE,
    EVENT,
    GREETING,
    PLAYER,
    SESSION_PREFIX,
    UNHEARD,
    Conversation,
    Key,
    Where,
)
from rpmiddleware.builtin.memory.inflight import Completed, Turn
from rpmiddleware.builtin.memory.lorebook import Book, EntryReader, bookOf, entryFrom
from rpmiddleware.builtin.memory.lorebook import Entry as LoreEntry
from rpmiddleware.builtin.memory.metrics import MemoryMetrics
from rpmiddleware.builtin.memory.planner import Limits, Plan, plan
from rpmiddleware.builtin.memory.pythonapi import PythonAPI
from rpmiddleware.builtin.memory.recall import Found, Recalled, queryWords
from rpmiddleware.builtin.memory.reflection import Reflections, isReflectionRequest
from rpmiddleware.builtin.memory.saves import Saves
from rpmiddleware.builtin.memory.sessionindex import SessionIndex
from rpmiddleware.builtin.memory.settings import MemorySettings
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.builtin.memory.storeerrors import describe
from rpmiddleware.builtin.memory.summarizer import Summaries, isSummaryRequest
from rpmiddleware.builtin.memory.turns import MOOD_META, MOOD_STATE, TurnBook, lineOf
from rpmiddleware.plugin import (
    CANCELLING,
    OPENING,
    TERMINAL,
    TURN_PLAYED,
    ChainPlugin,
    Envelope,
    IChainContext,
    IClientExtension,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IMetricsSource,
    OwnedDocument,
    Speech,
    clientMessage,
    limitOf,
    meta,
    renderMacros,
    snapshotTransfer,
    textOfDelta,
    toClient,
    transferDocument,
    trimmed,
)

NAME = "memory"
#: The client message this plugin adds (L{ops}).
CLIENT_TYPES = ("memory",)
#: Lorebooks kept parsed (one per card the middleware plays).
BOOKS_CACHED = 64
#: The meta keys a Python API caller (or another plugin) names a turn's
#: conversation, location and scene with.
CONVERSATION, LOCATION, SCENE = "conversation", "location", "scene"
#: Matches fetched among the entries the plan may give as history (all of
#: them, in practice: the prompt's limit holds few long lines).
RECENT_MATCHES = 200


@implementer(IEnvelopePlugin, IClientExtension, IMetricsSource, IConversationMemory)
class Memory(TurnBook, PythonAPI, AttitudeHooks, MemoryMetrics, ChainPlugin):
    name = NAME
    clientMessageTypes = CLIENT_TYPES
    log = Logger()

    def __init__(
        self,
        settings: MemorySettings,
        reactor: Any,
        cards: Any,
        timeline: Any,
        integrationId: str = "rpmiddleware",
    ) -> None:
        self.settings = settings
        self.integrationId = integrationId
        self.reactor = reactor
        self.cards = cards
        self.timeline = timeline
        # Stored entries are stamped with the wall clock (the reactor's, where it has one).
        now = getattr(reactor, "seconds", time.time)
        self.now = now
        self.store = MemoryStore(
            settings.path, now, settings.cached, reactor, settings.write_timeout
        )
        #: The game's saves, pruning and the store's size (L{Saves}).
        self.saves = Saves(self)
        #: Ops in flight that hold every later envelope toward RPEngine
        #: (taking or loading a save, pruning: L{_holdUntil}).
        self._holding = 0
        self.store.onLost = self._lost
        self.sessions = MemoryStore(":memory:", now, settings.cached)
        #: Recall's index of the sessions' conversations (never written).
        self.sessionIndex = SessionIndex(reactor, self.sessions.isLoaded)
        #: Envelopes toward RPEngine held, in order, behind a conversation
        #: being read (L{envelopeToEngine}); C{None} while none is.
        self._held: deque[tuple[Envelope, IChainContext, Deferred[Any]]] | None = None
        self.limits = Limits(
            settings.max_input_tokens or None,
            settings.spoken_reserve_tokens,
            settings.summary_tokens,
            settings.facts_tokens,
            settings.lore_tokens,
        )
        #: Client session to the conversation id its game chose, and where it is.
        self.chosen: dict[str, str] = {}
        self.where: dict[str, Where] = {}
        self._turns: dict[str, Turn] = {}
        #: The last completed spoken reply of each conversation (L{Completed}).
        self._completed: OrderedDict[Key, Completed] = OrderedDict()
        #: The entries that hold a line heard whole (L{HEARD}'s and L{SAID}'s
        #: C{lineId}): the line's request id to (listener's key, seq,
        #: client) of each, cut with the line should its speech be cut.
        self._heardLines: OrderedDict[str, list[tuple[Key, int, str]]] = OrderedDict()
        #: Lorebooks of owned cards, and the game's knowledge, by integration.
        self._books: OrderedDict[int, tuple[Mapping[str, Any], Book]] = OrderedDict()
        self._readEntry = EntryReader()
        self._known: dict[str, list[LoreEntry]] = {}
        self.counts = {
            "planned": 0,
            "tokens": 0,
            "summaries": 0,
            "summaryFailures": 0,
            "reflections": 0,
            "reflectionFailures": 0,
        }
        #: Condensing in the player's pauses (L{Summaries}).
        self.summaries = Summaries(
            reactor=reactor,
            settings=settings,
            cards=cards,
            busy=lambda: bool(self._turns),
            storeFor=self.storeFor,
            counts=self.counts,
            context=lambda: self.context,
            log=self.log,
        )
        #: Reflecting in the pauses the summaries leave (L{Reflections}).
        self.reflections = Reflections(
            reactor=reactor,
            settings=settings,
            cards=cards,
            busy=lambda: bool(self._turns),
            summarizing=self.summaries.active,
            storeFor=self.storeFor,
            context=lambda: self.context,
            reflected=self._reflected,
            attitudeOf=lambda conversation: Attitude.fromState(conversation.state),
            counts=self.counts,
            log=self.log,
            personaOf=lambda key: self._personas.get(key, ""),
        )
        self.summaries.then = self.reflections.kick
        #: A few lines of each conversation's character card (its
        #: description and personality), for its reflections.
        self._personas: OrderedDict[Key, str] = OrderedDict()
        #: The client session that last played or changed each conversation:
        #: the one told when its character's attitude changes level.
        self._clientOf: OrderedDict[Key, str] = OrderedDict()
        #: Writes given up, by what they were (for /metrics).
        self.lostWrites: dict[str, int] = {}
        #: What recall found for each request held for its search (None:
        #: nothing to look for), until the request is planned.
        self._recalled: dict[str, Recalled | None] = {}
        #: Conversations that could not be read, and why (told at their next turn).
        self._unreadable: dict[Key, str] = {}

    # When the store fails: the game is told, and /metrics counts it.

    def _lost(self, key: Key | None, what: str, why: str) -> None:
        self.lostWrites[what] = self.lostWrites.get(what, 0) + 1
        self.log.error(
            "memory could not keep {what} of {key}: {why}",
            what=what,
            key=key.asDict() if key is not None else None,
            why=why,
        )

    def _tellIfLost(self, why: str | None, client: str, key: Key, what: str) -> None:
        """After a write: tell the client when it was not kept."""
        if why is not None:
            self._tell(client, key, "not-kept", what, why)

    def _tell(self, client: str, key: Key, event: str, what: str, why: str) -> None:
        """
        A C{memory-event} to a client session (the Python API's turns and
        the plugin's own have only the log and /metrics).
        """
        context = getattr(self, "context", None)
        if client in ("api", "memory") or context is None:
            return
        message = {"type": "memory-event", "event": event, "what": what, **key.asDict()}
        context.sendToGame(toClient(client, {**message, "reason": why}))

    def attached(self, context: IChainContext) -> None:
        """
        The chain was built: the store's size is measured now (on the
        store's reader thread), so the first scrape of C{/metrics} has it.
        """
        super().attached(context)
        self.saves.sizeForMetrics()

    def close(self) -> Deferred[Any] | None:
        """
        The daemon is stopping: no summary is asked any more, and the
        database's log is written back into its file, emptied and closed,
        after the writes already given, on the store's own thread (L{MemoryStore.close}), so that a
        clean stop leaves the main file alone, whole.  Changes after this
        are refused (L{StoreError}).
        """
        self.summaries.close()
        self.reflections.close()
        self.sessions.close()
        self.sessionIndex.close()
        return self.store.close()

    # Finding a conversation.

    def storeFor(self, key: Key) -> MemoryStore:
        return self.store if key.persistent else self.sessions

    def conversation(self, key: Key) -> Conversation:
        return self.storeFor(key).conversation(key)

    def keyOf(self, fields: Mapping[str, Any], meta: Mapping[str, Any]) -> Key:
        """
        The conversation a request belongs to: the one its caller names in
        C{meta["conversation"]}, the one its client chose, else its client
        session's own.
        """
        client = str(meta.get("client") or "api")
        chosen = meta.get(CONVERSATION) or self.chosen.get(client)
        conversationId = str(chosen) if chosen else SESSION_PREFIX + client
        return Key(str(fields.get("integrationId")), str(fields.get("characterId")), conversationId)

    # Toward RPEngine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        """
        Every envelope toward RPEngine, in the order it came.  One whose
        conversation is not loaded is held while the store reads it on its
        own thread (never on the reactor's), and every envelope after it is
        held behind it, so that nothing overtakes a request (a cancel
        reaching RPEngine before the request it cancels).
        """
        if self._held is not None:
            held: Deferred[Any] = Deferred()
            self._held.append((envelope, context, held))
            return held
        key = self._toRead(envelope)
        if key is None:
            return self._toEngine(envelope, context)
        held = Deferred()
        self._held = deque([(envelope, context, held)])
        self._read(key)
        return held

    def _toRead(self, envelope: Envelope) -> Key | None:
        """
        The conversation C{envelope} needs before it can go: a game's not
        loaded yet, or any whose recall is not searched yet.
        """
        kind = envelope.type
        if not (kind in OPENING or kind == HEARD) or envelope.meta.get("origin") == NAME:
            return None
        key = self.keyOf(envelope.fields, envelope.meta)
        if key in self._unreadable:
            return None
        if not key.persistent:
            # A session's conversation is in memory: only its recall waits.
            return key if self._toRecall(envelope) else None
        if self.store.cached(key) is not None and not self._toRecall(envelope):
            return None
        return key

    def _toRecall(self, envelope: Envelope) -> bool:
        """Whether C{envelope} is a request whose recall is not searched yet."""
        return (
            envelope.type in OPENING
            and bool(envelope.requestId)
            and envelope.requestId not in self._recalled
            and self.settings.recall
            and bool(self.settings.recall_tokens and self.settings.recall_moments)
        )

    def _recall(self, key: Key) -> None:
        """
        Search the store's index for the request at the head of the held
        envelopes (its conversation loaded), on the store's reader thread;
        the envelopes go on once it is done, found or not.
        """
        assert self._held
        envelope = self._held[0][0]
        requestId = envelope.requestId or ""
        self._recalled[requestId] = None
        conversation = self.storeFor(key).cached(key)
        search = None if conversation is None else self.recallQuery(envelope, conversation)
        if conversation is None or search is None:
            self._release()
            return
        if key.persistent:
            searched = self.store.searchLater(key, *search)
        else:
            searched = self.sessionIndex.searchLater(conversation, *search)

        def found(matches: list[Found]) -> None:
            self._recalled[requestId] = self.recalledOf(matches)

        def failed(failure: Failure) -> None:
            self.log.error(
                "memory could not search {key} for recall: {why}",
                key=key.asDict(),
                why=describe(failure.value),
            )

        searched.addCallbacks(found, failed).addBoth(self._release)

    def recallQuery(
        self, envelope: Envelope, conversation: Conversation
    ) -> tuple[list[str], int, int, int, int] | None:
        """
        The search a request's recall makes (L{MemoryStore.searchLater}'s
        arguments after the key), or C{None} when its line and scene have no
        word to look for.
        """
        words = queryWords(*self._recallTexts(envelope))
        if not words:
            return None
        # Entries this far back may be given as history (the prompt's
        # whole limit): all their matches are fetched, so that the older
        # ones are not crowded out by moments the plan holds anyway.
        limit = self.limits.maxInputTokens or limitOf(envelope.fields)
        recentFrom, reach = conversation.nextSeq, 0
        for entry in reversed(conversation.entries):
            if reach > limit or entry.seq <= conversation.summarizedThrough:
                break
            reach += entry.tokens
            recentFrom = entry.seq
        moments = self.settings.recall_moments
        return words, recentFrom, 4 * moments, RECENT_MATCHES, 2 * moments

    def recalledOf(self, matches: list[Found]) -> Recalled:
        """What the planner is given of a search's matches."""
        return Recalled(matches, self.settings.recall_tokens, self.settings.recall_moments)

    def _recallTexts(self, envelope: Envelope) -> list[str]:
        """What a request's recall looks for: its new line, then its scene."""
        fields, meta = envelope.fields, envelope.meta
        texts = [_eventText(fields)]
        said = meta.get(SAID)
        if isinstance(said, Mapping) and isinstance(said.get("text"), str):
            texts.insert(0, said["text"])
        where = self.where.get(str(meta.get("client") or "api"), Where())
        for name in (meta.get(SCENE) or where.scene, meta.get(LOCATION) or where.location):
            if isinstance(name, str):
                texts.append(name)
        return texts

    def _read(self, key: Key) -> None:
        if not key.persistent or self.store.cached(key) is not None:
            self._recall(key)
            return

        def failed(failure: Failure) -> None:
            self._unreadable[key] = describe(failure.value)
            self.log.error(
                "memory could not read {key}: {why}", key=key.asDict(), why=describe(failure.value)
            )

        self.store.load(key).addCallbacks(lambda _: None, failed).addBoth(self._release)

    def _holdUntil(self, done: Deferred[Any]) -> Deferred[Any]:
        """
        Hold every envelope toward RPEngine that comes after this point
        until C{done} fires (a save being taken or loaded, the store being
        pruned), so that a turn sent right after such an op is planned
        from what it left.  Returns C{done}.
        """
        if done.called:
            return done
        if self._held is None:
            self._held = deque()
        self._holding += 1

        def released(result: object) -> object:
            self._holding -= 1
            if not self._holding:
                self._release()
            return result

        return done.addBoth(released)

    def _release(self, _: object = None) -> None:
        """Pass the held envelopes on, in order, until one needs a read."""
        held = self._held
        while held:
            if self._holding:
                return
            envelope, context, d = held[0]
            key = self._toRead(envelope)
            if key is not None:
                self._read(key)
                return
            held.popleft()
            try:
                result = self._toEngine(envelope, context)
            except Exception:
                d.errback()
            else:
                d.callback(result)
        if not self._holding:
            self._held = None

    def _toEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        if kind in OPENING:
            if envelope.meta.get("origin") == NAME:
                return envelope
            self.summaries.stop(context)
            self.reflections.stop(context)
            return self._request(envelope)
        if kind in CANCELLING:
            # The game withdrew the turn (a cancel, a barge-in, a stall, a
            # client gone, a scene's line cut short): it is remembered now,
            # as far as the client got it, before any request sent after
            # this cancel is planned; what RPEngine still sends of it is
            # not the client's any more.
            turn = self._turns.pop(envelope.requestId or "", None)
            if turn is not None:
                self._ended(turn, kind, envelope.meta.get(meta.PLAYED))
                self.summaries.kick()
            return envelope
        if kind == HEARD:
            self._heard(envelope)
            return None
        if kind == TURN_PLAYED:
            self._playedAfterEnd(envelope)
            return None
        if kind == ATTITUDE:
            self._attitudeEnvelope(envelope)
            return None
        message = clientMessage(envelope, CLIENT_TYPES)
        if message is not None:
            client = str(envelope.meta.get("client") or "api")
            integrationId = envelope.meta.get("integrationId")
            ops.handle(self, client, message, context, integrationId)
            return None
        return envelope

    def _request(self, envelope: Envelope) -> Envelope:
        fields, meta = envelope.fields, envelope.meta
        recalled = self._recalled.pop(envelope.requestId or "", None)
        transfer = fields.get("card")
        card = transferDocument(transfer) if isinstance(transfer, Mapping) else None
        if card is None or transfer.get("mode") != "snapshot":  # type: ignore[union-attr]
            # A game that sends its own references or patches keeps them.
            return envelope
        key = self.keyOf(fields, meta)
        unreadable = self._unreadable.pop(key, None)
        if unreadable is not None:
            # Asked again at its next turn; this one goes as the game sent it.
            self._tell(str(meta.get("client") or "api"), key, "unavailable", "turn", unreadable)
            return envelope
        conversation = self.conversation(key)
        mood = conversation.state.get(MOOD_STATE)
        if mood is not None and MOOD_META not in meta:
            # What the character's last line left it feeling (L{MOOD_META}).
            meta[MOOD_META] = mood
        data = card.get("data")
        data = data if isinstance(data, Mapping) else {}
        character = trimmed(data.get("name"))
        player = trimmed((fields.get("player") or {}).get("displayName")) or "Player"
        if conversation.greetingPending:
            self._greet(conversation, data, character, player)
        capture = envelope.type == "voice.capture.start"
        text = trimmed((fields.get("event") or {}).get("text"))
        said: tuple[str, str, str, str] | None
        if capture:
            said = None  # its words come in voice.capture.transcript, if asked for
        elif not text:
            said = (PLAYER, player, "", UNHEARD)  # a recording: RPEngine tells no words
        elif fields.get("interactionMode") == "auto_event":
            said = (EVENT, "", text, COMPLETE)
        else:
            said = (PLAYER, player, text, COMPLETE)
        opening = meta.get(SAID)
        heardLine = None
        if isinstance(opening, Mapping) and not capture:
            said = lineOf(opening) or said
            lineId = opening.get("lineId")
            heardLine = lineId if isinstance(lineId, str) and lineId else None
        spoken = capture or _hasAudio(fields)
        requestId = envelope.requestId or ""
        self._turns[requestId] = Turn(
            key,
            said,
            character,
            client=str(meta.get("client") or "api"),
            requestId=requestId,
            heardLine=heardLine,
        )
        # A new turn: the last one's reply can no longer be cut.
        self._completed.pop(key, None)
        self._playedBy(key, str(meta.get("client") or "api"))
        self._personas[key] = _persona(data, character, player)
        self._personas.move_to_end(key)
        while len(self._personas) > self.settings.cached:
            self._personas.popitem(last=False)
        made = self._plan(fields, card, conversation, spoken, meta, recalled)
        self.timeline.note(requestId, memory={**made.report, "conversation": key.asDict()})
        if made.card is None:
            return envelope
        try:
            # A copy of the game's card (which the middleware owns) with
            # the planned text: no private copy to parse, no walk of it.
            owned = self.cards.withData(card, made.changes)
        except ValueError:
            self.log.failure(
                "the planned card for {requestId} cannot be hashed", requestId=requestId
            )
            return envelope
        fields["card"] = snapshotTransfer(owned.document, owned.hash)
        return envelope

    def _plan(
        self,
        fields: Mapping[str, Any],
        card: Mapping[str, Any],
        conversation: Conversation,
        spoken: bool,
        meta: Mapping[str, Any],
        recalled: Recalled | None = None,
    ) -> Plan:
        book = self._book(card)
        lore = [*book.entries, *self._knowledge(conversation.key, meta)]
        made = plan(
            fields,
            card,
            conversation,
            lore,
            self.limits,
            spoken,
            self.settings.scan_depth or book.scanDepth,
            book.tokenBudget,
            book.recursive,
            self._attitudeLine(conversation, card, fields),
            recalled=recalled,
        )
        levels = made.report.get("attitude")
        if isinstance(levels, dict) and levels.get("included"):
            # For the console: the levels the model was told (not the stance's words).
            attitude = Attitude.fromState(conversation.state)
            levels["levels"] = {a: levelOf(v) for a, v in attitude.values.items()}
        if made.card is not None:
            self.counts["planned"] += 1
            self.counts["tokens"] += int(made.report.get("estimatedTokens", 0))
        if made.dropped:
            self.summaries.dueFor(conversation.key)
        return made

    def _knowledge(self, key: Key, meta: Mapping[str, Any]) -> list[LoreEntry]:
        client = str(meta.get("client") or "api")
        where = self.where.get(client, Where())
        location = meta.get(LOCATION) or where.location
        scene = meta.get(SCENE) or where.scene
        scopes = {"world", f"character:{key.characterId}"}
        if location:
            scopes.add(f"location:{location}")
        if scene:
            scopes.add(f"scene:{scene}")
        known = self._known.get(key.integrationId)
        if known is None:
            made = (
                entryFrom(raw, scope) for _, scope, raw in self.store.knowledge(key.integrationId)
            )
            known = self._known[key.integrationId] = [e for e in made if e is not None]
        return [entry for entry in known if entry.source in scopes]

    def _book(self, card: Mapping[str, Any]) -> Book:
        """
        The card's lorebook, read once for a card the middleware owns (it
        never changes), each time for any other.
        """
        if not isinstance(card, OwnedDocument):
            return bookOf(card, self._readEntry)
        cached = self._books.get(id(card))
        if cached is not None and cached[0] is card:
            self._books.move_to_end(id(card))
            return cached[1]
        book = bookOf(card, self._readEntry)
        self._books[id(card)] = (card, book)
        while len(self._books) > BOOKS_CACHED:
            self._books.popitem(last=False)
        return book

    def _greet(
        self, conversation: Conversation, data: Mapping[str, Any], character: str, player: str
    ) -> None:
        conversation.greetingPending = False
        first = trimmed(data.get("first_mes"))
        if first and not conversation.entries:
            line = renderMacros(first, character, player)
            self.storeFor(conversation.key).append(
                conversation, (CHARACTER, character, line, GREETING)
            )

    def clientSessionEnded(self, client: str, context: IChainContext) -> None:
        """
        A client session is over: its own conversations (those it named no
        conversation id for), its choice and its place go with it.
        """
        self.chosen.pop(client, None)
        self.where.pop(client, None)
        dropped = self.sessions.dropConversations(SESSION_PREFIX + client)
        self.sessionIndex.forget(dropped)
        for key in dropped:
            self.summaries.forget(key)
            self.reflections.forget(key)
            self._clientOf.pop(key, None)

    # Toward the game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        requestId = envelope.requestId
        if isSummaryRequest(requestId):
            self.summaries.envelope(envelope)
            return None
        if isReflectionRequest(requestId):
            self.reflections.envelope(envelope)
            return None
        turn = self._turns.get(requestId or "")
        if turn is None:
            return envelope
        kind = envelope.type
        if kind == "reply.text.delta":
            turn.parts.append(textOfDelta(envelope.fields))
        elif kind == "reply.text.completed":
            text = envelope.get("text")
            if isinstance(text, str):
                turn.completed = text
            self._keepMood(turn, envelope.meta.get(MOOD_META))
        elif kind == "reply.audio.chunk":
            if turn.speech is None:
                turn.speech = Speech()
            turn.speech.chunk(envelope.fields)
        elif kind == "reply.audio.start":
            if turn.speech is None:
                turn.speech = Speech()
            turn.speech.started(envelope.fields)
        elif kind == "voice.capture.transcript":
            words = trimmed(envelope.get("text"))
            who = turn.player[1] if turn.player else ""
            turn.player = (PLAYER, who, words, COMPLETE if words else UNHEARD)
        elif kind in TERMINAL:
            del self._turns[requestId or ""]
            self._ended(turn, kind)
            self.summaries.kick()
        return envelope

    # Sessions (the metrics: L{MemoryMetrics}).

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self.reflections.warm()
        self.summaries.kick()

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self.summaries.sessionEnded()
        self.reflections.sessionEnded()


def _eventText(fields: Mapping[str, Any]) -> str:
    event = fields.get("event")
    text = event.get("text") if isinstance(event, Mapping) else None
    return text if isinstance(text, str) else ""


#: What a reflection is told of who its character is, in characters.
MAX_PERSONA = 600


def _persona(data: Mapping[str, Any], character: str, player: str) -> str:
    """The card's description and personality, macros rendered, clipped."""
    text = " ".join(trimmed(data.get(f)) for f in ("description", "personality"))
    text = " ".join(renderMacros(text, character, player).split())
    return text if len(text) <= MAX_PERSONA else text[: MAX_PERSONA - 1] + "…"


def _hasAudio(fields: Mapping[str, Any]) -> bool:
    event = fields.get("event")
    return isinstance(event, Mapping) and isinstance(event.get("audio"), Mapping)


__all__ = ["NAME", "Memory"]
