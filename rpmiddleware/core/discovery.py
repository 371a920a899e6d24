"""
Finding plugin factories and building the configured chain from them.

Built-in plugins come from C{rpmiddleware.builtin} (the repository's
C{plugins/} folder, see L{rpmiddleware.runtime.sourcelayout}); third-party ones
announce themselves with a drop-in module in a C{twisted/plugins/} folder and
are found with L{twisted.plugin.getPlugins}.  Configuration alone decides
which run and in what order.  A drop-in that fails to import is reported by
name and the others still load.

C{[chain]} may also name a plugin by the dotted path of its factory (or of
its plugin class), as Scrapy's settings do: C{"mypkg.plugin.factory" = 60}.
Such a plugin needs no drop-in; its C{[plugins.NAME]} table is under the
name the factory gives it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from twisted.logger import ILogObserver, Logger, globalLogPublisher
from twisted.plugin import getPlugins
from twisted.python.reflect import namedAny
from zope.interface import implementer
from zope.interface.verify import verifyObject

from rpmiddleware.config.settings import ConfigError, Settings
from rpmiddleware.plugin.base import PluginFactory
from rpmiddleware.plugin.interfaces import IEnvelopePlugin, IPluginFactory, IPluginServices

log = Logger()


@dataclass
class DropinProblem:
    """
    A drop-in module that could not be loaded.
    """

    module: str
    error: str

    def __str__(self) -> str:
        return f"{self.module}: {self.error}"


@dataclass
class PluginRegistry:
    factories: dict[str, IPluginFactory] = field(default_factory=dict)
    #: Where each factory came from: "built-in" or a drop-in module name.
    origins: dict[str, str] = field(default_factory=dict)
    problems: list[DropinProblem] = field(default_factory=list)
    #: The dotted paths of C{[chain]} already resolved (L{resolveChain}),
    #: to the name of the plugin each gave: start-up resolves the chain
    #: more than once (to build it, to log it), and a path is imported, and
    #: a plugin class made a factory, only the first time.
    paths: dict[str, str] = field(default_factory=dict)

    def add(self, factory: IPluginFactory, origin: str) -> None:
        name = factory.name
        if name in self.factories:
            self.problems.append(
                DropinProblem(
                    origin,
                    f"plugin name {name!r} is already taken by {self.origins[name]}; ignored",
                )
            )
            return
        self.factories[name] = factory
        self.origins[name] = origin


def _moduleOf(failure: Any, folders: Collection[str]) -> str:
    """
    The drop-in module a failed import came from, from its traceback: the
    innermost frame in one of the drop-in package's C{folders}.  Only those
    folders count, never a folder's name: the built-ins' own folder in a
    checkout is called C{plugins/} too, and is no drop-in.
    """
    value = failure.value
    filename = getattr(value, "filename", None)
    if isinstance(value, SyntaxError) and filename:
        return os.path.basename(str(filename))
    for frame in reversed(failure.frames):
        path = frame[1]
        if os.path.dirname(os.path.abspath(path)) in folders:
            return os.path.basename(path)
    return "an unknown drop-in"


def _dropinModule(factory: object, packageName: str) -> str:
    """
    The loaded drop-in module that holds C{factory}, for messages.
    """
    prefix = packageName + "."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix) and module is not None:
            if any(value is factory for value in vars(module).values()):
                return name
    return "a drop-in"


def discoverPlugins(package: ModuleType | None = None) -> PluginRegistry:
    """
    Every plugin factory: the built-ins, then the drop-ins found in
    C{package} (C{twisted.plugins} unless given).
    """
    import rpmiddleware.builtin as builtins

    registry = PluginRegistry()
    for factory in builtins.FACTORIES:
        registry.add(factory, "built-in")

    failures: list[Any] = []

    @implementer(ILogObserver)
    def collect(event: dict[str, Any]) -> None:
        # getCache reports a drop-in that fails to import with the legacy
        # log.err(), whose events carry "failure" rather than "log_failure".
        failure = event.get("log_failure") or event.get("failure")
        if failure is not None:
            failures.append(failure)

    if package is None:
        import twisted.plugins

        package = twisted.plugins
    globalLogPublisher.addObserver(collect)
    try:
        found = list(getPlugins(IPluginFactory, package))
    finally:
        globalLogPublisher.removeObserver(collect)
    folders = {os.path.abspath(folder) for folder in getattr(package, "__path__", ())}
    for factory in found:
        if any(factory is builtin for builtin in builtins.FACTORIES):
            continue
        registry.add(factory, _dropinModule(factory, package.__name__))
    for failure in failures:
        problem = DropinProblem(
            _moduleOf(failure, folders), f"{failure.type.__name__}: {failure.value}"
        )
        registry.problems.append(problem)
        log.error(
            "plugin drop-in {module} failed to load: {error}",
            module=problem.module,
            error=problem.error,
        )
    return registry


def importFactory(path: str, source: str = "<memory>") -> IPluginFactory:
    """
    The plugin factory at dotted C{path} (C{"mypkg.plugin.factory"}): an
    L{IPluginFactory} provider, or a plugin class (one whose instances
    provide L{IEnvelopePlugin}, with a C{name}), which is made a
    L{PluginFactory} that builds it with no settings.

    @raise ConfigError: naming C{path} and C{source}, when it does not
        import or is neither.
    """
    try:
        found = namedAny(path)
    except Exception as e:
        raise ConfigError(
            f"{source}: [chain] names {path!r}, which does not import "
            f"({type(e).__name__}: {e}); a dotted path names a plugin factory, "
            f'as "mypkg.myplugin.factory"'
        ) from e
    if IPluginFactory.providedBy(found):
        factory: IPluginFactory = found
        return factory
    if isinstance(found, type) and IEnvelopePlugin.implementedBy(found):
        try:
            return PluginFactory(found, (found.__doc__ or path).strip().split("\n")[0])
        except ValueError as e:
            raise ConfigError(f"{source}: [chain] {path!r}: {e}") from e
    raise ConfigError(
        f"{source}: [chain] names {path!r}, which is {found!r}, not a plugin factory (an "
        "IPluginFactory provider, such as rpmiddleware.plugin.PluginFactory(...)) or a "
        "plugin class"
    )


def resolveChain(settings: Settings, registry: PluginRegistry) -> dict[str, int | None]:
    """
    C{settings.chain} by plugin name: each dotted path is imported
    (L{importFactory}), its factory added to C{registry} with the path as its
    origin, and replaced by the factory's name.  A key that is a known name
    stays as it is; so does an unknown one without a dot, for
    L{buildChain} to report.  A path is resolved once per registry
    (C{registry.paths}): start-up calls this to build the chain and again to
    log it, and a plugin class named by path would otherwise be made a
    second factory, refused as taking its own name.

    @raise ConfigError: for a path that does not import, or whose plugin's
        name is already another plugin's.
    """
    resolved: dict[str, int | None] = {}
    for key, priority in settings.chain.items():
        name = registry.paths.get(key, key)
        if name not in registry.factories and "." in key:
            factory = importFactory(key, settings.source)
            name = factory.name
            known = registry.factories.get(name)
            if known is None:
                registry.add(factory, key)
            elif known is not factory:
                raise ConfigError(
                    f"{settings.source}: [chain] {key!r} is plugin {name!r}, a name already "
                    f"taken by {registry.origins[name]}"
                )
            if key in settings.plugins:
                raise ConfigError(
                    f"{settings.source}: the settings of {key!r} go under its plugin's name, "
                    f"[plugins.{name}], not [plugins.{key!r}]"
                )
            registry.paths[key] = name
        resolved[name] = priority
    return resolved


def chainOrder(
    settings: Settings,
    defaults: Mapping[str, int],
    chain: Mapping[str, int | None] | None = None,
) -> list[str]:
    """
    Plugin names in chain order: the defaults overlaid with the configuration
    (C{chain}, the configuration's by name, L{resolveChain}; C{settings.chain}
    unless given), lowest priority first (nearest the game), ties broken by
    name.
    """
    priorities: dict[str, int | None] = dict(defaults)
    priorities.update(settings.chain if chain is None else chain)
    enabled = [(p, name) for name, p in priorities.items() if p is not None]
    return [name for _, name in sorted(enabled)]


def buildChain(
    settings: Settings,
    registry: PluginRegistry,
    services: IPluginServices,
    defaults: Mapping[str, int] | None = None,
) -> list[IEnvelopePlugin]:
    """
    Build the configured plugins, in order.

    @param defaults: the chain the configuration starts from; the built-in
        C{rpmiddleware.builtin.DEFAULT_CHAIN} unless given.

    @raise ConfigError: for an unknown plugin name or settings a plugin refuses.
    """
    import rpmiddleware.builtin as builtins

    built = []
    if defaults is None:
        defaults = builtins.DEFAULT_CHAIN
    chain = resolveChain(settings, registry)
    for name in settings.plugins:
        if name not in registry.factories:
            raise ConfigError(
                f"{settings.source}: unknown plugin {name!r} in [plugins.{name}]"
                f"{_knownPlugins(registry)}"
            )
    for name in chainOrder(settings, defaults, chain):
        factory = registry.factories.get(name)
        if factory is None:
            raise ConfigError(
                f"{settings.source}: unknown plugin {name!r} in [chain]{_knownPlugins(registry)}"
            )
        try:
            plugin = factory.buildPlugin(settings.pluginSettings(name), services)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{settings.source}: plugin {name!r}: {e}")
        if not IEnvelopePlugin.providedBy(plugin):
            raise ConfigError(f"plugin {name!r} built {plugin!r}, which is not an IEnvelopePlugin")
        verifyObject(IEnvelopePlugin, plugin)
        if plugin.name != name:
            raise ConfigError(
                f"{settings.source}: plugin {name!r} built {plugin!r}, named {plugin.name!r}: "
                "a plugin's name is written once, on its class, and its factory must give "
                "the same (rpmiddleware.plugin.PluginFactory takes it from the class)"
            )
        built.append(plugin)
    return built


def _knownPlugins(registry: PluginRegistry) -> str:
    """
    The end of an unknown plugin's message: the known names, and the
    drop-ins that failed to load (one of them may be the one meant).
    """
    known = ", ".join(sorted(registry.factories)) or "none"
    hint = ""
    if registry.problems:
        hint = "; drop-ins that failed to load: " + "; ".join(map(str, registry.problems))
    editable = editableImportHooks()
    if editable:
        hint += (
            f"; packages installed editable through an import hook ({', '.join(editable)}) "
            "have drop-ins twistd cannot see: install a plugin package with "
            "pip install -e . --config-settings editable_mode=compat, or without -e"
        )
    return f" (known: {known}){hint}"


#: How setuptools names the module that a default editable install
#: (C{pip install -e}) imports at start-up to install its import hook:
#: C{__editable___<distribution>_<version>_finder}.
EDITABLE_FINDER = ("__editable___", "_finder")


def editableImportHooks() -> list[str]:
    """
    The distributions installed editable through setuptools' import hook in
    this process (C{mood_tagger_1_0}).  Such an install puts no folder on
    C{sys.path}, so C{twisted/plugins/} of the package is not on
    C{twisted.plugins.__path__}, and twistd never sees its drop-in.
    """
    start, end = EDITABLE_FINDER
    return sorted(
        name[len(start) : -len(end)]
        for name in list(sys.modules)
        if name.startswith(start) and name.endswith(end) and len(name) > len(start) + len(end)
    )


def describeChain(
    plugins: Sequence[IEnvelopePlugin],
    settings: Settings,
    registry: PluginRegistry,
    defaults: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """
    The chain in order, the game's end first: each plugin's C{name}, its
    C{priority} and C{origin} (C{"built-in"}, or the drop-in module that
    announced it).
    """
    import rpmiddleware.builtin as builtins

    priorities: dict[str, int | None] = dict(
        builtins.DEFAULT_CHAIN if defaults is None else defaults
    )
    priorities.update(resolveChain(settings, registry))
    return [
        {
            "name": plugin.name,
            "priority": priorities.get(plugin.name),
            "origin": registry.origins.get(plugin.name, "given in code"),
        }
        for plugin in plugins
    ]


def logChain(
    plugins: Sequence[IEnvelopePlugin],
    settings: Settings,
    registry: PluginRegistry,
    defaults: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """
    Log the chain as built (L{describeChain}), as one event with its
    C{chain} and C{source} (the configuration file); return the chain.
    """
    chain = describeChain(plugins, settings, registry, defaults)
    text = ", ".join(f"{p['name']} ({p['priority']}, {p['origin']})" for p in chain)
    log.info(
        "plugin chain from {source}, the game's end first: {text}",
        source=settings.source,
        chain=chain,
        text=text or "no plugins",
    )
    return chain
