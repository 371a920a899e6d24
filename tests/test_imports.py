"""
The imports between rpmiddleware's own modules: no circle, and no private
name imported from another module.

Every module of the C{rpmiddleware} package is read (not imported), the
built-in plugins (C{rpmiddleware.builtin}, the checkout's C{plugins/} folder)
included, and every C{import x} and C{from x import y} in it becomes an edge
to the module of ours it names: at module level or inside a function, and
relative imports resolved.  C{from package import name} is an edge to the
submodule C{package.name} when there is one, else to the package.

Imports under C{if TYPE_CHECKING:} count like any other: a circle that only
the type checker follows is still two modules that each need the other (the
client endpoint's old circle was such), and the way out is the same, a
narrow protocol lower down.  What does not count is the package an import
implies (C{import a.b} runs C{a}'s C{__init__} first): every module would
otherwise "import" its package, whose C{__init__} imports some of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from twisted.trial.unittest import SynchronousTestCase

from tests.support.imports import Module, importGraph, ourModules, readImports


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """
    One circle (a -> b -> ... -> a) in each strongly connected part of the
    graph that has one (Tarjan, then a walk inside the part).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    onStack: set[str] = set()
    parts: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        onStack.add(node)
        for target in sorted(graph.get(node, {})):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in onStack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                onStack.discard(member)
                part.append(member)
                if member == node:
                    break
            if len(part) > 1:
                parts.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            connect(node)

    found = []
    for part in parts:
        members = set(part)
        start = part[0]
        path = [start]
        seen = {start}
        # Walk inside the part until a step returns to a module on the path.
        while True:
            here = path[-1]
            nexts = sorted(t for t in graph[here] if t in members)
            back = [t for t in nexts if t in seen]
            if back:
                found.append(path[path.index(back[0]) :] + [back[0]])
                break
            path.append(nexts[0])
            seen.add(nexts[0])
    return found


#: rpmiddleware's packages from the bottom up, as docs/architecture.md draws
#: them: a module imports modules of its own package, or of a package in a
#: lower layer, never one beside or above it.  C{runtime} (which holds the
#: finder the package installs in a checkout) and the package's face
#: (C{rpmiddleware}, its version) are the bottom; C{tap}, twistd's entry
#: point, is the top.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rpmiddleware.runtime",),
    ("rpmiddleware",),
    ("rpmiddleware.cards", "rpmiddleware.audio", "rpmiddleware.web"),
    ("rpmiddleware.protocol",),
    ("rpmiddleware.config",),
    ("rpmiddleware.plugin",),
    ("rpmiddleware.builtin",),
    ("rpmiddleware.engine",),
    ("rpmiddleware.core",),
    ("rpmiddleware.webrtc",),
    ("rpmiddleware.client",),
    ("rpmiddleware.console",),
    ("rpmiddleware.daemon",),
    ("rpmiddleware.testing",),
    ("rpmiddleware.tap",),
)

#: The outer layers: the client endpoint, WebRTC, the console and /metrics.
#: They see the core through L{rpmiddleware.core.view.CoreView} alone.
OUTER_LAYERS = ("rpmiddleware.client", "rpmiddleware.webrtc", "rpmiddleware.console")
#: The core's modules the outer layers may import: the view itself, and the
#: reply stream that the view's Python API hands back.
VIEW = ("rpmiddleware.core.view", "rpmiddleware.core.replystream")
#: The concrete core (and what assembles it, and the plugins): what the view
#: stands in front of.
CONCRETE_CORE = (
    "rpmiddleware.core",
    "rpmiddleware.engine",
    "rpmiddleware.builtin",
    "rpmiddleware.daemon",
    "rpmiddleware.testing",
    "rpmiddleware.tap",
)


def packageOf(name: str) -> str:
    """
    The package of L{LAYERS} that module C{name} belongs to.
    """
    found = [p for layer in LAYERS for p in layer if within(name, (p,)) and p != "rpmiddleware"]
    return max(found, key=len) if found else "rpmiddleware"


def layerOf(name: str) -> int:
    package = packageOf(name)
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def upwardImports(modules: Iterable[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """
    Every import of a module in another package of the same layer or a
    higher one, described with its line.
    """
    found = []
    for module in sorted(modules):
        for target, line in sorted(graph.get(module, {}).items()):
            if packageOf(target) == packageOf(module):
                continue
            if layerOf(target) >= layerOf(module):
                found.append(
                    f"{module} (line {line}) imports {target}: "
                    f"{packageOf(module)} may not import {packageOf(target)}"
                )
    return found


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def reachesCore(graph: dict[str, dict[str, int]], start: str) -> list[str] | None:
    """
    A chain of imports from C{start} to a module of the concrete core, if
    there is one (breadth first: the shortest).
    """
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph.get(module, {})):
                if target in paths:
                    continue
                paths[target] = paths[module] + [target]
                if within(target, CONCRETE_CORE) and target not in VIEW:
                    return paths[target]
                following.append(target)
        frontier = following
    return None


def isPrivate(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class ImportGraphTests(SynchronousTestCase):
    def test_everyModuleRead(self) -> None:
        """
        The walk finds the package's modules, the built-in plugins' among them.
        """
        modules = ourModules()
        for name in (
            "rpmiddleware",
            "rpmiddleware.client.connection",
            "rpmiddleware.builtin",
            "rpmiddleware.builtin.playbook.plugin",
            "rpmiddleware.builtin.card_cache.plugin",
        ):
            self.assertIn(name, modules)
        self.assertFalse([m for m in modules if ".builtin.builtin" in m])

    def test_resolution(self) -> None:
        """
        Relative imports, submodules named in C{from}, function-level and
        TYPE_CHECKING imports all become edges.
        """
        package = Module("a.b", "", True)
        module = Module("a.b.c", "", False)
        modules = {m: Module(m, "", False) for m in ("a.b.d", "a.e", "a.b.f")}
        for target, source, expected in (
            (module, "from . import d", "a.b.d"),
            (module, "from ..e import x", "a.e"),
            (package, "from . import d", "a.b.d"),
            (
                module,
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a.b.f import x",
                "a.b.f",
            ),
            (module, "def g():\n    import a.e", "a.e"),
        ):
            target.imports = []
            tree = ast.parse(source)
            path = self.mktemp()
            with open(path, "w") as f:
                f.write(ast.unparse(tree))
            target.path = path
            readImports(target)
            resolved = set()
            for base, name, _ in target.imports:
                if name is not None and f"{base}.{name}" in modules:
                    resolved.add(f"{base}.{name}")
                elif base in modules:
                    resolved.add(base)
            self.assertIn(expected, resolved, source)

    def test_cycleFinder(self) -> None:
        graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}}
        self.assertEqual(cycles(graph), [["a", "b", "c", "a"]])
        self.assertEqual(cycles({"a": {"b": 1}, "b": {}}), [])

    def test_noCircles(self) -> None:
        """
        No module of ours imports, directly or through others, a module
        that imports it.
        """
        _, graph = importGraph()
        found = cycles(graph)
        described = [
            " -> ".join(
                f"{a} (line {graph[a][b]})" if b else a
                for a, b in zip(circle, circle[1:] + [""], strict=True)
            )
            for circle in found
        ]
        self.assertEqual(described, [], "import circles:\n" + "\n".join(described))

    def test_noPrivateImports(self) -> None:
        """
        No module imports another module's private name (C{_x}), ours or a
        library's.
        """
        modules, _ = importGraph()
        found = [
            f"{m.name} line {line}: from {target} import {name}"
            for m in modules.values()
            for target, name, line in m.imports
            if (name is not None and isPrivate(name))
            or any(isPrivate(part) for part in target.split("."))
        ]
        self.assertEqual(found, [], "\n".join(found))

    def test_outerLayersSeeOnlyTheView(self) -> None:
        """
        The client endpoint, the console and C{/metrics} import no module of
        the concrete core (the middleware, chain, engine link and sessions,
        router, timeline, engine queue, the plugins), directly or through
        other modules: they are given a L{rpmiddleware.core.view.CoreView},
        which imports none of them either.
        """
        modules, graph = importGraph()
        outer = sorted(m for m in modules if within(m, OUTER_LAYERS))
        self.assertIn("rpmiddleware.client.status", outer)
        self.assertIn("rpmiddleware.console.metrics", outer)
        self.assertIn("rpmiddleware.webrtc.voice", outer)
        found = [
            " -> ".join(path)
            for start in [*outer, *VIEW]
            if (path := reachesCore(graph, start)) is not None
        ]
        self.assertEqual(found, [], "\n".join(found))

    def test_reachesCore(self) -> None:
        graph = {
            "rpmiddleware.client.a": {"rpmiddleware.core.replystream": 1},
            "rpmiddleware.core.replystream": {"rpmiddleware.engine.link": 3},
            "rpmiddleware.engine.link": {},
        }
        self.assertEqual(
            reachesCore(graph, "rpmiddleware.client.a"),
            ["rpmiddleware.client.a", "rpmiddleware.core.replystream", "rpmiddleware.engine.link"],
        )
        self.assertIsNone(
            reachesCore(
                {"rpmiddleware.client.a": {"rpmiddleware.core.replystream": 1}},
                "rpmiddleware.client.a",
            )
        )

    def test_layersByPackage(self) -> None:
        """
        Every import points down: no module imports one of a package beside
        or above its own in L{LAYERS}, and every module is in one of them.
        """
        modules, graph = importGraph()
        self.assertEqual(
            [m for m in modules if packageOf(m) == "rpmiddleware" and m != "rpmiddleware"],
            [],
            "modules in no package of LAYERS",
        )
        found = upwardImports(modules, graph)
        self.assertEqual(found, [], "\n".join(found))

    def test_upwardImportsFound(self) -> None:
        """
        The layer check names an import that points up or sideways, and lets
        one inside a package or down pass.
        """
        graph = {
            "rpmiddleware.protocol.messages": {"rpmiddleware.cards.validation": 3},
            "rpmiddleware.core.chain": {"rpmiddleware.core.router": 4},
            "rpmiddleware.cards.diff": {"rpmiddleware.audio.format": 5},
            "rpmiddleware.engine.link": {"rpmiddleware.core.middleware": 7},
        }
        self.assertEqual(
            upwardImports(graph, graph),
            [
                "rpmiddleware.cards.diff (line 5) imports rpmiddleware.audio.format: "
                "rpmiddleware.cards may not import rpmiddleware.audio",
                "rpmiddleware.engine.link (line 7) imports rpmiddleware.core.middleware: "
                "rpmiddleware.engine may not import rpmiddleware.core",
            ],
        )
