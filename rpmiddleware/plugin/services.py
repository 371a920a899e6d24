"""
What the middleware lends every plugin when it is built: L{PluginServices}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zope.interface import implementer

from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.plugin.interfaces import IPluginServices
from rpmiddleware.protocol.timeline import Timeline


@implementer(IPluginServices)
@dataclass(frozen=True)
class PluginServices:
    """
    What a plugin's build function is given (L{IPluginServices}), typed.
    The core makes one for the whole chain
    (L{rpmiddleware.core.middleware.Middleware.fromSettings}); a test makes
    its own (L{rpmiddleware.testing.kit.pluginServices}).

    Frozen: a plugin cannot swap a service for the others.  C{config} is the
    daemon's own L{Settings}, shared: read it, never change it.

    @ivar reactor: the reactor the middleware runs on (a
        L{twisted.internet.task.Clock} in tests).
    @ivar config: the daemon's settings; a plugin's own table is what its
        factory is given, not read from here.
    @ivar cards: the shared card hasher.
    @ivar timeline: the shared timeline of requests.
    """

    reactor: Any
    config: Settings
    cards: CardHasher
    timeline: Timeline
