"""
scene: one conversation of the player and several characters.

RPEngine plays one character per request and keeps no conversation.  This
plugin lets a game open a scene (its cast, who hears whom, its context), gives
each player's line to the character it addresses, lets others react within a
bound, tags every line with its speaker for the client, and tells each
character's memory what it heard.  See C{docs/scenes.md}.

The package: this module is the factory; L{plugin} the chain plugin,
L{director} who speaks next, L{model} the scene and its parsing, L{api} the
Python API (L{IScenes}).
"""

from __future__ import annotations

from rpmiddleware.builtin.scene.api import IScenes
from rpmiddleware.builtin.scene.model import SceneError
from rpmiddleware.builtin.scene.plugin import NAME, ScenePlugin
from rpmiddleware.plugin import IPluginServices, PluginFactory, PluginSettings

__all__ = ["IScenes", "SceneError", "ScenePlugin", "SceneSettings", "buildScene", "scene"]


class SceneSettings(PluginSettings):
    """
    The C{[plugins.scene]} table: the plugin has no settings, so any key is refused.
    """


def buildScene(settings: SceneSettings, services: IPluginServices) -> ScenePlugin:
    return ScenePlugin(services.cards, services.timeline, services.config.game.integration_id)


scene = PluginFactory(
    NAME,
    "Scenes with several characters: who answers, reactions, speakers.",
    buildScene,
    settings=SceneSettings,
)
