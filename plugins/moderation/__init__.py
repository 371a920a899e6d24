"""
The moderation plugin: checks what the player says before RPEngine hears it,
and what the character says before the game shows it.

Local rules (words and regular expressions) run on every piece of text,
including the streamed C{reply.text.delta}s: a word split across two deltas
is still caught because the plugin holds back only the shortest tail that
could still become a match, and emits the rest at once.  An optional remote
service (an OpenAI-compatible C{/v1/moderations} endpoint) classifies whole
texts: the player's message and transcript, and the completed reply.  It does
not see deltas, because a round trip per delta would stall every reply by the
service's latency, and a classifier judges a sentence, not a word piece.

The package: this module is the factory; L{plugin} the chain plugin,
L{rules} the local rules, L{remote} the remote service, L{settings} the
C{[plugins.moderation]} table: modules of this package, none of which
imports this one.
"""

from __future__ import annotations

from rpmiddleware.builtin.moderation.plugin import Moderation
from rpmiddleware.builtin.moderation.rules import CONTEXT_CHARS, Hit, Rules, masked, maskedWhole
from rpmiddleware.builtin.moderation.settings import (
    ACTIONS,
    FAIL_POLICIES,
    NAME,
    ModerationSettings,
)
from rpmiddleware.plugin import IPluginServices, PluginFactory

__all__ = [
    "ACTIONS",
    "CONTEXT_CHARS",
    "FAIL_POLICIES",
    "NAME",
    "Hit",
    "Moderation",
    "ModerationSettings",
    "Rules",
    "masked",
    "maskedWhole",
    "moderation",
]


def _build(settings: ModerationSettings, services: IPluginServices) -> Moderation:
    return Moderation(settings, services.reactor)


moderation = PluginFactory(
    NAME,
    "Masks, blocks or cancels player and character text by word lists, patterns or a service.",
    _build,
    settings=ModerationSettings,
)
