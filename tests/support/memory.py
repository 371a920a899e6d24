"""
Helpers for the memory plugin's tests: running a Clock through everything
due, in order, as the plugin's summaries are scheduled; reading the scenario
a planned request gives the model.
"""

from __future__ import annotations

from twisted.internet.task import Clock

from rpmiddleware.plugin import Envelope, transferDocument


def settle(clock: Clock, seconds: float = 5.0) -> None:
    """Run every call due in the next C{seconds}, in order."""
    end = clock.seconds() + seconds
    for _ in range(100_000):
        due = [c.getTime() for c in clock.getDelayedCalls() if c.getTime() <= end]
        if not due:
            break
        clock.advance(max(0.0, min(due) - clock.seconds()))
    clock.advance(max(0.0, end - clock.seconds()))


def scenarioOf(request: Envelope) -> str:
    """The card's C{scenario} as a planned request carries it."""
    card = transferDocument(request["card"])
    assert card is not None
    return str(card["data"].get("scenario", ""))
