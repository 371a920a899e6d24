"""
The memory plugin's settings: C{[plugins.memory]} in the configuration file,
read by the plugin's factory into L{MemorySettings}
(L{rpmiddleware.plugin.PluginSettings}: unknown keys and wrong values are
refused, naming C{plugins.memory.KEY}).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from rpmiddleware.plugin import PluginSettings

#: A count of tokens, entries or conversations: a whole number, 0 or more.
Count = Annotated[int, msgspec.Meta(ge=0)]
#: A number of seconds, more than 0.
Seconds = Annotated[float, msgspec.Meta(gt=0)]


class MemorySettings(PluginSettings):
    #: The SQLite database of games' conversations (a relative path is from
    #: the working directory, like twistd's log); ":memory:" keeps them only
    #: while the daemon runs.
    path: str = "rpmiddleware-memory.sqlite3"
    #: RPEngine's prompt limit; 0 means RPEngine's own (6000).
    max_input_tokens: Count = 0
    spoken_reserve_tokens: Count = 300
    summary_tokens: Count = 600
    facts_tokens: Count = 400
    lore_tokens: Count = 1000
    #: Recall (docs/memory.md, Recall): each request is given the past
    #: moments most relevant to its new line, found in the store's index;
    #: false (or a budget of 0) turns it off...
    recall: bool = True
    #: ...in at most this many tokens (its own budget, inside RPEngine's
    #: estimate like the rest: it gives way first)...
    recall_tokens: Count = 400
    #: ...and at most this many moments.
    recall_moments: Count = 4
    #: Messages scanned for lorebook keys when the book sets no scan_depth (0: the book's).
    scan_depth: Count = 0
    #: Condense once the unsummarized conversation is over this many tokens...
    summarize_after_tokens: Count = 2400
    #: ...keeping this many tokens of the newest entries as they are...
    keep_recent_tokens: Count = 1200
    #: ...in requests of at most this many tokens of conversation each.
    summary_chunk_tokens: Count = 3000
    summary_words: Count = 250
    #: Seconds without a player turn before a summary request is sent.
    idle_seconds: Seconds = 1.5
    summary_timeout: Seconds = 120.0
    summaries: bool = True
    #: Reflection in the player's pauses (docs/memory.md, Reflection): on/off...
    reflections: bool = True
    #: ...seconds without a player turn before one is asked (after summaries)...
    reflection_idle_seconds: Seconds = 3.0
    #: ...once this many entries are new since the conversation's last...
    reflection_every_entries: Count = 8
    #: ...at most once per this many seconds per conversation (a failed one
    #: waits this long, doubled with each failure in a row, up to an hour)...
    reflection_cooldown_seconds: Seconds = 60.0
    reflection_timeout: Seconds = 120.0
    #: ...taking in at most this many tokens of the newest entries...
    reflection_chunk_tokens: Count = 1500
    #: ...moving each attitude axis by at most this much...
    reflection_step: Count = 10
    #: ...and keeping its details as memories of this importance (0 to 1).
    reflection_importance: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.9
    #: A character's attitude to the player (docs/memory.md, Attitude): kept,
    #: changed and told to the model each turn in one line.
    attitude: bool = True
    #: Conversations kept loaded (and session conversations kept at all).
    cached: Count = 1024
    #: Seconds a write waits for the database while another process holds
    #: its lock (SQLite retries meanwhile, on the store's own thread) before
    #: it is given up and the game is told (docs/memory.md, Durability).
    write_timeout: Seconds = 30.0

    def __post_init__(self) -> None:
        if not self.path.strip():
            raise ValueError("path must name a file (or be :memory:), not be empty")
