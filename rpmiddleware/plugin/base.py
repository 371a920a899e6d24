"""
What a plugin author imports: a base class for plugins and a ready-made factory.

A third-party plugin is a module like this one, anywhere on the path::

    from rpmiddleware.plugin import ChainPlugin, PluginFactory

    class Shout(ChainPlugin):
        name = "shout"

        def envelopeToGame(self, envelope, context):
            if envelope.type == "reply.text.delta":
                envelope["delta"] = envelope.get("delta", "").upper()
            return envelope

    shout = PluginFactory(Shout, "Makes characters shout.")

and a drop-in C{twisted/plugins/shout_plugin.py} that imports C{shout}.
The name is written once, on the class: the factory takes it from there, and
configuration refers to the plugin by it (or by the factory's dotted path,
C{"shoutpkg.shout"}).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from rpmiddleware.plugin.interfaces import (
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IPluginFactory,
    IPluginServices,
)
from rpmiddleware.protocol.envelope import Envelope

Builder = Callable[[Mapping[str, Any], IPluginServices], IEnvelopePlugin]


@implementer(IEnvelopePlugin)
class ChainPlugin:
    """
    A base for plugins: passes everything on and ignores sessions, so a
    subclass overrides only what its one job needs.  It provides
    L{IEnvelopePlugin}, and so does every subclass, declared or not.

    @cvar name: what configuration calls the plugin; the one place it is
        written (L{PluginFactory} takes it from the class).
    @cvar failClosed: C{True} for a plugin whose failure must stop the
        envelope (moderation): when an envelope method raises or its
        Deferred fails, the chain passes the envelope no further and ends
        the request it belongs to with a C{request.error} naming the plugin
        (L{rpmiddleware.core.chain}).  C{False}, the default, passes it on
        unchanged.
    """

    name = "unnamed"
    failClosed = False

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        """For a plugin with client messages (L{IClientExtension}): a client session is over."""

    def clientSessionResumed(self, clientId: str, context: IChainContext) -> None:
        """For a plugin with client messages (L{IClientExtension}): a session was taken back."""


class PluginNameError(ValueError):
    """
    A factory and the plugin it built disagree on the plugin's name, or a
    plugin class given to L{PluginFactory} has no name of its own.
    """


def _classNamed(plugin: type) -> str:
    name = getattr(plugin, "name", None)
    if not isinstance(name, str) or not name or name == ChainPlugin.name:
        raise PluginNameError(
            f"plugin class {plugin.__module__}.{plugin.__qualname__} has no name of its own: "
            'give it one (name = "my-plugin"), which configuration calls it by'
        )
    return name


def _noSettings(plugin: type) -> Builder:
    def build(settings: Mapping[str, Any], services: IPluginServices) -> IEnvelopePlugin:
        rejectUnknownSettings(_classNamed(plugin), settings, set())
        built: IEnvelopePlugin = plugin()
        return built

    return build


@implementer(IPlugin, IPluginFactory)
class PluginFactory:
    """
    An L{IPluginFactory} from a plugin class, a description and a build
    function.

    The name comes from the class's C{name}, written there once::

        moodTagger = PluginFactory(MoodTagger, "Tags each reply.", build)

    Without C{build}, the plugin is C{MoodTagger()}, and any setting in its
    C{[plugins.NAME]} table is refused.  A name may be given instead of the
    class (for a factory that chooses its class as it builds); then the
    plugin built must carry that name, or L{buildPlugin} raises
    L{PluginNameError} naming both.

    It also provides Twisted's L{IPlugin}, which is what makes
    L{twisted.plugin.getPlugins} notice an object in a drop-in module.
    """

    def __init__(self, plugin: type | str, description: str, build: Builder | None = None) -> None:
        if isinstance(plugin, str):
            if build is None:
                raise TypeError(
                    f"PluginFactory({plugin!r}, ...) needs a build function; or give it the "
                    "plugin class, whose name it takes"
                )
            self.name = plugin
        else:
            self.name = _classNamed(plugin)
            build = build if build is not None else _noSettings(plugin)
        self.description = description
        self._build: Builder = build

    def buildPlugin(
        self, settings: Mapping[str, Any], services: IPluginServices
    ) -> IEnvelopePlugin:
        plugin = self._build(settings, services)
        name = getattr(plugin, "name", None)
        if name != self.name:
            raise PluginNameError(
                f"factory {self.name!r} built {plugin!r}, named {name!r}: a plugin's name is "
                f"written once, on its class; give PluginFactory the class "
                f"(PluginFactory({type(plugin).__name__}, ...)) so that they cannot differ"
            )
        return plugin

    def __repr__(self) -> str:
        return f"<PluginFactory {self.name}>"


def rejectUnknownSettings(name: str, settings: Mapping[str, Any], known: set[str]) -> None:
    """
    Raise ValueError naming the first setting a plugin does not understand.
    """
    for key in settings:
        if key not in known:
            raise ValueError(
                f"unknown setting {key!r} for plugin {name} (known: {', '.join(sorted(known))})"
            )
