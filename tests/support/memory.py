"""
Helpers for the memory plugin's tests: running a Clock through everything
due, in order, as the plugin's summaries are scheduled; reading the scenario
a planned request gives the model; checking a plan against RPEngine's own
assembly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.plugin import Envelope, transferDocument
from rpmiddleware.protocol.prompt import AssembledPrompt, assemble, promptRequest


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


def assertAssembledAsPlanned(
    test: SynchronousTestCase,
    request: dict[str, Any],
    card: dict[str, Any],
    report: Mapping[str, Any],
    limit: int,
) -> AssembledPrompt:
    """
    RPEngine's own assembly of a planned C{card} within C{limit} drops none
    of its example messages and counts the tokens the plan's C{report} said.
    """
    prompt = promptRequest(request, card)
    prompt["maxInputTokens"] = limit
    result = assemble(prompt)
    test.assertEqual(result.droppedExamples, 0)
    test.assertEqual(result.tokens, report["estimatedTokens"])
    return result
