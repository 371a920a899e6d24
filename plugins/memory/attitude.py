"""
What a character feels about the player, per conversation: a few bounded
axes with named levels (as Inworld's relationship levels) and a one-line
stance, changed by the character's reflections, by the game and by the
actions the game declares, and told to the model in one short line.

The axes are L{AXES}, each a whole number from L{LOWEST} to L{HIGHEST},
0 (neutral) to begin with; a value's level is L{levelOf}.  An attitude is
kept with its conversation in the store's C{state} table under L{STATE}
(L{rpmiddleware.builtin.memory.store.MemoryStore.setState}), so it is
exported, restored and forgotten with it.  This module is the data and its
rules only: the plugin applies changes, writes them and tells the game.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The axes, in the order the line names them.
AXES = ("trust", "affection", "respect")
LOWEST, HIGHEST = -100, 100
#: The levels from the lowest up, each with the least value it starts at.
LEVELS: tuple[tuple[str, int], ...] = (
    ("hostile", LOWEST),
    ("cold", -59),
    ("neutral", -19),
    ("warm", 20),
    ("devoted", 60),
)
#: The conversation state the attitude is kept under.
STATE = "attitude"
#: What a stance may hold: one line, about 50 tokens.
MAX_STANCE = 200
#: The largest change one adjustment may ask for, per axis.
MAX_CHANGE = 2 * HIGHEST


class AttitudeError(ValueError):
    """A change that cannot be made; the message names what was wrong."""


def levelOf(value: int) -> str:
    """The named level of an axis' value."""
    found = LEVELS[0][0]
    for name, start in LEVELS:
        if value >= start:
            found = name
    return found


def clamp(value: int, low: int = LOWEST, high: int = HIGHEST) -> int:
    return max(low, min(high, value))


def stanceOf(value: Any, at: str = "stance") -> str:
    """A stance as kept: one line of at most L{MAX_STANCE} characters."""
    if not isinstance(value, str):
        raise AttitudeError(f"{at} must be a string")
    line = " ".join(value.split())
    if len(line) > MAX_STANCE:
        raise AttitudeError(f"{at} is longer than {MAX_STANCE} characters")
    return line


def valuesOf(raw: Any, at: str, low: int, high: int) -> dict[str, int]:
    """
    Axis values or changes from a game or a reflection: an object of known
    axes to whole numbers from C{low} to C{high}.
    """
    if not isinstance(raw, Mapping):
        raise AttitudeError(f"{at} must be an object of {', '.join(AXES)}")
    values: dict[str, int] = {}
    for axis, value in raw.items():
        if axis not in AXES:
            raise AttitudeError(f"{at}.{axis} is not an axis (the axes: {', '.join(AXES)})")
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise AttitudeError(f"{at}.{axis} must be a whole number from {low} to {high}")
        values[axis] = value
    return values


@dataclass(frozen=True)
class LevelChange:
    """An axis whose level changed: what the game is told."""

    axis: str
    before: str
    after: str
    value: int

    def asDict(self) -> dict[str, Any]:
        return {"axis": self.axis, "from": self.before, "to": self.after, "value": self.value}


@dataclass
class Attitude:
    """One character's attitude to the player in one conversation."""

    values: dict[str, int] = field(default_factory=lambda: dict.fromkeys(AXES, 0))
    stance: str = ""

    @classmethod
    def fromState(cls, state: Mapping[str, Any]) -> Attitude:
        """
        The attitude a conversation's state keeps (neutral when none);
        what does not read as one is taken as neutral, so a hand-edited
        save never stops a character.
        """
        raw = state.get(STATE)
        made = cls()
        if not isinstance(raw, Mapping):
            return made
        for axis in AXES:
            value = raw.get(axis)
            if isinstance(value, int) and not isinstance(value, bool):
                made.values[axis] = clamp(value)
        stance = raw.get("stance")
        if isinstance(stance, str):
            made.stance = " ".join(stance.split())[:MAX_STANCE]
        return made

    def asState(self) -> dict[str, Any]:
        return {**self.values, "stance": self.stance}

    @property
    def neutral(self) -> bool:
        """Nothing felt yet: every axis 0 and no stance."""
        return not self.stance and not any(self.values.values())

    def asDict(self) -> dict[str, Any]:
        """What a game reads: each axis' value and level, and the stance."""
        return {
            "axes": {a: {"value": v, "level": levelOf(v)} for a, v in self.values.items()},
            "stance": self.stance,
        }

    def changed(
        self,
        changes: Mapping[str, int],
        absolute: bool = False,
        step: int | None = None,
        stance: str | None = None,
    ) -> tuple[Attitude, list[LevelChange]]:
        """
        The attitude after C{changes} (added to each axis, or set to them
        when C{absolute}; an addition no larger than C{step} either way when
        given), every axis kept within bounds; and the axes whose level
        changed.
        """
        after = Attitude(dict(self.values), self.stance if stance is None else stance)
        for axis, value in changes.items():
            if absolute:
                after.values[axis] = clamp(value)
            else:
                if step is not None:
                    value = clamp(value, -step, step)
                after.values[axis] = clamp(self.values[axis] + value)
        moved = [
            LevelChange(axis, levelOf(self.values[axis]), levelOf(after.values[axis]), v)
            for axis, v in after.values.items()
            if levelOf(self.values[axis]) != levelOf(v)
        ]
        return after, moved

    def line(self, character: str, player: str) -> str:
        """
        The one line the model is given, e.g. "Mira's attitude to Ada:
        trust warm (40), affection cold (-30), respect neutral (0); stance:
        wary of her promises."
        """
        axes = ", ".join(f"{a} {levelOf(v)} ({v})" for a, v in self.values.items())
        told = f"{character or 'The character'}'s attitude to {player or 'the player'}: {axes}"
        return f"{told}; stance: {self.stance}" if self.stance else told


def levelsTable() -> list[dict[str, Any]]:
    """The levels with their ranges, for the docs and the console."""
    rows = []
    for i, (name, start) in enumerate(LEVELS):
        end = LEVELS[i + 1][1] - 1 if i + 1 < len(LEVELS) else HIGHEST
        rows.append({"level": name, "from": start, "to": end})
    return rows


__all__ = [
    "AXES",
    "HIGHEST",
    "LEVELS",
    "LOWEST",
    "MAX_STANCE",
    "STATE",
    "Attitude",
    "AttitudeError",
    "LevelChange",
    "levelOf",
    "stanceOf",
    "valuesOf",
]
