"""
The built-in plugins of rpmiddleware.

C{FACTORIES} lists every built-in factory; C{DEFAULT_CHAIN} is the chain a
configuration starts from (name -> priority, lower nearer the game).  This
package's path is never extended: only these modules are built-ins, whatever
folder called C{plugins} lies in the working directory.
"""

from __future__ import annotations

from rpmiddleware.interfaces import IPluginFactory

FACTORIES: list[IPluginFactory] = []

DEFAULT_CHAIN: dict[str, int] = {}
