"""
What a plugin author imports: a base class for plugins and a ready-made factory.

A third-party plugin is a module like this one, anywhere on the path::

    from twisted.plugin import IPlugin
from twisted.plugin import IPlugin
from zope.interface import implementer
    from rpmiddleware.interfaces import IEnvelopePlugin
    from rpmiddleware.plugin import ChainPlugin, PluginFactory

    @implementer(IEnvelopePlugin)
    class Shout(ChainPlugin):
        name = "shout"

        def envelopeToGame(self, envelope, context):
            if envelope.type == "reply.text.delta":
                envelope["text"] = envelope.get("text", "").upper()
            return envelope

    shout = PluginFactory("shout", "Makes characters shout.", lambda settings, services: Shout())

and a drop-in C{twisted/plugins/shout_plugin.py} that imports C{shout}.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from rpmiddleware.envelope import Envelope
from rpmiddleware.interfaces import (
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IPluginFactory,
    IPluginServices,
)

Builder = Callable[[Mapping[str, Any], IPluginServices], IEnvelopePlugin]


class ChainPlugin:
    """
    A base for plugins: passes everything on and ignores sessions, so a
    subclass overrides only what its one job needs.  Subclasses declare
    C{@implementer(IEnvelopePlugin)} themselves.
    """

    name = "unnamed"

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        """For a plugin with client messages (L{IClientExtension}): a client session is over."""

    def clientSessionResumed(self, clientId: str, context: IChainContext) -> None:
        """For a plugin with client messages (L{IClientExtension}): a session was taken back."""


@implementer(IPlugin, IPluginFactory)
class PluginFactory:
    """
    An L{IPluginFactory} from a name, a description and a build function.

    It also provides Twisted's L{IPlugin}, which is what makes
    L{twisted.plugin.getPlugins} notice an object in a drop-in module.
    """

    def __init__(self, name: str, description: str, build: Builder) -> None:
        self.name = name
        self.description = description
        self._build = build

    def buildPlugin(
        self, settings: Mapping[str, Any], services: IPluginServices
    ) -> IEnvelopePlugin:
        return self._build(settings, services)

    def __repr__(self) -> str:
        return f"<PluginFactory {self.name}>"


def rejectUnknownSettings(name: str, settings: Mapping[str, Any], known: set[str]) -> None:
    """
    Raise ValueError naming the first setting a plugin does not understand.
    """
    for key in settings:
        if key not in known:
            raise ValueError(
                f"unknown setting {key!r} for plugin {name} (known: {', '.join(sorted(known))})"
            )
