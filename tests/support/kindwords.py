"""
kind-words: a plugin written from docs/plugin-authors.md alone, as a
newcomer would (tests/test_plugin_newcomer.py tests it).

It counts the player's kind words in each request's text, tells clients the
count on the reply's messages (C{x-kind-words}, on C{llm} and
C{reply-complete}), and answers a client message of its own,
C{{"type": "kindness", "op": "count" | "reset", "id"?}}, with how many kind
words the client session has said so far (C{kindness-result}, C{total}).
It imports rpmiddleware only as C{rpmiddleware.plugin}.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from zope.interface import implementer

from rpmiddleware.plugin import (
    TERMINAL,
    ChainPlugin,
    Envelope,
    IChainContext,
    IClientExtension,
    IPluginServices,
    PluginFactory,
    answerOp,
    clientMessage,
    rejectUnknownSettings,
    toClient,
)

#: The words counted unless the settings give others.
KIND_WORDS = ("please", "thank", "thanks", "kind", "sorry", "friend")
#: The envelopes toward the game that carry the count to a client: the
#: reply's text (the client's C{llm}) and its end (C{reply-complete}).
TOLD_ON = ("reply.text.completed", "reply.completed")
WORD = re.compile(r"[a-z']+")


@implementer(IClientExtension)
class KindWords(ChainPlugin):
    name = "kind-words"
    clientMessageTypes = ("kindness",)

    def __init__(self, words: Iterable[str], services: IPluginServices) -> None:
        self.words = frozenset(word.lower() for word in words)
        self.timeline = services.timeline
        #: requestId -> the kind words of the player's line, until it ends.
        self.counts: dict[str, int] = {}
        #: client session id -> the kind words it has said.
        self.totals: dict[str, int] = {}

    def count(self, text: str) -> int:
        return sum(1 for word in WORD.findall(text.lower()) if word in self.words)

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope | None:
        message = clientMessage(envelope, self.clientMessageTypes)
        if message is not None:
            client = envelope.meta["client"]
            answer = answerOp(message, "kindness-result", lambda: self.run(client, message))
            context.sendToGame(toClient(client, answer))
            return None
        event = envelope.get("event")
        if envelope.type == "reply.request" and isinstance(event, dict) and envelope.requestId:
            text = event.get("text")
            if isinstance(text, str):
                count = self.count(text)
                self.counts[envelope.requestId] = count
                client = envelope.meta.get("client")
                if isinstance(client, str):
                    self.totals[client] = self.totals.get(client, 0) + count
                self.timeline.note(envelope.requestId, kindWords=count)
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Envelope:
        requestId = envelope.requestId or ""
        if requestId in self.counts and envelope.type in TOLD_ON:
            envelope["x-kind-words"] = self.counts[requestId]
        if envelope.type in TERMINAL:
            self.counts.pop(requestId, None)
        return envelope

    def run(self, client: str, message: Mapping[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        if op == "reset":
            self.totals.pop(client, None)
        elif op != "count":
            raise ValueError("op must be count or reset")
        return {"total": self.totals.get(client, 0)}

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        self.totals.pop(clientId, None)


def build(settings: Mapping[str, Any], services: IPluginServices) -> KindWords:
    rejectUnknownSettings(KindWords.name, settings, {"words"})
    words = settings.get("words", KIND_WORDS)
    if not isinstance(words, list | tuple) or not all(isinstance(w, str) for w in words):
        raise ValueError("words must be a list of strings")
    return KindWords(words, services)


kindWords = PluginFactory(KindWords, "Counts the player's kind words.", build)
