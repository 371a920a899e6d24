"""
A chain plugin that records, for the plugin chain's tests: each envelope it
sees appends its name to a shared trail, and it notes engine sessions
starting and ending.
"""

from __future__ import annotations

from typing import Any

from zope.interface import implementer

from rpmiddleware.plugin.base import ChainPlugin
from rpmiddleware.plugin.interfaces import IChainContext, IEngineSessionInfo, IEnvelopePlugin
from rpmiddleware.protocol.envelope import Envelope


@implementer(IEnvelopePlugin)
class Recorder(ChainPlugin):
    """
    Appends its name to a shared trail for every envelope it sees.
    """

    def __init__(self, name: str, trail: list[str]) -> None:
        self.name = name
        self.trail = trail
        self.sessions: list[tuple[str, str]] = []

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        self.trail.append(f"{self.name}>")
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        self.trail.append(f"<{self.name}")
        return envelope

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self.sessions.append(("started", session.sessionId))

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self.sessions.append(("ended", session.sessionId))
