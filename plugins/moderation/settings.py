"""
The moderation plugin's settings: its C{[plugins.moderation]} table, checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rpmiddleware.plugin import rejectUnknownSettings

NAME = "moderation"
ACTIONS = ("mask", "block", "cancel")
FAIL_POLICIES = ("open", "closed")
_KNOWN = {
    "words",
    "patterns",
    "action",
    "input_action",
    "output_action",
    "mask_char",
    "max_hold_chars",
    "remote_url",
    "remote_model",
    "remote_timeout",
    "fail_policy",
}


def _choice(settings: Mapping[str, Any], key: str, choices: Sequence[str], default: str) -> str:
    value = settings.get(key, default)
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _strings(settings: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = settings.get(key, [])
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{key} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class ModerationSettings:
    """
    The plugin's TOML table, checked.
    """

    words: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    action: str = "mask"
    input_action: str = ""
    output_action: str = ""
    mask_char: str = "*"
    max_hold_chars: int = 64
    remote_url: str = ""
    remote_model: str = "omni-moderation-latest"
    remote_timeout: float = 2.0
    fail_policy: str = "open"

    @property
    def inputAction(self) -> str:
        return self.input_action or self.action

    @property
    def outputAction(self) -> str:
        return self.output_action or self.action

    @classmethod
    def fromMapping(cls, settings: Mapping[str, Any]) -> ModerationSettings:
        rejectUnknownSettings(NAME, settings, _KNOWN)
        patterns = _strings(settings, "patterns")
        for index, pattern in enumerate(patterns):
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"patterns[{index}] is not a valid regular expression: {e}")
        maskChar = settings.get("mask_char", cls.mask_char)
        if not isinstance(maskChar, str) or len(maskChar) != 1:
            raise ValueError(f"mask_char must be a single character, got {maskChar!r}")
        hold = settings.get("max_hold_chars", cls.max_hold_chars)
        if type(hold) is not int or hold < 1:
            raise ValueError(f"max_hold_chars must be a positive whole number, got {hold!r}")
        url = settings.get("remote_url", cls.remote_url)
        if not isinstance(url, str) or (url and not url.startswith(("http://", "https://"))):
            raise ValueError(f"remote_url must be an http:// or https:// URL or empty, got {url!r}")
        model = settings.get("remote_model", cls.remote_model)
        if not isinstance(model, str):
            raise ValueError(f"remote_model must be a string, got {model!r}")
        timeout = settings.get("remote_timeout", cls.remote_timeout)
        if type(timeout) not in (int, float) or timeout <= 0:
            raise ValueError(
                f"remote_timeout must be a positive number of seconds, got {timeout!r}"
            )
        return cls(
            words=_strings(settings, "words"),
            patterns=patterns,
            action=_choice(settings, "action", ACTIONS, cls.action),
            input_action=_choice(settings, "input_action", ("", *ACTIONS), ""),
            output_action=_choice(settings, "output_action", ("", *ACTIONS), ""),
            mask_char=maskChar,
            max_hold_chars=hold,
            remote_url=url,
            remote_model=model,
            remote_timeout=float(timeout),
            fail_policy=_choice(settings, "fail_policy", FAIL_POLICIES, cls.fail_policy),
        )
