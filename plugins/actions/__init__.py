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

from typing import Annotated

import msgspec

from rpmiddleware.builtin.actions.api import IActions
from rpmiddleware.builtin.actions.model import ActionError
from rpmiddleware.builtin.actions.plugin import NAME, ActionsPlugin
from rpmiddleware.plugin import IPluginServices, PluginFactory, PluginSettings

__all__ = ["ActionError", "ActionsPlugin", "ActionsSettings", "IActions", "actions", "buildActions"]

#: Seconds a game has to answer a call with tool-result.
DEFAULT_TIMEOUT = 30.0


class ActionsSettings(PluginSettings):
    """
    The C{[plugins.actions]} table.
    """

    #: Seconds a game has to answer a call with tool-result.
    timeout: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_TIMEOUT


def buildActions(settings: ActionsSettings, services: IPluginServices) -> ActionsPlugin:
    return ActionsPlugin(services.reactor, services.timeline, settings.timeout)


actions = PluginFactory(
    NAME,
    "Game actions a character chooses, checked against their JSON Schema.",
    buildActions,
    settings=ActionsSettings,
)
