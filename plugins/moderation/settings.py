"""
The moderation plugin's settings: its C{[plugins.moderation]} table, read by
the plugin's factory into L{ModerationSettings}
(L{rpmiddleware.plugin.PluginSettings}: unknown keys and wrong values are
refused, naming C{plugins.moderation.KEY}).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from rpmiddleware.plugin import PluginSettings

NAME = "moderation"
ACTIONS = ("mask", "block", "cancel")
FAIL_POLICIES = ("open", "closed")

Action = Literal["mask", "block", "cancel"]
#: An action for one direction; empty: C{action}'s.
DirectionAction = Literal["", "mask", "block", "cancel"]
Word = Annotated[str, msgspec.Meta(min_length=1)]


class ModerationSettings(PluginSettings):
    """
    The plugin's TOML table, checked.
    """

    words: tuple[Word, ...] = ()
    patterns: tuple[Word, ...] = ()
    action: Action = "mask"
    input_action: DirectionAction = ""
    output_action: DirectionAction = ""
    mask_char: Annotated[str, msgspec.Meta(min_length=1, max_length=1)] = "*"
    max_hold_chars: Annotated[int, msgspec.Meta(ge=1)] = 64
    remote_url: str = ""
    remote_model: str = "omni-moderation-latest"
    remote_timeout: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    fail_policy: Literal["open", "closed"] = "open"

    def __post_init__(self) -> None:
        for index, pattern in enumerate(self.patterns):
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"patterns[{index}] is not a valid regular expression: {e}")
        if self.remote_url and not self.remote_url.startswith(("http://", "https://")):
            raise ValueError(
                f"remote_url must be an http:// or https:// URL or empty, got {self.remote_url!r}"
            )

    @property
    def inputAction(self) -> str:
        return self.input_action or self.action

    @property
    def outputAction(self) -> str:
        return self.output_action or self.action

    @classmethod
    def fromMapping(cls, settings: Mapping[str, Any]) -> ModerationSettings:
        """
        The table read as the factory reads it.

        @raise ValueError: naming C{plugins.moderation.KEY}.
        """
        return cls.read(settings, NAME)
