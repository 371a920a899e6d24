"""
C{rpmiddleware.builtin} in a source checkout.

The built-in plugins live in the repository's top-level C{plugins/} folder
(the layout the product owner chose), but they are this project's modules,
not a top-level package called C{plugins}: a name any project may use, and
one that pip would otherwise put straight into site-packages.  setup.cfg's
C{package_dir} ships that folder as C{rpmiddleware.builtin}, so a wheel holds
a real C{rpmiddleware/builtin/} and needs nothing from here.

A source checkout has no such folder, and neither has the editable install
that CI and the README use: C{editable_mode=compat} only puts the checkout
on C{sys.path} (which is how C{twistd} finds the C{twisted/plugins} drop-in)
and ignores C{package_dir}.  So when C{rpmiddleware} is imported from a
checkout, L{install} adds one small finder that maps exactly the name
C{rpmiddleware.builtin} to C{<checkout>/plugins}; its submodules are then
found by Python's own machinery under that package's C{__path__}.  Nothing
else is mapped: C{import plugins} never means us, and a foreign C{plugins}
package (on C{sys.path}, or in site-packages beside an installed
rpmiddleware) is never looked at.

A checkout is recognised by the repository's own files beside the
package: C{setup.cfg}, C{plugins/__init__.py} and the twistd drop-in.  The
check is four C{stat} calls, and this module imports nothing Python has
not loaded at start-up (importing rpmiddleware stays cheap and installs no
reactor).
"""

from __future__ import annotations

import os
import sys
from importlib.util import spec_from_file_location
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

#: The package the checkout's C{plugins/} folder is shipped as.
NAME = "rpmiddleware.builtin"
#: Files that only this repository's checkout has beside the package.
MARKERS = (
    ("setup.cfg",),
    ("plugins", "__init__.py"),
    ("twisted", "plugins", "rpmiddleware_plugin.py"),
)


def checkoutRoot(packageDir: str) -> str | None:
    """
    The repository checkout that C{packageDir} (the C{rpmiddleware} package
    folder) lies in, or C{None} for an installed package.

    An installed package has its own C{builtin/} folder and no repository
    files beside it: a C{plugins} folder in the same site-packages belongs
    to some other project.
    """
    if os.path.isdir(os.path.join(packageDir, "builtin")):
        return None
    root = os.path.dirname(os.path.abspath(packageDir))
    if all(os.path.isfile(os.path.join(root, *marker)) for marker in MARKERS):
        return root
    return None


class BuiltinFinder:
    """
    Finds C{rpmiddleware.builtin} in a checkout's C{plugins/} folder, and
    nothing else.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != NAME:
            return None
        return spec_from_file_location(
            NAME,
            os.path.join(self.folder, "__init__.py"),
            submodule_search_locations=[self.folder],
        )

    def invalidate_caches(self) -> None:
        pass


def install(packageDir: str) -> BuiltinFinder | None:
    """
    Make C{rpmiddleware.builtin} importable when C{packageDir} is the
    C{rpmiddleware} folder of a checkout (once; later calls find the
    finder already there).  Appended to C{sys.meta_path}: Python's own
    finders are asked first, and find nothing under this name in a checkout.
    """
    root = checkoutRoot(packageDir)
    if root is None:
        return None
    folder = os.path.join(root, "plugins")
    for finder in sys.meta_path:
        if isinstance(finder, BuiltinFinder) and finder.folder == folder:
            return finder
    finder = BuiltinFinder(folder)
    sys.meta_path.append(finder)
    return finder
