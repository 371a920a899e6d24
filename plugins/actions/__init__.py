"""
actions: game actions a character chooses to do, with arguments.

RPEngine calls no functions.  This plugin teaches a character the actions a
game declared (in the prompt), takes the calls out of what the player reads
and hears with RPEngine's response processing, checks them against their JSON
Schema, and sends the good ones to the game as C{tool-call-start}; the game's
C{tool-result} ends them and the outcome is remembered.  See
C{docs/scenes.md}.

The package: this module is the factory; L{plugin} the chain plugin, L{model}
declarations, the prompt lines, the rule and the reading of calls, L{api}
the Python API (L{IActions}).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpmiddleware.builtin.actions.api import IActions
from rpmiddleware.builtin.actions.model import ActionError
from rpmiddleware.builtin.actions.plugin import NAME, ActionsPlugin
from rpmiddleware.plugin import IPluginServices, PluginFactory, rejectUnknownSettings

__all__ = ["ActionError", "ActionsPlugin", "IActions", "actions", "buildActions"]

#: Seconds a game has to answer a call with tool-result.
DEFAULT_TIMEOUT = 30.0


def buildActions(settings: Mapping[str, Any], services: IPluginServices) -> ActionsPlugin:
    rejectUnknownSettings(NAME, settings, {"timeout"})
    timeout = settings.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError("actions timeout must be a positive number of seconds")
    return ActionsPlugin(services.reactor, services.timeline, float(timeout))


actions = PluginFactory(
    NAME, "Game actions a character chooses, checked against their JSON Schema.", buildActions
)
