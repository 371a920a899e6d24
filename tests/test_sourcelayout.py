"""
The built-in plugins are C{rpmiddleware.builtin}, never a top-level
C{plugins} package (rpmiddleware/runtime/sourcelayout.py, setup.cfg's package_dir).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

import rpmiddleware
import rpmiddleware.builtin
from rpmiddleware.runtime import sourcelayout
from rpmiddleware.runtime.sourcelayout import NAME, BuiltinFinder, checkoutRoot

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A foreign top-level package called plugins: importing any of it fails loudly.
HOSTILE = "raise RuntimeError('the foreign plugins package was imported')\n"

#: Builds the default chain and says what it built, and whether any
#: top-level plugins module was imported on the way.
BUILD = textwrap.dedent(
    """
    import sys
    from twisted.internet.task import Clock
    from rpmiddleware.config.settings import parseSettings
    from rpmiddleware.core.middleware import Middleware
    import rpmiddleware.builtin

    # The memory store in memory: the build runs in the checkout, and a
    # store on disk would be made there at start-up.
    settings = parseSettings({"plugins": {"memory": {"path": ":memory:"}}})
    middleware = Middleware.fromSettings(Clock(), settings)
    print(",".join(middleware.chain.names))
    print(rpmiddleware.builtin.__file__)
    print(sorted(n for n in sys.modules if n == "plugins" or n.startswith("plugins.")))
    """
)


class ForeignPluginsTests(SynchronousTestCase):
    """
    Another project's C{plugins} package first on C{sys.path} changes nothing.
    """

    def hostileFolder(self) -> Path:
        folder = Path(self.mktemp())
        for name in ("", "playbook"):
            package = folder / "plugins" / name
            package.mkdir(parents=True)
            (package / "__init__.py").write_text(HOSTILE)
        for module in ("card_cache", "moderation", "audio_resample", "capacity_gate"):
            (folder / "plugins" / f"{module}.py").write_text(HOSTILE)
        return folder

    def build(self, cwd: Path | str, pythonPath: list[str], first: Path | None = None) -> list[str]:
        code = BUILD
        if first is not None:
            code = f"import sys\nsys.path.insert(0, {str(first)!r})\n" + code
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonPath))
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stdout.strip().splitlines()

    def expected(self) -> str:
        chain = rpmiddleware.builtin.DEFAULT_CHAIN
        return ",".join(sorted(chain, key=chain.__getitem__))

    def test_firstOnPath(self) -> None:
        """
        From the checkout, with the foreign package inserted first on
        C{sys.path}: the default chain is built from our plugins, and no
        module called C{plugins} is imported.
        """
        folder = self.hostileFolder()
        names, builtinFile, imported = self.build(TOP, [TOP], first=folder)
        self.assertEqual(names, self.expected())
        self.assertEqual(imported, "[]")
        self.assertNotIn(str(folder), builtinFile)

    def test_workingDirectory(self) -> None:
        """
        Started in a folder that holds a C{plugins} package (the working
        directory is first on C{sys.path}), with rpmiddleware from the
        checkout on C{PYTHONPATH}.
        """
        folder = self.hostileFolder()
        names, builtinFile, imported = self.build(folder, [TOP])
        self.assertEqual(names, self.expected())
        self.assertEqual(imported, "[]")
        self.assertEqual(
            os.path.dirname(builtinFile), os.path.dirname(rpmiddleware.builtin.__file__ or "")
        )


class CheckoutRootTests(SynchronousTestCase):
    """
    Only this repository's checkout gets the finder.
    """

    def tree(self, *files: str) -> Path:
        root = Path(self.mktemp())
        (root / "rpmiddleware").mkdir(parents=True)
        for name in files:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        return root

    def test_checkout(self) -> None:
        root = self.tree(
            "setup.cfg", "plugins/__init__.py", "twisted/plugins/rpmiddleware_plugin.py"
        )
        self.assertEqual(checkoutRoot(str(root / "rpmiddleware")), os.path.abspath(root))

    def test_foreignPluginsInSitePackages(self) -> None:
        """
        A site-packages that holds some other project's C{plugins} package
        beside an installed rpmiddleware is no checkout.
        """
        root = self.tree("plugins/__init__.py", "twisted/plugins/other_plugin.py")
        self.assertIsNone(checkoutRoot(str(root / "rpmiddleware")))

    def test_installed(self) -> None:
        """
        A package with its own C{builtin/} folder (a wheel's) needs no finder,
        whatever lies beside it.
        """
        root = self.tree(
            "setup.cfg",
            "plugins/__init__.py",
            "twisted/plugins/rpmiddleware_plugin.py",
            "rpmiddleware/builtin/__init__.py",
        )
        self.assertIsNone(checkoutRoot(str(root / "rpmiddleware")))
        self.assertIsNone(sourcelayout.install(str(root / "rpmiddleware")))


class FinderTests(SynchronousTestCase):
    def test_onlyItsName(self) -> None:
        """
        The finder maps C{rpmiddleware.builtin} and nothing else: its
        submodules are found under the package's path as usual.
        """
        finder = BuiltinFinder(os.path.join(TOP, "plugins"))
        for other in ("plugins", "plugins.card_cache", "rpmiddleware", NAME + ".card_cache"):
            self.assertIsNone(finder.find_spec(other))
        spec = finder.find_spec(NAME)
        assert spec is not None
        self.assertEqual(spec.name, NAME)
        self.assertEqual(spec.submodule_search_locations, [os.path.join(TOP, "plugins")])

    def test_thisCheckout(self) -> None:
        """
        Imported from a checkout, C{rpmiddleware.builtin} is its C{plugins/}
        folder, and installing again adds no second finder.
        """
        packageDir = os.path.dirname(os.path.abspath(rpmiddleware.__file__ or ""))
        if checkoutRoot(packageDir) is None:
            raise self.skipTest("rpmiddleware is installed here, not a checkout")
        root = os.path.dirname(packageDir)
        self.assertEqual(
            os.path.abspath(rpmiddleware.builtin.__file__ or ""),
            os.path.join(root, "plugins", "__init__.py"),
        )
        before = [f for f in sys.meta_path if isinstance(f, BuiltinFinder)]
        self.assertIs(sourcelayout.install(packageDir), before[0])
        self.assertEqual([f for f in sys.meta_path if isinstance(f, BuiltinFinder)], before)
