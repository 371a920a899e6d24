"""
playbook: a game's dialogue logic in the middleware (C{docs/playbooks.md}).

A playbook has stages.  Each says what RPEngine is told (C{promptScene},
C{promptDirective}, the voice) and when to move on: the player's words, the
character's finished reply, a tool's result, a game event, silence, or a
number of turns; transitions may run tools (game actions) on the way.  The
plugin keeps, per client session, where the conversation is, and queues the
game's live events while a reply plays.

This package is the plugin; its C{__init__} is what the chain's discovery
imports: the factory, which reads C{[plugins.playbook]} and every configured
playbook file at start-up, so that a mistake stops start-up rather than the
first conversation that meets it.  The plugin is built from the modules
beside it, one rule each:

  - L{plugin}: the chain plugin, which routes what it sees;
  - L{sessions}: the sessions, and which playbook each plays;
  - L{prompt}: what each request is told;
  - L{rules}: which transition fires, and taking it;
  - L{pacing}: events waiting, auto_event turns, idle timer;
  - L{outbox}: what goes toward the game, one turn later;
  - L{model}, L{parser}: playbooks once loaded, and loading and checking one;
  - L{state}: one session's state;
  - L{tools}: tools, their discovery, and running a transition's calls.

(Modules of this package, none of which imports this one.)
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from rpmiddleware.builtin.playbook.api import IPlaybooks
from rpmiddleware.builtin.playbook.model import Playbook, PlaybookError
from rpmiddleware.builtin.playbook.parser import loadPlaybookFile
from rpmiddleware.builtin.playbook.plugin import NAME, PlaybookPlugin
from rpmiddleware.builtin.playbook.tools import discoverTools
from rpmiddleware.plugin import IPluginServices, PluginFactory, PluginSettings

__all__ = ["NAME", "IPlaybooks", "PlaybookPlugin", "PlaybookSettings", "build", "playbook"]

#: A number of seconds, more than 0.
Seconds = Annotated[float, msgspec.Meta(ge=0.001)]
#: A bound: a whole number, at least 1.
Bound = Annotated[int, msgspec.Meta(ge=1)]


class PlaybookSettings(PluginSettings):
    """
    The C{[plugins.playbook]} table.
    """

    #: characterId = "playbook file" (relative to the configuration file).
    characters: dict[str, Annotated[str, msgspec.Meta(min_length=1)]] = msgspec.field(
        default_factory=dict
    )
    tool_timeout: Seconds = 10.0
    client_playbooks: bool = True
    max_pending_events: Bound = 8
    max_context_events: Bound = 16
    interrupt_priority: float | None = None
    max_sessions: Bound = 1024
    turn_start_timeout: Seconds = 30.0


def build(
    settings: PlaybookSettings, services: IPluginServices, providers: tuple[Any, ...] = ()
) -> PlaybookPlugin:
    """
    The plugin from C{[plugins.playbook]}, read by the factory: every
    configured playbook file is read and checked now, so a mistake stops
    start-up naming the file, the stage and the field.
    """
    tools = discoverTools(providers)
    loaded: dict[str, Playbook] = {}
    playbooks: dict[str, Playbook] = {}
    for characterId, name in settings.characters.items():
        path = services.config.relativePath(name)
        key = str(path.resolve())
        if key not in loaded:
            try:
                loaded[key] = loadPlaybookFile(path, tools)
            except PlaybookError as e:
                raise ValueError(f"plugins.{NAME}.characters.{characterId}: {e}")
        playbooks[characterId] = loaded[key]
    return PlaybookPlugin(
        playbooks,
        tools,
        toolTimeout=settings.tool_timeout,
        clientPlaybooks=settings.client_playbooks,
        maxPendingEvents=settings.max_pending_events,
        maxContextEvents=settings.max_context_events,
        interruptPriority=settings.interrupt_priority,
        maxSessions=settings.max_sessions,
        turnStartTimeout=settings.turn_start_timeout,
        timeline=services.timeline,
    )


playbook = PluginFactory(
    NAME,
    "Playbooks: stages, transitions and tools that drive what RPEngine is told; live game events.",
    build,
    settings=PlaybookSettings,
)
