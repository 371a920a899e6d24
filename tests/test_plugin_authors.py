"""
docs/plugin-authors.md is a newcomer's path, so it is tested as code: every
file of its example package (docs/examples/mood-tagger) is on the page word
for word, every other Python snippet on the page runs (each asserts what it
shows), every Python block imports rpmiddleware only as its one face (and
the kit, in tests), every TOML snippet is a configuration the daemon
accepts, the package's own trial tests pass, its drop-in is found the way twistd finds
it, and its mood reaches a client's C{llm} message end to end (a simulated
RPEngine on a Clock, a client connection with a fake transport).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.reporter import TestResult
from twisted.trial.runner import TestLoader
from twisted.trial.unittest import SynchronousTestCase

import twisted.plugins
from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.client.status import attachHub, clientLabel
from rpmiddleware.config.settings import ConfigError, loadSettings, parseSettings
from rpmiddleware.core.discovery import buildChain, discoverPlugins
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.testing.inmemory import connectInMemory
from rpmiddleware.testing.kit import captureLogEvents, exampleCard, pluginServices
from tests.support.client import clockedEndpoint
from tests.support.connections import OpenConnections

TOP = Path(__file__).resolve().parent.parent
PAGE = TOP / "docs" / "plugin-authors.md"
EXAMPLE = TOP / "docs" / "examples" / "mood-tagger"
DROPIN = "twisted.plugins.mood_tagger_plugin"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    """The page's fenced blocks: (language, text)."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(PAGE.read_text(encoding="utf-8"))]


#: The one face a plugin imports rpmiddleware through.
FACE = "rpmiddleware.plugin"
#: The plugin test kit, which tests (and snippets that run a plugin) import too.
KIT = "rpmiddleware.testing"


def isPluginCode(code: str) -> bool:
    """
    Whether a block is a file of a plugin's package (headed by a comment
    naming its path), other than one of its tests: code that may import
    only the face.
    """
    first = code.split("\n", 1)[0]
    if not first.startswith("# "):
        return False
    path = Path(first[2:].split(":")[0].strip())
    if path.suffix != ".py":
        return False
    return "test" not in path.parts and not path.name.startswith("test_")


def rpmiddlewareImports(code: str) -> list[tuple[int, str]]:
    """Every module of rpmiddleware C{code} imports, with its line."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return [(line, m) for line, m in found if m == "rpmiddleware" or m.startswith("rpmiddleware.")]


def wrongImports(page: str, name: str = PAGE.name) -> list[str]:
    """
    Each import of rpmiddleware in a Python block of C{page} other than the
    face (or, outside a plugin's own files, the kit), naming the block.
    """
    found = []
    for number, match in enumerate(BLOCK.finditer(page), 1):
        if match.group(1) != "python":
            continue
        code = match.group(2)
        fence = page.count("\n", 0, match.start()) + 1
        allowed = {FACE} if isPluginCode(code) else {FACE, KIT}
        for line, module in rpmiddlewareImports(code):
            if module not in allowed:
                found.append(
                    f"{name} line {fence + line}, block {number} "
                    f"({code.split(chr(10), 1)[0]!r}): imports {module}, "
                    f"not only {' or '.join(sorted(allowed))}"
                )
    return found


def exampleFiles() -> dict[str, str]:
    """The example package's files (relative path -> text), caches left out."""
    files = {}
    for path in sorted(EXAMPLE.rglob("*")):
        if path.is_file() and not {"__pycache__", "_trial_temp"} & set(path.parts):
            if path.name != "dropin.cache" and ".egg-info" not in str(path):
                files[path.relative_to(EXAMPLE).as_posix()] = path.read_text(encoding="utf-8")
    return files


def importExample() -> Any:
    """The example's package, importable as installed (from its folder)."""
    if str(EXAMPLE) not in sys.path:
        sys.path.append(str(EXAMPLE))
    return importlib.import_module("mood_tagger")


class PageTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.moodTagger = importExample().moodTagger

    def test_everyFileOnThePage(self) -> None:
        """
        Each file of the example is a block of the page, identical, headed
        by a comment naming it; only the empty test/__init__.py is not.
        """
        files = exampleFiles()
        self.assertEqual(
            sorted(files),
            [
                "mood-tagger.toml",
                "mood_tagger/__init__.py",
                "mood_tagger/test/__init__.py",
                "mood_tagger/test/test_mood_tagger.py",
                "pyproject.toml",
                "twisted/plugins/mood_tagger_plugin.py",
            ],
        )
        shown = {text for _, text in blocks()}
        for name, text in files.items():
            if not text:
                continue
            self.assertEqual(text.splitlines()[0].split(":")[0], f"# {name}")
            self.assertIn(text, shown, f"{name} differs from its block in {PAGE.name}")

    def test_languages(self) -> None:
        """Every block says what it is: the ones this test runs, or shell and plain text."""
        self.assertEqual({lang for lang, _ in blocks()}, {"python", "toml", "sh", "text"})

    def test_snippetsRun(self) -> None:
        """
        Every Python block that is not one of the example's files runs, each
        in a fresh namespace (C{testCase} is this test), and asserts.
        """
        files = set(exampleFiles().values())
        snippets = [t for lang, t in blocks() if lang == "python" and t not in files]
        self.assertGreaterEqual(len(snippets), 5)
        for snippet in snippets:
            namespace: dict[str, Any] = {"testCase": self, "__name__": "snippet"}
            # Compiled as a module of its own: without this module's future
            # import, so annotations are objects (msgspec reads a struct's).
            code = compile(snippet, f"{PAGE.name} snippet", "exec", dont_inherit=True)
            exec(code, namespace)

    def test_importsOnlyTheFace(self) -> None:
        """
        Every Python block imports rpmiddleware only as rpmiddleware.plugin;
        one that is not a plugin's own file (a test, a snippet that runs a
        plugin) imports the kit from rpmiddleware.testing as well.
        """
        page = PAGE.read_text(encoding="utf-8")
        self.assertEqual(wrongImports(page), [])
        python = [code for lang, code in blocks() if lang == "python"]
        self.assertGreaterEqual(sum(isPluginCode(code) for code in python), 2)
        self.assertTrue(all(rpmiddlewareImports(code) for code in python if "Harness" in code))

    def test_wrongImportNamed(self) -> None:
        """
        A block importing anything else of rpmiddleware is named, with its
        line: the kit in a plugin's own file too.
        """
        page = (
            "Text.\n\n```python\n# shout/__init__.py\n"
            "from rpmiddleware.plugin.base import ChainPlugin\n"
            "from rpmiddleware.testing import PluginHarness\n```\n\n"
            "```python\nimport rpmiddleware.config.settings\n"
            "from rpmiddleware.testing import PluginHarness\n"
            "from rpmiddleware.plugin import ChainPlugin\n```\n\n"
            "```python\n# shout/test/test_shout.py\nfrom rpmiddleware.testing.kit import x\n```\n"
        )
        self.assertEqual(
            wrongImports(page, "guide.md"),
            [
                "guide.md line 5, block 1 ('# shout/__init__.py'): imports "
                "rpmiddleware.plugin.base, not only rpmiddleware.plugin",
                "guide.md line 6, block 1 ('# shout/__init__.py'): imports "
                "rpmiddleware.testing, not only rpmiddleware.plugin",
                "guide.md line 10, block 2 ('import rpmiddleware.config.settings'): imports "
                "rpmiddleware.config.settings, not only rpmiddleware.plugin or "
                "rpmiddleware.testing",
                "guide.md line 17, block 3 ('# shout/test/test_shout.py'): imports "
                "rpmiddleware.testing.kit, not only rpmiddleware.plugin or rpmiddleware.testing",
            ],
        )

    def test_tomlAccepted(self) -> None:
        """
        Every TOML block that is not the package's pyproject is a
        configuration the daemon builds a chain from, mood-tagger installed.
        """
        registry = discoverPlugins()
        registry.add(self.moodTagger, DROPIN)
        configurations = [t for lang, t in blocks() if lang == "toml" and "[project]" not in t]
        self.assertEqual(len(configurations), 3)
        for text in configurations:
            settings = parseSettings(tomllib.loads(text), PAGE.name)
            names = [p.name for p in buildChain(settings, registry, pluginServices(None, settings))]
            self.assertEqual(names[0], "mood-tagger")

    def test_typoInTheSectionRefused(self) -> None:
        """The page's example of a typo in [plugins.NAME] is what start-up says."""
        registry = discoverPlugins()
        registry.add(self.moodTagger, DROPIN)
        settings = parseSettings({"plugins": {"mood-taggr": {}}}, "mood-tagger.toml")
        with self.assertRaises(ConfigError) as caught:
            buildChain(settings, registry, pluginServices(None, settings))
        texts = [t.strip() for lang, t in blocks() if lang == "text"]
        self.assertIn(str(caught.exception), texts)


class ExamplePackageTests(SynchronousTestCase):
    def test_itsTestsPass(self) -> None:
        """The package's own trial tests, as C{trial mood_tagger} runs them."""
        importExample()
        module = importlib.import_module("mood_tagger.test.test_mood_tagger")
        suite = TestLoader().loadModule(module)
        result = TestResult()
        suite.run(result)
        self.assertEqual((result.errors, result.failures), ([], []))
        self.assertEqual(result.testsRun, 5)

    def test_dropinFound(self) -> None:
        """
        Its drop-in, in a twisted/plugins folder of its own, is found as
        twistd finds plugins, and named as the chain's origin.
        """
        importExample()
        folder = Path(self.mktemp()) / "twisted" / "plugins"
        folder.mkdir(parents=True)
        shutil.copy(EXAMPLE / "twisted" / "plugins" / "mood_tagger_plugin.py", folder)
        twisted.plugins.__path__.append(str(folder))
        self.addCleanup(twisted.plugins.__path__.remove, str(folder))
        self.addCleanup(sys.modules.pop, DROPIN, None)
        registry = discoverPlugins()
        self.assertEqual(registry.problems, [])
        self.assertEqual(registry.origins["mood-tagger"], DROPIN)


class EndToEndTests(SynchronousTestCase):
    """
    The issue's "done when": mood-tagger, configured by its own file, puts
    its mood on the C{llm} message a client of the endpoint receives.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        registry = discoverPlugins()
        registry.add(importExample().moodTagger, DROPIN)
        self.events = captureLogEvents(self)
        settings = loadSettings(EXAMPLE / "mood-tagger.toml")
        self.middleware = Middleware.fromSettings(self.clock, settings, registry)
        connectInMemory(self.middleware, self.clock)
        endpoint = clockedEndpoint(self.middleware, settings, self.clock)
        self.clients = OpenConnections(endpoint, self.clock)
        self.middleware.router.observe(ExtensionBridge(self.clients))
        attachHub(endpoint, self.clients)

    def say(self, text: str) -> tuple[Any, list[dict[str, Any]]]:
        connection, writer = self.clients.connect()
        self.clients.say(connection, type="character", characterId="mira", card=exampleCard())
        self.clients.say(connection, type="configure", output={"modalities": ["text"]})
        self.clients.say(connection, type="text", text=text)
        for _ in range(200):
            self.clock.advance(0.05)
        return connection, writer.sent

    def test_moodOnLlm(self) -> None:
        connection, sent = self.say("A dragon, in the cellar!")
        [llm] = [m for m in sent if m["type"] == "llm"]
        self.assertEqual(llm["x-mood"], "excited")
        [complete] = [m for m in sent if m["type"] == "reply-complete"]
        self.assertNotIn("x-mood", json.dumps(complete["stats"]))
        self.clients.say(connection, type="status")
        [turn] = [m for m in sent if m["type"] == "status"][-1]["turns"]
        self.assertEqual(turn["mood"], "excited")
        self.assertEqual(turn["client"], clientLabel(connection.session.id))

    def test_chainLogged(self) -> None:
        [event] = [e for e in self.events if "chain" in e and "source" in e]
        self.assertEqual(
            event["chain"][0], {"name": "mood-tagger", "priority": 40, "origin": DROPIN}
        )
        self.assertEqual([p["name"] for p in event["chain"]], self.middleware.chain.names)

    def test_quietLine(self) -> None:
        _, sent = self.say("Any work going?")
        self.assertEqual([m["x-mood"] for m in sent if m["type"] == "llm"], ["calm"])
