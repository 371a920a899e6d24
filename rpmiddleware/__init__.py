"""
rpmiddleware: the local middleware between games and RPEngine.

The built-in plugins are C{rpmiddleware.builtin}, shipped from the
repository's top-level C{plugins/} folder; in a source checkout
L{rpmiddleware.runtime.sourcelayout} makes that name importable (see why there).
"""

from rpmiddleware.runtime import sourcelayout as _sourcelayout

__version__ = "0.1.0"

_sourcelayout.install(__path__[0])
