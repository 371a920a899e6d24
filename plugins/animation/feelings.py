"""
The feelings plugin: what a character feels while it speaks, sentence by
sentence, told to the game before the sentence is heard.

A game chooses where feelings come from (C{configure {"feelings": "text" |
"model" | "off"}}, or a turn's C{options}; the request's meta
L{rpmiddleware.plugin.meta.FEELINGS}; the C{[plugins.feelings]} table's
C{default} when it says nothing):

  - C{"text"}: each sentence of the reply is read with a lexicon
    (L{feelings_lexicon}) the moment its text is complete, as the text
    streams; RPEngine only starts speaking a sentence once the text after
    it has begun, so its feeling always goes out before its audio, and
    nothing waits for it.
  - C{"model"}: the model is told to end its reply with a feeling tag, which
    RPEngine's response processing takes out of the text and the speech
    (L{feelings_model}); RPEngine then buffers the reply, so every
    sentence's feeling goes out with the complete text, before any audio.

Each sentence's feeling goes toward the game as an C{x-feelings.feeling}
envelope with the request's id (L{rpmiddleware.plugin.FEELING_ENVELOPE}),
which the client's turn writes as the C{feeling} client message C{{turnId,
speaker, feeling, intensity?, start, end, sentence, source, mood}} (and drops
once the turn is cancelled); C{start}/C{end} are Unicode code points of the
line's display text (the C{llm} text).  The
character's mood (L{feelings_mood}) follows the sentences, carries into a
sentence with no cue of its own, and is kept per conversation: the plugin
writes it on the reply's C{reply.text.completed} (meta
L{rpmiddleware.plugin.meta.MOOD}) for the memory plugin to keep, starts a
request from the mood its meta brings back, and else from the last one it
saw itself for that character and conversation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from twisted.logger import Logger

from rpmiddleware.builtin.animation.feelings_lexicon import read
from rpmiddleware.builtin.animation.feelings_model import (
    RULE,
    RULE_ID,
    feelingOf,
    instruction,
)
from rpmiddleware.builtin.animation.feelings_mood import Mood
from rpmiddleware.plugin import (
    FEELING_ENVELOPE,
    FEELING_FIELDS,
    FEELINGS,
    MAX_RESPONSE_RULES,
    OPENING,
    TERMINAL,
    ChainPlugin,
    Envelope,
    IChainContext,
    IPluginServices,
    PluginFactory,
    PluginSettings,
    addSceneText,
    estimateTokens,
    eventTokens,
    exampleMessages,
    limitOf,
    mandatoryBlocks,
    promptRequest,
    sentenceBlocks,
    textOfDelta,
    trimmed,
)
from rpmiddleware.plugin import meta as metakeys

NAME = "feelings"
#: The client message.
CLIENT_TYPE = "feeling"
#: The field of reply.text.completed (and so of the client's llm) that lists
#: the line's feelings, all of them.
FIELD = "x-feelings"
_LISTED = ("feeling", "intensity", "start", "end", "sentence", "source")
NEUTRAL = FEELINGS[0]
#: Moods kept here for conversations the memory plugin does not keep.
MAX_MOODS = 4096
#: How much a feeling the model wrote weighs in the mood (a sentence read
#: from the text weighs its intensity).
MODEL_WEIGHT = 0.7


class FeelingsSettings(PluginSettings):
    """
    The C{[plugins.feelings]} table.
    """

    #: Where feelings come from for a client that does not say.
    default: Literal["text", "model", "off"] = "off"


@dataclass
class _Line:
    """A request whose reply's feelings are told."""

    requestId: str
    source: str
    speaker: dict[str, Any]
    moodKey: tuple[str, str, str]
    mood: Mood
    #: The display text so far (the deltas), and how many of its sentences
    #: were told.
    text: str = ""
    told: int = 0
    #: The model source's rule was added, and the client had rules of its own.
    ruled: bool = False
    ownRules: bool = False
    sentences: list[dict[str, Any]] = field(default_factory=list)


class Feelings(ChainPlugin):
    name = NAME
    log = Logger()

    def __init__(self, default: str = "off") -> None:
        self.default = default
        self._lines: dict[str, _Line] = {}
        #: (integrationId, characterId, conversation) to the mood last left.
        self._moods: OrderedDict[tuple[str, str, str], Mood] = OrderedDict()

    # Toward RPEngine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope:
        if envelope.type in OPENING and envelope.requestId is not None:
            self._open(envelope)
        return envelope

    def _open(self, envelope: Envelope) -> None:
        fields, meta = envelope.fields, envelope.meta
        source = meta.get(metakeys.FEELINGS) or self.default
        if source not in ("text", "model") or envelope.requestId in self._lines:
            return
        client = str(meta.get(metakeys.CLIENT) or "api")
        characterId = str(fields.get("characterId"))
        key = (
            str(fields.get("integrationId")),
            characterId,
            str(meta.get("conversation") or client),
        )
        kept = meta.get(metakeys.MOOD)
        mood = Mood.fromJson(kept) if kept is not None else self._moodOf(key)
        line = _Line(
            str(envelope.requestId),
            source,
            self._speakerOf(fields, meta, characterId),
            key,
            mood,
        )
        if source == "model":
            self._teach(envelope, line)
        self._lines[envelope.requestId or ""] = line

    def _moodOf(self, key: tuple[str, str, str]) -> Mood:
        mood = self._moods.get(key)
        return Mood(dict(mood.weights)) if mood is not None else Mood()

    @staticmethod
    def _speakerOf(
        fields: Mapping[str, Any], meta: Mapping[str, Any], characterId: str
    ) -> dict[str, Any]:
        speaker = meta.get(metakeys.SPEAKER)
        if isinstance(speaker, Mapping) and speaker.get("characterId"):
            return dict(speaker)
        card = fields.get("card")
        snapshot = card.get("snapshot") if isinstance(card, Mapping) else None
        data = snapshot.get("data") if isinstance(snapshot, Mapping) else None
        name = trimmed(data.get("name")) if isinstance(data, Mapping) else ""
        return {"characterId": characterId, "name": name or characterId}

    def _teach(self, envelope: Envelope, line: _Line) -> None:
        """
        Ask the model for its feeling, and RPEngine to take it out; when the
        request has no room for another rule, read the text instead.
        """
        output = envelope.get("output")
        processing = output.get("responseProcessing") if isinstance(output, Mapping) else None
        rules = list(processing.get("rules") or []) if isinstance(processing, Mapping) else []
        if not isinstance(output, Mapping) or len(rules) >= MAX_RESPONSE_RULES:
            self.log.warn(
                "feelings read from the text for {requestId}: its request has no room for "
                "the feeling rule ({count} response rules, RPEngine takes {limit})",
                requestId=envelope.requestId,
                count=len(rules),
                limit=MAX_RESPONSE_RULES,
            )
            line.source = "text"
            return
        if any(isinstance(r, Mapping) and r.get("id") == RULE_ID for r in rules):
            line.ruled = True  # Sent again: taught already.
            line.ownRules = len(rules) > 1
            return
        taught = instruction(line.speaker["name"], line.mood.feeling)
        if not _fits(envelope.fields, taught):
            # The memory plugin, nearer the game, filled the prompt to
            # RPEngine's limit: one more line would push its newest history
            # out (or the request over the limit).
            self.log.info(
                "feelings read from the text for {requestId}: its prompt has no room for "
                "the feeling instruction",
                requestId=envelope.requestId,
            )
            line.source = "text"
            return
        if not addSceneText(envelope, taught):
            line.source = "text"
            return
        envelope["output"] = {
            **output,
            "responseProcessing": {"mode": "buffered", "rules": [*rules, RULE]},
        }
        line.ruled = True
        line.ownRules = bool(rules)

    # Toward the game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Envelope:
        requestId = envelope.requestId
        line = self._lines.get(requestId or "") if requestId is not None else None
        if line is None:
            return envelope
        kind = envelope.type
        if kind == "reply.text.delta":
            line.text += textOfDelta(envelope.fields)
            if line.source == "text":
                self._tell(line, sentenceBlocks(line.text, False), context)
        elif kind == "reply.text.completed":
            envelope = self._completed(envelope, line, context)
        elif kind in TERMINAL:
            del self._lines[requestId or ""]
        return envelope

    def _completed(self, envelope: Envelope, line: _Line, context: IChainContext) -> Envelope:
        text = envelope.get("text")
        if isinstance(text, str) and (line.source == "model" or not line.text.strip()):
            line.text = text
        written = None
        if line.ruled:
            extracted = envelope.get("extractedContent")
            written = feelingOf(extracted)
            envelope = envelope.replace()
            if line.ownRules and isinstance(extracted, Mapping):
                envelope["extractedContent"] = {k: v for k, v in extracted.items() if k != RULE_ID}
            else:
                envelope.fields.pop("extractedContent", None)
            if written is None:
                self.log.info(
                    "{character} wrote no feeling tag in {requestId}: its sentences carry its mood",
                    character=line.speaker.get("characterId"),
                    requestId=envelope.requestId,
                )
        self._tell(line, sentenceBlocks(line.text, True), context, written)
        self._keep(line)
        envelope.meta[metakeys.MOOD] = line.mood.toJson()
        # The whole line's feelings, for a Python API caller (its stream
        # keeps this envelope) and on the client's llm message.
        envelope[FIELD] = [{k: m[k] for k in _LISTED if k in m} for m in line.sentences]
        return envelope

    def _tell(
        self,
        line: _Line,
        blocks: list[tuple[str, int]],
        context: IChainContext,
        written: str | None = None,
    ) -> None:
        """
        Tell the client the feeling of each sentence of C{blocks} not told
        yet.  Offsets count from the first non-space character, as the
        C{llm} text (RPEngine trims the completed text) does.
        """
        lead = len(line.text) - len(line.text.lstrip())
        for index in range(line.told, len(blocks)):
            sentence, end = blocks[index]
            start = end - len(sentence)
            body = sentence.strip()
            start += len(sentence) - len(sentence.lstrip())
            end = start + len(body)
            if line.source == "model":
                # One feeling for the line, as strong as the model's words
                # are not measured: no intensity.
                feeling = written if written is not None else line.mood.carry()[0]
                intensity = None
                line.mood.felt(written or NEUTRAL, MODEL_WEIGHT)
            else:
                reading = read(body)
                if reading.feeling == NEUTRAL:
                    feeling, intensity = line.mood.carry()
                else:
                    feeling, intensity = reading.feeling, reading.intensity
                line.mood.felt(reading.feeling, reading.intensity)
            message: dict[str, Any] = {
                "type": CLIENT_TYPE,
                "speaker": line.speaker,
                "feeling": feeling,
                "start": max(0, start - lead),
                "end": max(0, end - lead),
                "sentence": index,
                "source": line.source,
                "mood": {"feeling": line.mood.feeling, "intensity": line.mood.intensity},
            }
            if intensity is not None:
                message["intensity"] = intensity
            line.sentences.append(message)
            # Through the client's turn (which drops it once the turn is
            # cancelled), and to a Python API caller's stream.
            told = Envelope.build(FEELING_ENVELOPE, requestId=line.requestId)
            told.fields.update({k: message[k] for k in FEELING_FIELDS if k in message})
            context.sendToGame(told)
        line.told = max(line.told, len(blocks))

    def _keep(self, line: _Line) -> None:
        self._moods[line.moodKey] = Mood(dict(line.mood.weights))
        self._moods.move_to_end(line.moodKey)
        while len(self._moods) > MAX_MOODS:
            self._moods.popitem(last=False)

    # What others may ask.

    def moodOf(
        self, characterId: str, conversation: str, integrationId: str = "None"
    ) -> dict[str, Any]:
        """
        The mood this plugin last saw the character leave in a conversation
        (C{conversation}: the game's conversation id, or the client session's
        id when it chose none), as kept: C{{feeling, intensity, weights}}.
        """
        return self._moodOf((integrationId, characterId, conversation)).toJson()


#: What a spoken turn's transcript is counted as, unknown when the request
#: leaves (the memory plugin's C{spoken_reserve_tokens} default).
SPOKEN_RESERVE_TOKENS = 300


def _fits(fields: Mapping[str, Any], text: str) -> bool:
    """
    Whether the request's prompt, with C{text} added to its scene context,
    stays within RPEngine's limit by RPEngine's own estimate (its system
    blocks, the event, and the card's example messages, where the memory
    plugin puts the conversation); a request whose card is not given whole
    is taken to fit.
    """
    card = fields.get("card")
    snapshot = card.get("snapshot") if isinstance(card, Mapping) else None
    if not isinstance(snapshot, Mapping) or not isinstance(snapshot.get("data"), Mapping):
        return True
    taught = dict(fields)
    if not addSceneText(taught, text):
        return False
    event = fields.get("event")
    spoken = isinstance(event, Mapping) and event.get("audio") is not None
    transcript = "w" * (4 * SPOKEN_RESERVE_TOKENS) if spoken else None
    request = promptRequest(taught, snapshot, transcript)
    data = request["card"]["data"]
    character = trimmed(data.get("name"))
    player = trimmed(request.get("playerDisplayName")) or "Player"
    examples = exampleMessages(str(data.get("mes_example") or ""), character, player)
    used = sum(b.tokens for b in mandatoryBlocks(request)) + eventTokens(request)
    used += sum(estimateTokens(said) for _, said in examples)
    return used <= limitOf(request)


def build(settings: FeelingsSettings, services: IPluginServices) -> Feelings:
    return Feelings(settings.default)


feelings = PluginFactory(
    NAME,
    "Tells the game what a character feels, sentence by sentence, before it is heard.",
    build,
    settings=FeelingsSettings,
)

__all__ = ["CLIENT_TYPE", "FIELD", "Feelings", "FeelingsSettings", "feelings"]
