"""
A character's mood: what its lines have felt lately, fading with time.

Each sentence's feeling adds to the mood and older ones fade (each new
sentence keeps L{KEEP} of what was there), so a character that was angry
three lines ago is still a little angry, and one that has calmed down for a
while is neutral again.  The mood is what a sentence with no cue of its own
carries (L{Mood.carry}): a line that begins in anger and goes on "Now get
out." stays angry, as a face would.  It is kept with the conversation (the
memory plugin's state), so it survives the end of a session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rpmiddleware.plugin import FEELINGS

NEUTRAL = FEELINGS[0]
#: What of the mood each new sentence keeps.
KEEP = 0.7
#: Below this the mood is neutral.
THRESHOLD = 0.2
#: A sentence with no cue carries the mood at this share of its strength.
CARRIED = 0.6


@dataclass
class Mood:
    """
    Each feeling's weight in the mood, 0..1 (neutral is what is left).
    """

    weights: dict[str, float] = field(default_factory=dict)

    @property
    def feeling(self) -> str:
        if not self.weights:
            return NEUTRAL
        strongest = max(FEELINGS[1:], key=lambda f: self.weights.get(f, 0.0))
        return strongest if self.weights.get(strongest, 0.0) >= THRESHOLD else NEUTRAL

    @property
    def intensity(self) -> float:
        feeling = self.feeling
        return 0.0 if feeling == NEUTRAL else round(self.weights[feeling], 2)

    def felt(self, feeling: str, intensity: float) -> None:
        """
        A sentence felt C{feeling} this strongly (0..1): older weights fade.
        """
        faded = {f: w * KEEP for f, w in self.weights.items() if w * KEEP >= 0.01}
        if feeling != NEUTRAL and feeling in FEELINGS:
            faded[feeling] = min(1.0, faded.get(feeling, 0.0) + (1.0 - KEEP) * 2 * intensity)
        self.weights = faded

    def carry(self) -> tuple[str, float]:
        """
        What a sentence with no cue of its own feels: the mood, softer.
        """
        feeling = self.feeling
        if feeling == NEUTRAL:
            return NEUTRAL, 0.0
        return feeling, round(self.intensity * CARRIED, 2)

    def toJson(self) -> dict[str, Any]:
        """
        What is kept with the conversation: C{{feeling, intensity, weights}}.
        """
        return {
            "feeling": self.feeling,
            "intensity": self.intensity,
            "weights": {f: round(w, 3) for f, w in self.weights.items()},
        }

    @classmethod
    def fromJson(cls, value: Any) -> Mood:
        """
        A mood kept before (L{toJson}); anything else is a neutral mood, so
        a damaged or foreign state never stops a reply.
        """
        if not isinstance(value, Mapping):
            return cls()
        weights = value.get("weights")
        if not isinstance(weights, Mapping):
            return cls()
        return cls(
            {
                f: min(1.0, float(w))
                for f, w in weights.items()
                if f in FEELINGS[1:]
                and isinstance(w, int | float)
                and not isinstance(w, bool)
                and w > 0
            }
        )


__all__ = ["Mood"]
