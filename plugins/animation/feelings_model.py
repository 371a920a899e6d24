"""
Feelings written by the model: taught in the prompt, taken out of the reply
by RPEngine's response processing, as RPEngine's own test does
(C{crates/rp-engine-core/src/app.rs}: a trailing C{<emotion>} tag, captured
with C{occurrence: last} and removed from the text and the speech).

The model is told, in one line of the request's scene context, to end its
reply with one of the feelings as a tag (C{... Keep moving. <fear>}).  The
rule matches only those seven words, so an expression tag RPEngine's voice
performs (C{<laugh>}) is never taken for one.  One feeling per reply: the
model writes it once, at the end, after it knows what it said.

The cost: a request with response processing is buffered by RPEngine, which
sends no text and starts no speech until the whole reply is generated
(app.rs C{gemma_delta} streams only without it), so the first audio waits
for the model's last token; docs/animation.md has the measurement.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.plugin import FEELINGS

#: The rule's id: C{extractedContent["feeling"]} on reply.text.completed.
RULE_ID = "feeling"
#: The trailing tag, one of the feelings, and any space after it.
PATTERN = "<(" + "|".join(FEELINGS) + r")>\s*$"
RULE: dict[str, Any] = {
    "id": RULE_ID,
    "matcher": {"type": "regex", "pattern": PATTERN},
    "captureGroup": 1,
    "occurrence": "last",
    "remove": "match",
    "removeFrom": ["text", "audio"],
}


def instruction(character: str, mood: str) -> str:
    """
    The one line that teaches the model, with the mood it is in so far.
    """
    tags = " ".join(f"<{f}>" for f in FEELINGS)
    lead = f"{character} feels {mood} so far. " if mood != FEELINGS[0] else ""
    return (
        f"{lead}End every reply of {character} with exactly one tag naming what "
        f"{character} feels, one of {tags}; nothing after it."
    )


def feelingOf(extracted: Any) -> str | None:
    """
    The feeling the model wrote, from C{extractedContent}; C{None} when it
    wrote none (the rule captured nothing).
    """
    if not isinstance(extracted, dict):
        return None
    captured = extracted.get(RULE_ID)
    if not isinstance(captured, list) or not captured:
        return None
    last = captured[-1]
    return last if isinstance(last, str) and last in FEELINGS else None


__all__ = ["PATTERN", "RULE", "RULE_ID", "feelingOf", "instruction"]
