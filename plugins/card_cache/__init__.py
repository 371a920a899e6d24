"""
card-cache: send every character card the cheapest way RPEngine accepts.

A request carries its Character Card V2 as a whole C{snapshot}, an RFC 6902
C{patch} against the card RPEngine holds, or a bare C{reference} to it.
RPEngine holds one card per C{integrationId} + C{characterId} for one
connection session (C{crates/rp-engine-core/src/session.rs}), and a request
that names a card it does not hold there fails with C{card_resync_required}.
Games (and the Python API) should not have to know any of that: they send
snapshots, and this plugin turns each into a reference or a patch when the
current session has acknowledged what that needs, turns references and
patches back into snapshots when it has not, refuses invalid cards before they
cost a round trip, and heals C{card_resync_required} by sending the request
again with a snapshot, so the game never sees it.

Canonical cards come from the shared L{CardHasher}, which finds the hash of a
card the middleware owns by identity; diffs come from L{rpmiddleware.cards.diff},
linear in the card's size and bounded in length, and for a large card they run
in a reactor turn of their own, so that no single turn does more than a few
milliseconds of card work.  While one envelope waits for such work, later
game-to-engine envelopes wait behind it: a cancel must not overtake the
request it cancels.

The package: this module is the factory; L{plugin} the chain plugin,
L{transfers} what a transfer costs and the patches, L{store} what it
remembers: modules of this package, none of which imports this one.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from rpmiddleware.builtin.card_cache.plugin import CARD_BEARING, ENDING, NAME, CardCache
from rpmiddleware.builtin.card_cache.store import ALIAS_LIMIT, ContentStore
from rpmiddleware.builtin.card_cache.transfers import (
    candidatePatch,
    jsonSize,
    reproduces,
    smallerPatch,
    transferSize,
)
from rpmiddleware.plugin import IPluginServices, PluginFactory, PluginSettings

__all__ = [
    "ALIAS_LIMIT",
    "CARD_BEARING",
    "ENDING",
    "NAME",
    "CardCache",
    "CardCacheSettings",
    "ContentStore",
    "buildCardCache",
    "candidatePatch",
    "cardCache",
    "jsonSize",
    "reproduces",
    "smallerPatch",
    "transferSize",
]


class CardCacheSettings(PluginSettings):
    """
    The C{[plugins.card-cache]} table.
    """

    #: Card documents kept by hash (least recently used evicted first).
    store_size: Annotated[int, msgspec.Meta(ge=1)] = 64
    #: Bytes of card JSON above which diffs and patches run in a reactor turn of their own.
    defer_threshold: Annotated[int, msgspec.Meta(ge=0)] = 32 * 1024
    #: Card-bearing requests remembered until accepted or ended.
    pending_limit: Annotated[int, msgspec.Meta(ge=1)] = 256


def buildCardCache(settings: CardCacheSettings, services: IPluginServices) -> CardCache:
    """
    The plugin from its C{[plugins.card-cache]} table, read by the factory.
    """
    return CardCache(
        services.cards,
        services.timeline,
        storeSize=settings.store_size,
        deferThreshold=settings.defer_threshold,
        pendingLimit=settings.pending_limit,
    )


cardCache = PluginFactory(
    NAME,
    "Sends each character card as a reference, patch or snapshot, whichever is cheapest "
    "and valid in the current RPEngine session, and heals card_resync_required.",
    buildCardCache,
    settings=CardCacheSettings,
)
