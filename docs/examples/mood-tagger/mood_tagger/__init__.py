# mood_tagger/__init__.py
"""
mood-tagger: notes the player's line on its way to RPEngine and tags the
character's reply with the line's mood, which reaches the client's C{llm}
message as C{x-mood}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpmiddleware.plugin import (
    ChainPlugin,
    Envelope,
    IChainContext,
    IPluginServices,
    PluginFactory,
    rejectUnknownSettings,
)

#: The envelopes that end a request: nothing more comes for it.
ENDINGS = ("reply.completed", "reply.cancelled", "request.error")


class MoodTagger(ChainPlugin):
    name = "mood-tagger"  # the one place the name is written

    def __init__(self, loud: str, quiet: str, services: IPluginServices) -> None:
        self.loud = loud
        self.quiet = quiet
        self.timeline = services.timeline
        #: requestId -> the player's line, until the request ends.
        self.lines: dict[str, str] = {}

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope:
        event = envelope.get("event")
        if envelope.type == "reply.request" and isinstance(event, dict):
            text = event.get("text")
            if isinstance(text, str) and envelope.requestId is not None:
                self.lines[envelope.requestId] = text
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Envelope:
        requestId = envelope.requestId or ""
        if envelope.type == "reply.text.completed" and requestId in self.lines:
            mood = self.moodOf(self.lines[requestId])
            envelope["x-mood"] = mood  # on the client's llm message
            self.timeline.note(requestId, mood=mood)  # on the status's turns[]
        elif envelope.type in ENDINGS:
            self.lines.pop(requestId, None)
        return envelope

    def moodOf(self, line: str) -> str:
        loud = line.rstrip().endswith("!") or (line.isupper() and len(line) > 1)
        return self.loud if loud else self.quiet


def build(settings: Mapping[str, Any], services: IPluginServices) -> MoodTagger:
    rejectUnknownSettings(MoodTagger.name, settings, {"loud", "quiet"})
    loud = settings.get("loud", "excited")
    quiet = settings.get("quiet", "calm")
    if not isinstance(loud, str) or not isinstance(quiet, str):
        raise ValueError("loud and quiet must be strings")
    return MoodTagger(loud, quiet, services)


moodTagger = PluginFactory(MoodTagger, "Tags each reply with the player's mood.", build)
