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

from collections.abc import Mapping
from typing import Any

from rpmiddleware.builtin.playbook.api import IPlaybooks
from rpmiddleware.builtin.playbook.model import Playbook, PlaybookError
from rpmiddleware.builtin.playbook.parser import loadPlaybookFile
from rpmiddleware.builtin.playbook.plugin import NAME, PlaybookPlugin
from rpmiddleware.builtin.playbook.tools import discoverTools
from rpmiddleware.plugin import IPluginServices, PluginFactory, rejectUnknownSettings

__all__ = ["NAME", "IPlaybooks", "PlaybookPlugin", "build", "playbook"]

SETTINGS = {
    "characters",
    "tool_timeout",
    "client_playbooks",
    "max_pending_events",
    "max_context_events",
    "interrupt_priority",
    "max_sessions",
    "turn_start_timeout",
}


def _number(settings: Mapping[str, Any], key: str, default: float, low: float) -> float:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise ValueError(
            f"plugins.{NAME}.{key} must be a number of at least {low:g}, got {value!r}"
        )
    return float(value)


def _whole(settings: Mapping[str, Any], key: str, default: int, low: int) -> int:
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            f"plugins.{NAME}.{key} must be a whole number of at least {low}, got {value!r}"
        )
    return value


def build(
    settings: Mapping[str, Any], services: IPluginServices, providers: tuple[Any, ...] = ()
) -> PlaybookPlugin:
    """
    The plugin from C{[plugins.playbook]}: every configured playbook file is
    read and checked now, so a mistake stops start-up naming the file, the
    stage and the field.
    """
    rejectUnknownSettings(NAME, settings, SETTINGS)
    tools = discoverTools(providers)
    characters = settings.get("characters", {})
    if not isinstance(characters, dict) or not all(
        isinstance(v, str) and v for v in characters.values()
    ):
        raise ValueError(
            f'plugins.{NAME}.characters must be a table of characterId = "playbook file"'
        )
    loaded: dict[str, Playbook] = {}
    playbooks: dict[str, Playbook] = {}
    for characterId, name in characters.items():
        path = services.config.relativePath(name)
        key = str(path.resolve())
        if key not in loaded:
            try:
                loaded[key] = loadPlaybookFile(path, tools)
            except PlaybookError as e:
                raise ValueError(f"plugins.{NAME}.characters.{characterId}: {e}")
        playbooks[characterId] = loaded[key]
    clientPlaybooks = settings.get("client_playbooks", True)
    if not isinstance(clientPlaybooks, bool):
        raise ValueError(f"plugins.{NAME}.client_playbooks must be true or false")
    interrupt = settings.get("interrupt_priority")
    if interrupt is not None:
        interrupt = _number(settings, "interrupt_priority", 0.0, float("-inf"))
    return PlaybookPlugin(
        playbooks,
        tools,
        toolTimeout=_number(settings, "tool_timeout", 10.0, 0.001),
        clientPlaybooks=clientPlaybooks,
        maxPendingEvents=_whole(settings, "max_pending_events", 8, 1),
        maxContextEvents=_whole(settings, "max_context_events", 16, 1),
        interruptPriority=interrupt,
        maxSessions=_whole(settings, "max_sessions", 1024, 1),
        turnStartTimeout=_number(settings, "turn_start_timeout", 30.0, 0.001),
        timeline=services.timeline,
    )


playbook = PluginFactory(
    NAME,
    "Playbooks: stages, transitions and tools that drive what RPEngine is told; live game events.",
    build,
)
