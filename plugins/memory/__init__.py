"""
memory: characters that remember, for an RPEngine that does not.

RPEngine keeps no conversation (every request is a first meeting), ignores
the card's lorebook and plays one character per request.  This plugin gives
every request the conversation so far as chat turns, a running summary that
RPEngine itself writes of what no longer fits, the facts a game pinned and
the world knowledge the turn activates, all within RPEngine's own prompt
estimate; it keeps games' conversations in SQLite across restarts, and lets a
game list, read, edit, pin, export, import and forget them through the
C{memory} client message (L{ops}) and the Python API (L{IConversationMemory}).
See C{docs/memory.md}.

The package: this module is the factory; L{plugin} the chain plugin,
L{planner} the prompt plan, L{lorebook} activation, L{summarizer} the
summary requests, L{store} the database, L{conversation} the data, L{ops}
what a game may ask, L{settings} the configuration.
"""

from __future__ import annotations

from rpmiddleware.builtin.memory.api import IConversationMemory
from rpmiddleware.builtin.memory.plugin import NAME, Memory
from rpmiddleware.builtin.memory.settings import MemorySettings
from rpmiddleware.builtin.memory.storeerrors import StoreError
from rpmiddleware.plugin import IPluginServices, PluginFactory

__all__ = ["IConversationMemory", "Memory", "MemorySettings", "buildMemory", "memory"]


def buildMemory(parsed: MemorySettings, services: IPluginServices) -> Memory:
    """
    The plugin from its C{[plugins.memory]} table, read by the factory.
    """
    plugin = Memory(
        parsed,
        services.reactor,
        services.cards,
        services.timeline,
        services.config.game.integration_id,
    )
    if parsed.path != ":memory:":
        # Opened (made if need be) and written to now, so that a store that
        # cannot be written (a read-only folder or file, a lock another
        # process holds, not a memory database) is said at start-up, with
        # the file and the cause.
        try:
            plugin.store.check()
        except StoreError as e:
            raise ValueError(str(e))
    return plugin


memory = PluginFactory(
    NAME,
    "Conversation memory, summaries and world knowledge for every request.",
    buildMemory,
    settings=MemorySettings,
)
