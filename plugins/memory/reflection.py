"""
Reflection in the player's pauses: a request of the memory plugin's own
that asks RPEngine what a character now makes of recent events, the
details worth keeping and its attitude to the player, and reads the answer
back as a small JSON structure checked against L{SCHEMA}.

Like a summary (L{rpmiddleware.builtin.memory.summarizer}) it is a
text-only C{reply.request} for a character of the plugin's own
(L{REFLECTOR_ID}), never shown to a client, sent only in a pause after
summaries had their chance, and cancelled the moment a player's turn needs
RPEngine.  Its C{output.responseProcessing} (buffered: nobody waits for it)
captures the last JSON object of the answer, so prose around it does no
harm.  An answer that is not such an object, or that L{SCHEMA} refuses, is
dropped; the conversation is asked again after a back-off that doubles up
to L{MAX_BACKOFF}, and its turns go on as ever meanwhile.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.builtin.memory.attitude import AXES, MAX_STANCE, Attitude
from rpmiddleware.builtin.memory.conversation import Conversation, Entry, Key
from rpmiddleware.builtin.memory.pauses import (
    PauseRequests,
    Pending,
    namesIn,
    ownCard,
    ownRequest,
    saidLines,
)
from rpmiddleware.builtin.memory.planner import flatten
from rpmiddleware.builtin.memory.settings import MemorySettings
from rpmiddleware.builtin.memory.store import MemoryStore
from rpmiddleware.builtin.memory.writer import Lane
from rpmiddleware.plugin import (
    TERMINAL,
    CardHasher,
    Envelope,
    IChainContext,
)

REFLECTOR_ID = "rpmiddleware-memory-reflector"
REQUEST_PREFIX = "memory-reflection-"
#: The conversation state that says how far a conversation was reflected on.
STATE = "reflection"
#: The response-processing rule that takes the answer's last JSON object.
RULE_ID = "rpmiddleware.reflection"
RULE: dict[str, Any] = {
    "id": RULE_ID,
    "matcher": {"type": "regex", "pattern": r"(\{.*\})", "flags": "s"},
    "captureGroup": 1,
    "occurrence": "last",
    "remove": "none",
    "removeFrom": [],
}
#: Details one reflection may keep, and how long each may be.
MAX_DETAILS = 3
MAX_DETAIL = 200
#: The longest wait before a conversation whose reflections fail is asked again.
MAX_BACKOFF = 3600.0

#: What an answer must be (JSON Schema 2020-12).  C{change} moves each axis
#: by a whole number (the plugin bounds it by C{reflection_step}).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["change"],
    "properties": {
        "details": {
            "type": "array",
            "maxItems": MAX_DETAILS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_DETAIL},
        },
        "change": {
            "type": "object",
            "properties": {a: {"type": "integer", "minimum": -100, "maximum": 100} for a in AXES},
            "additionalProperties": False,
        },
        "stance": {"type": "string", "maxLength": MAX_STANCE},
    },
}

#: The card the reflections are asked of.
REFLECTOR_CARD: dict[str, Any] = ownCard(
    name="Reflector",
    description=(
        "The Reflector reads a conversation from a game character's point of view and "
        "says what that character makes of it: the details worth remembering and how the "
        "character now feels about the player."
    ),
    personality="Exact, brief. Never invents anything.",
    scenario="The Reflector is asked to reflect on recent events.",
    systemPrompt="You answer with one JSON object only: no greeting, no commentary.",
)


def isReflectionRequest(requestId: Any) -> bool:
    return isinstance(requestId, str) and requestId.startswith(REQUEST_PREFIX)


class ReflectionError(ValueError):
    """An answer that is dropped; the message says why."""


@dataclass(frozen=True)
class Reflection:
    """An answer, checked: what the character keeps and how it feels now."""

    details: tuple[str, ...]
    change: dict[str, int]
    stance: str | None


def readReflection(text: str) -> Reflection:
    """
    The answer (the captured JSON object) checked against L{SCHEMA}.

    @raise ReflectionError: saying what was wrong.
    """
    try:
        answer = json.loads(text)
    except ValueError as e:
        raise ReflectionError(f"the answer is not JSON ({e})")
    errors = sorted(validator().iter_errors(answer), key=str)
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "the answer"
        raise ReflectionError(f"{where}: {errors[0].message}")
    details = tuple(" ".join(d.split()) for d in answer.get("details", []) if d.strip())
    stance = answer.get("stance")
    return Reflection(
        details,
        dict(answer["change"]),
        " ".join(stance.split()) if isinstance(stance, str) and stance.strip() else None,
    )


@functools.cache
def validator() -> Any:
    """
    L{SCHEMA}'s validator, made once.  Importing jsonschema takes tens of
    milliseconds, holding the interpreter even on another thread: it is
    done when RPEngine's session starts (L{Reflections.warm}), not at
    start-up (most of a daemon's life needs none of it) nor in the middle
    of a conversation.
    """
    from jsonschema import Draft202012Validator

    return Draft202012Validator(SCHEMA)


def reflectedThrough(conversation: Conversation) -> int:
    """The last entry a reflection of this conversation took in (0: none)."""
    state = conversation.state.get(STATE)
    through = state.get("through") if isinstance(state, Mapping) else None
    return through if isinstance(through, int) and not isinstance(through, bool) else 0


def toReflect(conversation: Conversation, chunk: int) -> list[Entry]:
    """
    The entries not reflected on yet, the newest of them that fit in
    C{chunk} tokens (older ones are the summary's to tell).
    """
    through = reflectedThrough(conversation)
    chosen: list[Entry] = []
    total = 0
    for entry in reversed(conversation.entries):
        if entry.seq <= through or (chosen and total + entry.tokens > chunk):
            break
        chosen.append(entry)
        total += entry.tokens
    chosen.reverse()
    return chosen


def eventText(
    conversation: Conversation,
    entries: Sequence[Entry],
    attitude: Attitude,
    character: str,
    player: str,
    step: int,
    persona: str = "",
) -> str:
    """
    What the reflector is asked: who it speaks for (C{persona}: a few lines
    of the character's card), what was said lately, the summary of before,
    the attitude so far, and the answer's shape.
    """
    character, player = character or "the character", player or "the player"
    lines = saidLines(entries, character, player)
    summary = conversation.summary.strip()
    before = f"Earlier: {flatten(summary)}\n\n" if summary else ""
    who = f"Who you are: {flatten(persona)}\n\n" if persona.strip() else ""
    feeling = attitude.line(character, player).rstrip(".")
    axes = ", ".join(AXES)
    shape = json.dumps(
        {"details": ["..."], "change": dict.fromkeys(AXES, 0), "stance": "..."},
        ensure_ascii=False,
    )
    return (
        f"You are {character}. Think over what happened lately between you and {player}.\n\n"
        f"{who}{before}What was said lately:\n" + "\n".join(lines) + "\n\n"
        f"{feeling}.\n\n"
        f"Answer with one JSON object and nothing else, like {shape}\n"
        f"- details: at most {MAX_DETAILS} short facts about {player} or these events that "
        f"{character} should remember later (names, promises, secrets); [] if none.\n"
        f"- change: how far {character}'s {axes} toward {player} move now, each a whole number "
        f"from -{step} to {step} (0: no change).\n"
        f"- stance: one short sentence, {character}'s view of {player} now."
    )


def reflectionRequest(
    conversation: Conversation,
    entries: Sequence[Entry],
    attitude: Attitude,
    character: str,
    player: str,
    step: int,
    card: dict[str, Any],
    language: str = "en",
    persona: str = "",
) -> Envelope:
    """The request that asks RPEngine for a reflection (C{card}: the reflector's)."""
    return ownRequest(
        REQUEST_PREFIX,
        REFLECTOR_ID,
        conversation,
        eventText(conversation, entries, attitude, character, player, step, persona),
        {
            "modalities": ["text"],
            "language": language,
            "responseProcessing": {"mode": "buffered", "rules": [RULE]},
        },
        card,
    )


@dataclass
class _Reflecting(Pending):
    captured: list[str] = field(default_factory=list)
    completed: bool = False


class Reflections(PauseRequests[_Reflecting]):
    """
    The memory plugin's reflection scheduling: which conversations are due
    (L{MemorySettings.reflection_every_entries} entries since the last),
    the pause it waits for (after the summaries'), each conversation's
    cool-down and back-off, the one request in flight and its answer (the
    rest is L{PauseRequests}').

    C{busy} tells whether a player's turn is in flight; C{summarizing}
    whether summaries are still to be asked or answered (they go first);
    C{storeFor}, C{context} as for L{Summaries}; C{reflected} is given each
    conversation and its checked answer; C{names} the character's and the
    player's names in a conversation.
    """

    def __init__(
        self,
        *,
        reactor: Any,
        settings: MemorySettings,
        cards: CardHasher,
        busy: Callable[[], bool],
        summarizing: Callable[[], bool],
        storeFor: Callable[[Key], MemoryStore],
        context: Callable[[], IChainContext],
        reflected: Callable[[Conversation, Reflection, int], None],
        attitudeOf: Callable[[Conversation], Attitude],
        counts: dict[str, int],
        log: Logger,
        personaOf: Callable[[Key], str] = lambda key: "",
    ) -> None:
        super().__init__(
            reactor=reactor,
            settings=settings,
            cards=cards,
            ownCard=REFLECTOR_CARD,
            busy=busy,
            storeFor=storeFor,
            counts=counts,
            context=context,
            log=log,
        )
        self.summarizing = summarizing
        self.personaOf = personaOf
        self.reflected = reflected
        self.attitudeOf = attitudeOf
        #: When each conversation may be asked again (cool-down, back-off).
        self.notBefore: dict[Key, float] = {}
        #: Where answers are read and checked: a thread of its own, since
        #: the first check imports jsonschema (tens of milliseconds) and none
        #: of it is the reactor's to wait for.
        self.lane = Lane(reactor, "rpmiddleware-memory-reflection")

    def noted(self, conversation: Conversation) -> None:
        """A conversation grew: due once enough is new since its last reflection."""
        if not self.settings.reflections:
            return
        through = reflectedThrough(conversation)
        need, new = max(1, self.settings.reflection_every_entries), 0
        # Newest first, stopping at the last reflection or once enough is
        # new: a turn costs the same after 10,000 entries as after ten.
        for entry in reversed(conversation.entries):
            if entry.seq <= through:
                return
            new += 1
            if new >= need:
                self.due[conversation.key] = None
                return

    def forget(self, key: Key) -> None:
        self.due.pop(key, None)
        self.notBefore.pop(key, None)
        self.failures.pop(key, None)

    def kick(self) -> None:
        """Once no player's turn waits, wait for a pause, then reflect."""
        self.cancelIdle()
        if self.mayAsk():
            now = self.reactor.seconds()
            ready = min(self.notBefore.get(k, now) for k in self.due)
            wait = max(self.settings.reflection_idle_seconds, ready - now)
            self.idle = self.reactor.callLater(wait, self.reflectNext)

    def reflectNext(self) -> None:
        context = self.askingContext()
        if context is None:
            return
        if self.summarizing():
            return  # summaries first: kicked again when they are done
        now = self.reactor.seconds()
        for key in list(self.due):
            if self.notBefore.get(key, now) > now:
                continue
            del self.due[key]
            conversation = self.storeFor(key).cached(key)
            if conversation is None:
                continue  # let go of meanwhile: due again at its next turns
            chosen = toReflect(conversation, self.settings.reflection_chunk_tokens)
            if chosen:
                self.send(context, conversation, chosen)
                return
        self.kick()  # some wait for their cool-down

    def send(self, context: IChainContext, conversation: Conversation, chosen: list[Entry]) -> None:
        character, player = namesIn(chosen)
        envelope = reflectionRequest(
            conversation,
            chosen,
            self.attitudeOf(conversation),
            character or conversation.key.characterId,
            player,
            self.settings.reflection_step,
            self.cardTransfer(),
            persona=self.personaOf(conversation.key),
        )
        reflecting = _Reflecting(envelope.requestId or "", conversation.key, chosen[-1].seq)
        self.notBefore[conversation.key] = (
            self.reactor.seconds() + self.settings.reflection_cooldown_seconds
        )
        self.ask(
            context,
            envelope,
            reflecting,
            self.settings.reflection_timeout,
            self.timedOut,
            "reflect on",
            len(chosen),
        )

    def stop(self, context: IChainContext) -> None:
        """A player's turn needs RPEngine: the reflection in flight is cancelled now."""
        self.cancelIdle()
        reflecting = self.current
        if reflecting is not None and not reflecting.cancelled:
            # Not its fault: asked again at the next pause.
            self.notBefore.pop(reflecting.key, None)
            self.cancel(context, reflecting)

    def timedOut(self, reflecting: _Reflecting) -> None:
        reflecting.timer = None
        if self.current is reflecting:
            self.failed(reflecting.key, "it took longer than reflection_timeout")
            reflecting.cancelled = True
            # Let go of it now, whatever RPEngine still says of it (nothing,
            # when the link is gone): the next pause may ask again.
            self.current = None
            self.context().sendToEngine(
                Envelope.build("request.cancel", requestId=reflecting.requestId)
            )
            self.kick()

    def envelope(self, envelope: Envelope) -> None:
        reflecting = self.current
        if reflecting is None or reflecting.requestId != envelope.requestId:
            return
        kind = envelope.type
        if kind == "reply.text.completed":
            reflecting.completed = True
            extracted = envelope.get("extractedContent")
            found = extracted.get(RULE_ID) if isinstance(extracted, Mapping) else None
            if isinstance(found, list):
                reflecting.captured = [str(c) for c in found]
        elif kind in TERMINAL:
            self.finished(reflecting)
            if not reflecting.cancelled:
                self.ended(reflecting, kind, envelope)
            self.kick()

    def ended(self, reflecting: _Reflecting, kind: str, envelope: Envelope) -> None:
        key = reflecting.key
        if kind != "reply.completed":
            self.failed(key, str(envelope.get("code") or kind))
            return
        if not reflecting.captured:
            self.failed(key, "the answer holds no JSON object")
            return
        captured = reflecting.captured[-1]

        def checked(reflection: Reflection) -> None:
            conversation = self.storeFor(key).cached(key)
            if conversation is None:
                return
            self.failures.pop(key, None)
            self.counts["reflections"] += 1
            self.reflected(conversation, reflection, reflecting.through)

        def refused(failure: Failure) -> None:
            if not failure.check(ReflectionError):
                self.log.failure("reading a reflection of {key}", failure, key=key.asDict())
            self.failed(key, str(failure.value))

        self.lane.run(lambda: readReflection(captured)).addCallbacks(checked, refused)

    def failed(self, key: Key, why: str) -> None:
        """
        The answer is dropped; the conversation is asked again after a
        back-off that doubles with each failure in a row, up to
        L{MAX_BACKOFF}.
        """
        self.counts["reflectionFailures"] += 1
        failures = self.failures[key] = self.failures.get(key, 0) + 1
        wait = min(MAX_BACKOFF, self.settings.reflection_cooldown_seconds * 2 ** (failures - 1))
        self.notBefore[key] = self.reactor.seconds() + wait
        self.due[key] = None
        self.log.warn(
            "RPEngine's reflection on {key} was dropped ({failures} in a row; asked again in "
            "{wait} s): {why}",
            key=key.asDict(),
            failures=failures,
            wait=wait,
            why=why,
        )

    def warm(self) -> None:
        """RPEngine's session started: make the answers' validator now, on the lane."""
        if self.settings.reflections:
            self.lane.run(validator).addErrback(
                lambda f: self.log.failure("making the reflection schema's validator", f)
            )

    def close(self) -> None:
        super().close()
        self.lane.stop()
