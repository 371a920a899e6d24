"""
What the tests import of one another: a test module (C{tests/test_*.py})
takes its helpers from C{tests.support} and never from another test module,
so that moving or deleting a test never breaks a different one, and trial
never runs a module's tests twice because another imported its classes.

The files are read (not imported), every import counted: at module level or
inside a function.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from twisted.trial.unittest import SynchronousTestCase

TESTS = os.path.dirname(os.path.abspath(__file__))
SUPPORT = os.path.join(TESTS, "support")

#: Programs that tests run in a child process (C{python -m tests.X}); the
#: test beside one may read its constants.
PROGRAMS = frozenset({"tests.console_browser", "tests.idle_daemon"})


def testsImported(path: str) -> Iterator[tuple[str, int]]:
    """
    Each module under C{tests} that the file at C{path} imports, with the
    line that does.
    """
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative imports are resolved the way the files are laid
                # out: tests/X.py or tests/support/X.py.
                inSupport = os.path.dirname(path) == SUPPORT
                parts = ["tests", "support"] if inSupport else ["tests"]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == "tests" or name.startswith("tests."):
                yield name, node.lineno


def isTestModule(name: str) -> bool:
    return name.startswith("tests.test_")


def testFiles() -> list[str]:
    return sorted(
        os.path.join(TESTS, name)
        for name in os.listdir(TESTS)
        if name.startswith("test_") and name.endswith(".py")
    )


class TestImportsTests(SynchronousTestCase):
    def test_testModulesImportOnlySupport(self) -> None:
        """
        No test module imports another test module, and what it imports of
        C{tests} is C{tests.support} (or the program it runs).
        """
        files = testFiles()
        self.assertGreater(len(files), 50)
        wrong = []
        for path in files:
            for name, line in testsImported(path):
                allowed = (
                    name.startswith("tests.support")
                    or name in PROGRAMS
                    or name.rpartition(".")[0] in PROGRAMS
                )
                if isTestModule(name) or not allowed:
                    wrong.append(f"{os.path.relpath(path, TESTS)}:{line} imports {name}")
        self.assertEqual(wrong, [], "take shared helpers from tests.support")

    def test_supportImportsNoTests(self) -> None:
        """
        The support package imports no test module, nor anything of C{tests}
        outside itself.
        """
        files = sorted(
            os.path.join(SUPPORT, name) for name in os.listdir(SUPPORT) if name.endswith(".py")
        )
        self.assertIn(os.path.join(SUPPORT, "__init__.py"), files)
        wrong = [
            f"support/{os.path.basename(path)}:{line} imports {name}"
            for path in files
            for name, line in testsImported(path)
            if name != "tests" and not name.startswith("tests.support")
        ]
        self.assertEqual(wrong, [])

    def test_finds(self) -> None:
        """
        The reader sees every form of import, function-level ones included.
        """
        path = os.path.join(self.mktemp() + ".py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(
                "import tests.test_a\n"
                "from tests.test_b import x\n"
                "from tests import test_c\n"
                "def f():\n"
                "    from tests.support.d import y\n"
            )
        found = {name for name, line in testsImported(path)}
        self.assertTrue(isTestModule("tests.test_a") and "tests.test_a" in found)
        self.assertIn("tests.test_b", found)
        self.assertIn("tests.test_c", found)
        self.assertIn("tests.support.d", found)
