"""
The memory plugin's settings: C{[plugins.memory]} in the configuration file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from rpmiddleware.plugin import rejectUnknownSettings


@dataclass(frozen=True)
class MemorySettings:
    #: The SQLite database of games' conversations (a relative path is from
    #: the working directory, like twistd's log); ":memory:" keeps them only
    #: while the daemon runs.
    path: str = "rpmiddleware-memory.sqlite3"
    #: RPEngine's prompt limit; 0 means RPEngine's own (6000).
    max_input_tokens: int = 0
    spoken_reserve_tokens: int = 300
    summary_tokens: int = 600
    facts_tokens: int = 400
    lore_tokens: int = 1000
    #: Messages scanned for lorebook keys when the book sets no scan_depth (0: the book's).
    scan_depth: int = 0
    #: Condense once the unsummarized conversation is over this many tokens...
    summarize_after_tokens: int = 2400
    #: ...keeping this many tokens of the newest entries as they are...
    keep_recent_tokens: int = 1200
    #: ...in requests of at most this many tokens of conversation each.
    summary_chunk_tokens: int = 3000
    summary_words: int = 250
    #: Seconds without a player turn before a summary request is sent.
    idle_seconds: float = 1.5
    summary_timeout: float = 120.0
    summaries: bool = True
    #: Conversations kept loaded (and session conversations kept at all).
    cached: int = 1024


def readSettings(settings: Mapping[str, Any]) -> MemorySettings:
    """
    @raise ValueError: naming the setting that is wrong.
    """
    known = {f.name: f for f in fields(MemorySettings)}
    rejectUnknownSettings("memory", settings, set(known))
    values: dict[str, Any] = {}
    for name, value in settings.items():
        default = getattr(MemorySettings, name)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        else:
            ok = isinstance(value, str) and bool(value.strip())
        if not ok:
            kind = type(default).__name__
            raise ValueError(f"plugins.memory.{name} must be a {kind} (got {value!r})")
        values[name] = float(value) if isinstance(default, float) else value
    return MemorySettings(**values)
