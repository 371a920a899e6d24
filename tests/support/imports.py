"""
Reading the imports of rpmiddleware's own modules without importing them:
every module of the package (the built-in plugins, C{rpmiddleware.builtin},
included) and, in L{importGraph}, the modules of ours each one imports.
Used by C{tests/test_imports.py} (layers, circles, private names) and
C{tests/test_plugin_surface.py} (what the built-ins import).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import rpmiddleware
import rpmiddleware.builtin


@dataclass
class Module:
    name: str
    path: str
    isPackage: bool
    #: (the module imported, the name taken from it or None, line)
    imports: list[tuple[str, str | None, int]] = field(default_factory=list)


def modulesUnder(folder: str, prefix: str, skip: str | None = None) -> Iterator[Module]:
    """
    Every module in the package C{prefix} whose folder is C{folder}
    (subpackages: folders with an C{__init__.py}).
    """
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d
            for d in dirs
            if os.path.isfile(os.path.join(root, d, "__init__.py"))
            and os.path.join(root, d) != skip
        )
        relative = os.path.relpath(root, folder)
        package = prefix if relative == "." else prefix + "." + relative.replace(os.sep, ".")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            if name == "__init__.py":
                yield Module(package, path, True)
            else:
                yield Module(f"{package}.{name[:-3]}", path, False)


def ourModules() -> dict[str, Module]:
    top = os.path.dirname(os.path.abspath(rpmiddleware.__file__ or ""))
    builtin = os.path.dirname(os.path.abspath(rpmiddleware.builtin.__file__ or ""))
    found = {m.name: m for m in modulesUnder(top, "rpmiddleware", skip=builtin)}
    found.update((m.name, m) for m in modulesUnder(builtin, "rpmiddleware.builtin"))
    return found


def readImports(module: Module) -> None:
    with open(module.path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), module.path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module.imports.append((alias.name, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.name.split(".")
                # A package's own name is the base of "from . import x" in it.
                keep = len(parts) - node.level + (1 if module.isPackage else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            for alias in node.names:
                module.imports.append((base, alias.name, node.lineno))


def importGraph() -> tuple[dict[str, Module], dict[str, dict[str, int]]]:
    """
    Our modules, and for each the modules of ours it imports (with the
    first line that does).
    """
    modules = ourModules()
    graph: dict[str, dict[str, int]] = {}
    for module in modules.values():
        readImports(module)
        edges: dict[str, int] = {}
        for target, name, line in module.imports:
            if name is not None and f"{target}.{name}" in modules:
                target = f"{target}.{name}"
            else:
                # import a.b.c: the longest prefix that is a module of ours.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
            if target and target != module.name:
                edges.setdefault(target, line)
        graph[module.name] = edges
    return modules, graph
