"""
Plugin discovery: built-ins, drop-ins from a twisted/plugins folder, broken
drop-ins reported by name, and the configured order.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

import twisted.plugins
from rpmiddleware.config.settings import ConfigError, parseSettings
from rpmiddleware.core.discovery import (
    PluginRegistry,
    buildChain,
    chainOrder,
    describeChain,
    discoverPlugins,
    editableImportHooks,
    logChain,
    resolveChain,
)
from rpmiddleware.plugin.base import ChainPlugin, PluginFactory
from rpmiddleware.testing.kit import captureLogEvents
from tests.support.chain import Recorder

GOOD_DROPIN = """
from zope.interface import implementer
from rpmiddleware.plugin.interfaces import IEnvelopePlugin
from rpmiddleware.plugin.base import ChainPlugin, PluginFactory


@implementer(IEnvelopePlugin)
class Shout(ChainPlugin):
    name = "shout"

    def __init__(self, volume):
        self.volume = volume

    def envelopeToGame(self, envelope, context):
        if envelope.type == "reply.text.delta":
            envelope["text"] = envelope.get("text", "").upper() + "!" * self.volume
        return envelope


def build(settings, services):
    volume = settings.get("volume", 1)
    if not isinstance(volume, int):
        raise ValueError("volume must be a whole number")
    return Shout(volume)


shout = PluginFactory("shout", "Makes characters shout.", build)
"""

BROKEN_DROPIN = "import a_module_that_does_not_exist_anywhere\n"


class DropinTests(SynchronousTestCase):
    def setUp(self) -> None:
        """
        A temporary folder laid out as a third party's: <dir>/twisted/plugins/.
        """
        root = Path(self.mktemp())
        self.folder = root / "twisted" / "plugins"
        self.folder.mkdir(parents=True)
        (self.folder / "shout_dropin.py").write_text(GOOD_DROPIN)
        twisted.plugins.__path__.append(str(self.folder))
        self.addCleanup(twisted.plugins.__path__.remove, str(self.folder))
        for name in ("twisted.plugins.shout_dropin", "twisted.plugins.broken_dropin"):
            self.addCleanup(sys.modules.pop, name, None)

    def test_discovered(self) -> None:
        registry = discoverPlugins()
        self.assertIn("shout", registry.factories)
        self.assertEqual(registry.problems, [])
        self.assertEqual(registry.origins["shout"], "twisted.plugins.shout_dropin")

    def test_brokenReportedByName(self) -> None:
        """
        A drop-in that fails to import is reported by its module name and
        does not stop the others.
        """
        (self.folder / "broken_dropin.py").write_text(BROKEN_DROPIN)
        registry = discoverPlugins()
        self.flushLoggedErrors(ImportError)
        self.assertIn("shout", registry.factories)
        self.assertEqual(len(registry.problems), 1)
        self.assertEqual(registry.problems[0].module, "broken_dropin.py")
        self.assertIn("a_module_that_does_not_exist_anywhere", registry.problems[0].error)

    def test_builtChainUsesDropin(self) -> None:
        settings = parseSettings(
            {"chain": {"plugins": {"shout": 10}}, "plugins": {"shout": {"volume": 3}}}
        )
        [plugin] = buildChain(settings, discoverPlugins(), None, {})  # type: ignore[arg-type]
        self.assertEqual(plugin.name, "shout")
        self.assertEqual(plugin.volume, 3)  # type: ignore[attr-defined]

    def test_chainLoggedWithOrigins(self) -> None:
        """
        The chain is logged at start-up as one event: every plugin's name,
        priority and origin (built-in, or the drop-in module), in order.
        """
        from twisted.internet.task import Clock

        from rpmiddleware.core.middleware import Middleware

        events = captureLogEvents(self)
        settings = parseSettings(
            {"chain": {"plugins": {"shout": 150, "logging": 500}}}, "/etc/rpm.toml"
        )
        middleware = Middleware.fromSettings(Clock(), settings)
        [event] = [e for e in events if "chain" in e and e.get("source") == "/etc/rpm.toml"]
        self.assertEqual([p["name"] for p in event["chain"]], middleware.chain.names)
        shout = next(p for p in event["chain"] if p["name"] == "shout")
        self.assertEqual(shout, {"name": "shout", "priority": 150, "origin": shout["origin"]})
        self.assertEqual(shout["origin"], "twisted.plugins.shout_dropin")
        logging = next(p for p in event["chain"] if p["name"] == "logging")
        self.assertEqual((logging["priority"], logging["origin"]), (500, "built-in"))
        self.assertIn("shout (150, twisted.plugins.shout_dropin)", event["text"])

    def test_pluginRefusesSettings(self) -> None:
        settings = parseSettings(
            {"chain": {"plugins": {"shout": 10}}, "plugins": {"shout": {"volume": "loud"}}}
        )
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, discoverPlugins(), None, {})  # type: ignore[arg-type]
        self.assertIn("volume must be a whole number", str(caught.exception))
        self.assertIn("'shout'", str(caught.exception))


class OrderTests(SynchronousTestCase):
    def registry(self, *names: str) -> PluginRegistry:
        registry = PluginRegistry()
        for name in names:
            registry.add(self.factory(name), "test")
        return registry

    def factory(self, name: str) -> PluginFactory:
        def build(settings: Any, services: Any) -> Recorder:
            return Recorder(name, [])

        return PluginFactory(name, name, build)

    def test_priorityOrder(self) -> None:
        settings = parseSettings({"chain": {"plugins": {"b": 200, "a": 100, "c": 150}}})
        self.assertEqual(chainOrder(settings, {}), ["a", "c", "b"])

    def test_defaultsOverlaidAndDisabled(self) -> None:
        settings = parseSettings({"chain": {"plugins": {"x": False, "z": 5}}})
        self.assertEqual(chainOrder(settings, {"x": 10, "y": 20}), ["z", "y"])

    def test_unknownPlugin(self) -> None:
        settings = parseSettings({"chain": {"plugins": {"nope": 1}}})
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, self.registry("a"), None, {})  # type: ignore[arg-type]
        self.assertIn("unknown plugin 'nope'", str(caught.exception))
        self.assertIn("known: a", str(caught.exception))

    def test_unknownPluginSection(self) -> None:
        """
        A [plugins.NAME] section for a plugin nobody provides (a typo) stops
        start-up with the file, the name and the known plugins, as an
        unknown key does; a known plugin's section is fine even when the
        chain leaves it out.
        """
        settings = parseSettings(
            {"chain": {"plugins": {"a": 1}}, "plugins": {"a": {}, "moood-tagger": {"x": 1}}},
            "/etc/rpm.toml",
        )
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, self.registry("a", "b"), None, {})  # type: ignore[arg-type]
        self.assertEqual(
            str(caught.exception),
            "/etc/rpm.toml: unknown plugin 'moood-tagger' in [plugins.moood-tagger] (known: a, b)",
        )
        fine = parseSettings({"chain": {"plugins": {"a": 1}}, "plugins": {"b": {"x": 1}}})
        plugins = buildChain(fine, self.registry("a", "b"), None, {})  # type: ignore[arg-type]
        self.assertEqual([p.name for p in plugins], ["a"])

    def test_describeChain(self) -> None:
        settings = parseSettings({"chain": {"plugins": {"b": 20, "a": 10}}})
        registry = self.registry("a", "b")
        plugins = buildChain(settings, registry, None, {})  # type: ignore[arg-type]
        extra = Recorder("in-code", [])
        self.assertEqual(
            describeChain([*plugins, extra], settings, registry, {}),
            [
                {"name": "a", "priority": 10, "origin": "test"},
                {"name": "b", "priority": 20, "origin": "test"},
                {"name": "in-code", "priority": None, "origin": "given in code"},
            ],
        )
        events = captureLogEvents(self)
        logChain([], settings, registry, {})
        self.assertEqual(events[-1]["text"], "no plugins")
        self.assertEqual(events[-1]["chain"], [])

    def test_duplicateNameRefused(self) -> None:
        registry = self.registry("a")
        registry.add(self.factory("a"), "elsewhere")
        self.assertEqual(len(registry.problems), 1)
        self.assertIn("already taken", registry.problems[0].error)

    def test_defaultChainBuilt(self) -> None:
        """
        With no [chain] at all, the built-in default chain is built, in order.
        """
        from twisted.internet.task import Clock

        import rpmiddleware.builtin as plugins
        from rpmiddleware.core.middleware import Middleware

        middleware = Middleware.fromSettings(Clock(), parseSettings({}))
        expected = sorted(plugins.DEFAULT_CHAIN, key=plugins.DEFAULT_CHAIN.__getitem__)
        self.assertEqual(middleware.chain.names, expected)
        self.assertTrue(expected)

    def test_configOrderBuilt(self) -> None:
        settings = parseSettings({"chain": {"order": ["b", "a"]}})
        plugins = buildChain(settings, self.registry("a", "b"), None, {})  # type: ignore[arg-type]
        self.assertEqual([p.name for p in plugins], ["b", "a"])


class Whisper(ChainPlugin):
    """Makes characters whisper."""

    name = "whisper"


#: Found by the dotted path "tests.test_discovery.quiet".
quiet = PluginFactory(Whisper, "Makes characters whisper.")


class StartUpTests(SynchronousTestCase):
    """
    What twistd does at start-up (tap.makeService: the chain is resolved to
    build it and again to log it), with what [chain] may name.
    """

    def start(self, toml: str) -> list[dict[str, Any]]:
        from twisted.internet.testing import MemoryReactorClock

        from rpmiddleware.tap import Options, makeService

        path = Path(self.mktemp())
        path.write_text(toml)
        options = Options()
        options.parseOptions(["--config", str(path)])
        events = captureLogEvents(self)
        makeService(options, MemoryReactorClock())
        [event] = [e for e in events if "chain" in e and e.get("source") == str(path)]
        chain: list[dict[str, Any]] = event["chain"]
        return chain

    def test_classByPath(self) -> None:
        """
        A plugin class named by dotted path is one plugin, built and logged:
        the second resolution finds the first's factory instead of making
        another, which would take its own name.
        """
        chain = self.start('[chain]\nplugins = { "tests.test_discovery.Whisper" = 45 }\n')
        whisper = {"name": "whisper", "priority": 45, "origin": "tests.test_discovery.Whisper"}
        self.assertIn(whisper, chain)

    def test_factoryByPath(self) -> None:
        chain = self.start('[chain]\nplugins = { "tests.test_discovery.quiet" = 45 }\n')
        self.assertEqual(
            [p for p in chain if p["name"] == "whisper"],
            [{"name": "whisper", "priority": 45, "origin": "tests.test_discovery.quiet"}],
        )

    def test_resolvedOnce(self) -> None:
        """Resolving a chain again gives the same names and registers nothing new."""
        registry = PluginRegistry()
        settings = parseSettings({"chain": {"plugins": {"tests.test_discovery.Whisper": 1}}})
        self.assertEqual(resolveChain(settings, registry), {"whisper": 1})
        factory = registry.factories["whisper"]
        self.assertEqual(resolveChain(settings, registry), {"whisper": 1})
        self.assertIs(registry.factories["whisper"], factory)
        self.assertEqual(registry.paths, {"tests.test_discovery.Whisper": "whisper"})


class EditableHintTests(SynchronousTestCase):
    """
    A plugin package installed with C{pip install -e} (setuptools' import
    hook) has a drop-in twistd cannot see: the unknown plugin's message says
    so when such an install is present.
    """

    FINDER = "__editable___mood_tagger_1_0_finder"

    def unknown(self) -> str:
        settings = parseSettings({"chain": {"plugins": {"mood-tagger": 40}}}, "my.toml")
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, PluginRegistry(), None, {})  # type: ignore[arg-type]
        return str(caught.exception)

    def test_hintWithAnEditableInstall(self) -> None:
        sys.modules[self.FINDER] = ModuleType(self.FINDER)
        self.addCleanup(sys.modules.pop, self.FINDER, None)
        self.assertEqual(editableImportHooks(), ["mood_tagger_1_0"])
        message = self.unknown()
        self.assertIn("unknown plugin 'mood-tagger' in [chain]", message)
        self.assertIn("installed editable through an import hook (mood_tagger_1_0)", message)
        self.assertIn("pip install -e . --config-settings editable_mode=compat", message)

    def test_noHintWithout(self) -> None:
        self.assertNotIn(self.FINDER, sys.modules)
        self.assertEqual(
            self.unknown(), "my.toml: unknown plugin 'mood-tagger' in [chain] (known: none)"
        )
