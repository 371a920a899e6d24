"""
The memory plugin on a Clock with one owned card, as the recall and
prompting benchmarks drive it: C{reply.request}s from client C{c1} for
C{mira} of integration C{bench}, each carrying the card.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twisted.internet.task import Clock

from rpmiddleware.builtin.memory import Memory, MemorySettings
from rpmiddleware.cards.hasher import CanonicalCard, CardHasher
from rpmiddleware.cards.validation import snapshotTransfer
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import PluginHarness


@dataclass
class MemoryBench:
    """The plugin, the harness it runs in, and the card it owns."""

    plugin: Memory
    harness: PluginHarness
    owned: CanonicalCard

    def request(self, requestId: str, **fields: Any) -> Envelope:
        """
        A C{reply.request} of C{fields} from client C{c1} with the owned
        card (a snapshot, as a game sends it).
        """
        envelope = self.harness.envelope(
            "reply.request",
            requestId=requestId,
            integrationId="bench",
            characterId="mira",
            card=snapshotTransfer(self.owned.document, self.owned.hash),
            **fields,
        )
        envelope.meta["client"] = "c1"
        return envelope


def memoryBench(path: str, card: dict[str, Any]) -> MemoryBench:
    """The memory plugin with its store at C{path}, owning C{card}."""
    clock = Clock()
    hasher = CardHasher(None)
    plugin = Memory(MemorySettings(path=path), clock, hasher, Timeline())
    return MemoryBench(plugin, PluginHarness(plugin, clock=clock), hasher.canonicalNow(card))
