"""
Finding plugin factories and building the configured chain from them.

Built-in plugins come from C{rpmiddleware.builtin} (the repository's
C{plugins/} folder, see L{rpmiddleware.sourcelayout}); third-party ones
announce themselves with a drop-in module in a C{twisted/plugins/} folder and
are found with L{twisted.plugin.getPlugins}.  Configuration alone decides
which run and in what order.  A drop-in that fails to import is reported by
name and the others still load.
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
from zope.interface import implementer
from zope.interface.verify import verifyObject

from rpmiddleware.config import ConfigError, Settings
from rpmiddleware.interfaces import IEnvelopePlugin, IPluginFactory, IPluginServices

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


def chainOrder(settings: Settings, defaults: Mapping[str, int]) -> list[str]:
    """
    Plugin names in chain order: the defaults overlaid with the configuration,
    lowest priority first (nearest the game), ties broken by name.
    """
    priorities: dict[str, int | None] = dict(defaults)
    priorities.update(settings.chain)
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
    for name in settings.plugins:
        if name not in registry.factories:
            raise ConfigError(
                f"{settings.source}: unknown plugin {name!r} in [plugins.{name}]"
                f"{_knownPlugins(registry)}"
            )
    for name in chainOrder(settings, defaults):
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
    return f" (known: {known}){hint}"


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
    priorities.update(settings.chain)
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
