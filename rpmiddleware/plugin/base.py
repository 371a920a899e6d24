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

A plugin with settings declares them as a L{PluginSettings} class, which its
factory reads the C{[plugins.NAME]} table into, with the checks and messages
of the daemon's own settings::

    class ShoutSettings(PluginSettings):
        volume: Annotated[int, Meta(ge=1, le=11)] = 3

    shout = PluginFactory(Shout, "Makes characters shout.", settings=ShoutSettings)

(C{Shout(settings)} is then built with the checked settings; give a build
function to build it otherwise.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

import msgspec
from twisted.internet.defer import Deferred
from twisted.plugin import IPlugin
from zope.interface import implementer

from rpmiddleware.config.settings import readSection
from rpmiddleware.plugin.interfaces import (
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IPluginFactory,
    IPluginLifecycle,
    IPluginServices,
)
from rpmiddleware.protocol.envelope import Envelope

#: A build function: the plugin's table (a mapping, or the L{PluginSettings}
#: it was read into when the factory was given a settings class) and the
#: services, to the plugin.
Builder = Callable[[Any, IPluginServices], IEnvelopePlugin]


if TYPE_CHECKING:
    # mypy reads msgspec's frozen=True as a dataclass's, and would then have
    # every subclass repeat it; at run time the subclasses inherit it.
    class _SettingsBase(msgspec.Struct, forbid_unknown_fields=True):
        pass

else:

    class _SettingsBase(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
        pass


class PluginSettings(_SettingsBase):
    """
    A base for a plugin's settings: a C{msgspec.Struct} whose fields are the
    keys of its C{[plugins.NAME]} table, with their types and defaults
    (C{Annotated[int, msgspec.Meta(ge=0)]} for a bound, C{Literal[...]} for
    a choice).  L{PluginFactory}C{(..., settings=MySettings)} reads the table
    with the code that reads the daemon's own sections: a key it does not
    name is refused, a wrong value is refused naming the key
    (C{plugins.NAME.key must be ...}), keys may be written with C{-} for
    C{_}.  A check types cannot say goes in C{__post_init__}, raising
    C{ValueError} whose message starts with the key's name.  Frozen: the
    plugin keeps what it was given.
    """

    @classmethod
    def read(cls, table: Mapping[str, Any], plugin: str) -> Self:
        """
        Plugin C{plugin}'s table read into this class, as its factory reads
        it (L{rpmiddleware.config.settings.readSection}).

        @raise ValueError: naming C{plugins.PLUGIN.KEY}.
        """
        return readSection(cls, table, f"plugins.{plugin}")


@implementer(IEnvelopePlugin, IPluginLifecycle)
class ChainPlugin:
    """
    A base for plugins: passes everything on and ignores sessions, so a
    subclass overrides only what its one job needs.  It provides
    L{IEnvelopePlugin} and L{IPluginLifecycle}, and so does every subclass,
    declared or not.

    @ivar context: the plugin's place in its chain (L{IChainContext}), kept
        by L{attached} when the chain is built, before any envelope: what a
        timer or a Python API call of the plugin sends goes through it.  A
        plugin not yet in a chain has none.

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
    context: IChainContext

    def attached(self, context: IChainContext) -> None:
        """
        The chain was built: keep C{context} as C{self.context}.  A subclass
        that overrides this calls it too.
        """
        self.context = context

    def close(self) -> Deferred[Any] | None:
        """
        The daemon is stopping; nothing to let go of here.
        """
        return None

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        """A client session is over (every plugin that has this hook hears it)."""

    def clientSessionResumed(self, clientId: str, context: IChainContext) -> None:
        """A client took its session back with C{reconnect} (every plugin with this hook)."""


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


def _withSettings(plugin: type) -> Builder:
    def build(settings: PluginSettings, services: IPluginServices) -> IEnvelopePlugin:
        built: IEnvelopePlugin = plugin(settings)
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

    With C{settings}, a L{PluginSettings} class, the table is read into it
    first (L{rpmiddleware.config.settings.readSection}: unknown keys and
    wrong values refused, naming the key) and C{build} is given that typed
    value instead of the mapping; without C{build}, the plugin is
    C{MoodTagger(settings)}.

    It also provides Twisted's L{IPlugin}, which is what makes
    L{twisted.plugin.getPlugins} notice an object in a drop-in module.
    """

    def __init__(
        self,
        plugin: type | str,
        description: str,
        build: Builder | None = None,
        *,
        settings: type[PluginSettings] | None = None,
    ) -> None:
        if settings is not None and not (
            isinstance(settings, type) and issubclass(settings, PluginSettings)
        ):
            raise TypeError(
                f"PluginFactory(..., settings={settings!r}): settings is a class of "
                "rpmiddleware.plugin.PluginSettings"
            )
        if isinstance(plugin, str):
            if build is None:
                raise TypeError(
                    f"PluginFactory({plugin!r}, ...) needs a build function; or give it the "
                    "plugin class, whose name it takes"
                )
            self.name = plugin
        else:
            self.name = _classNamed(plugin)
            if build is None:
                build = _noSettings(plugin) if settings is None else _withSettings(plugin)
        self.description = description
        #: The class the C{[plugins.NAME]} table is read into, or C{None}.
        self.settings = settings
        self._build: Builder = build

    def readSettings(self, settings: Mapping[str, Any]) -> Any:
        """
        The plugin's table as its build function takes it: read into the
        factory's settings class when it has one, else as it is.

        @raise ValueError: naming the key (C{plugins.NAME.key ...}).
        """
        if self.settings is None:
            return settings
        return self.settings.read(settings, self.name)

    def buildPlugin(
        self, settings: Mapping[str, Any], services: IPluginServices
    ) -> IEnvelopePlugin:
        plugin = self._build(self.readSettings(settings), services)
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
    Raise ValueError naming the first setting a plugin does not understand,
    for a build function that reads its table by hand (a L{PluginSettings}
    class given to L{PluginFactory} does this and the rest).
    """
    for key in settings:
        if key not in known:
            raise ValueError(
                f"unknown setting {key!r} for plugin {name} (known: {', '.join(sorted(known))})"
            )
