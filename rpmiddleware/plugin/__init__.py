"""
What a plugin author imports.

The contracts a plugin implements (C{interfaces}), a base class and a
ready-made factory (C{base}), and plugins' own client messages through the
chain (C{clientext}).  See C{docs/plugin-authors.md}.
"""

from rpmiddleware.plugin.base import ChainPlugin, PluginFactory, rejectUnknownSettings
from rpmiddleware.plugin.interfaces import IChainContext, IPluginServices
from rpmiddleware.protocol.envelope import Envelope

__all__ = [
    "ChainPlugin",
    "Envelope",
    "IChainContext",
    "IPluginServices",
    "PluginFactory",
    "rejectUnknownSettings",
]
