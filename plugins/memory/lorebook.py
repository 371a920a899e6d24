"""
World knowledge: which lorebook entries a turn activates.

RPEngine keeps a card's C{character_book} but never scans it
(C{docs/protocol-v3.md}), so this is the only place a card's world knowledge
reaches the model.  Entries activate as Character Card V2 and SillyTavern
define them:

  - C{enabled: false} never activates; C{constant: true} always does;
  - otherwise one of C{keys} must appear in the scanned text, and for a
    C{selective} entry with C{secondary_keys} one of those too;
  - a key is matched without regard to case unless C{case_sensitive}, as a
    whole word where it starts and ends with a letter or digit, and as a
    regular expression when written C{/pattern/flags} (SillyTavern's form);
  - the scanned text is the new line and the book's C{scan_depth} newest
    messages (L{DEFAULT_SCAN_DEPTH} when the book sets none);
  - with C{recursive_scanning}, what activated entries say is scanned too;
  - within the C{token_budget}, entries of higher C{priority} are kept first
    (constant ones among them); those kept are given in C{insertion_order},
    C{position} C{before_char} before the card's description, else after its
    scenario.

A game's own knowledge (L{Entry} from the C{memory} message's C{know}) joins
the card's entries when its scope matches the turn.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from rpmiddleware.plugin import estimateTokens

DEFAULT_SCAN_DEPTH = 4
#: Passes of recursive scanning at most (a book's entries can name each other).
MAX_RECURSION = 5
#: A regular-expression key longer than this is not compiled.
MAX_PATTERN = 500
BEFORE_CHAR = "before_char"
AFTER_CHAR = "after_char"


class Searcher(Protocol):
    """What a key's pattern is used for: searching a text."""

    def search(self, text: str) -> re.Match[str] | None: ...


class _LiteralKey:
    """
    A plain key's pattern, compiled the first time a text is searched with
    it.  A plain key is searched for only in a text that holds its words
    (L{Matcher}), so most of a large book's patterns are never needed: an
    entry per place and person of a world, and a conversation that names a
    few of them.
    """

    __slots__ = ("_key", "_flags", "_compiled")

    def __init__(self, key: str, flags: int) -> None:
        self._key = key
        self._flags = flags
        self._compiled: re.Pattern[str] | None = None

    def search(self, text: str) -> re.Match[str] | None:
        compiled = self._compiled
        if compiled is None:
            key = self._key
            # A whole word where the key starts or ends with a letter or digit.
            pattern = re.escape(key)
            if key[0].isalnum():
                pattern = r"(?<!\w)" + pattern
            if key[-1].isalnum():
                pattern += r"(?!\w)"
            compiled = self._compiled = re.compile(pattern, self._flags)
        return compiled.search(text)


#: A key's pattern, and the lower-cased words a plain ASCII key needs in
#: the text before its pattern can match (None for a regular expression).
Matcher = tuple[Searcher, str | None]


@dataclass(frozen=True)
class Entry:
    """
    One lorebook entry, read from a card's book or given by the game.
    """

    content: str
    keys: tuple[str, ...] = ()
    secondaryKeys: tuple[str, ...] = ()
    selective: bool = False
    constant: bool = False
    enabled: bool = True
    caseSensitive: bool = False
    insertionOrder: float = 0
    priority: float = 0
    position: str = AFTER_CHAR
    name: str = ""
    #: Where it came from: C{"card"}, or the game's scope (C{"world"},
    #: C{"character:ID"}, C{"location:NAME"}, C{"scene:NAME"}).
    source: str = "card"
    matchers: tuple[Matcher, ...] = field(default=(), compare=False, repr=False)
    secondaryMatchers: tuple[Matcher, ...] = field(default=(), compare=False, repr=False)

    @property
    def tokens(self) -> int:
        return estimateTokens(self.content)

    def asDict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "position": self.position,
            "estimatedTokens": self.tokens,
        }


@dataclass(frozen=True)
class Book:
    entries: tuple[Entry, ...]
    scanDepth: int = DEFAULT_SCAN_DEPTH
    tokenBudget: int | None = None
    recursive: bool = False


def matcher(key: str, caseSensitive: bool) -> Matcher | None:
    """
    The pattern one key matches with, or C{None} for a key that matches
    nothing (empty, or a regular expression that does not compile).
    """
    key = key.strip()
    if not key:
        return None
    flags = 0 if caseSensitive else re.IGNORECASE
    regex = re.fullmatch(r"/(.+)/([a-z]*)", key, re.DOTALL) if key[0] == "/" else None
    if regex is not None and len(regex.group(1)) <= MAX_PATTERN:
        for letter in regex.group(2):
            flags |= {"i": re.IGNORECASE, "s": re.DOTALL, "m": re.MULTILINE}.get(letter, 0)
        try:
            return re.compile(regex.group(1), flags), None
        except re.error:
            return None
    return _LiteralKey(key, flags), key.lower() if key.isascii() else None


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return ()


def _number(value: Any, default: float = 0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return value


def entryFrom(raw: Mapping[str, Any], source: str = "card") -> Entry | None:
    """
    An L{Entry} from a book's entry object, or C{None} when it has no text.
    """
    content = raw.get("content")
    if not isinstance(content, str) or not content.strip():
        return None
    caseSensitive = raw.get("case_sensitive") is True
    keys = _strings(raw.get("keys"))
    secondary = _strings(raw.get("secondary_keys"))
    position = raw.get("position")
    return Entry(
        content=content.strip(),
        keys=keys,
        secondaryKeys=secondary,
        selective=raw.get("selective") is True,
        constant=raw.get("constant") is True,
        enabled=raw.get("enabled") is not False,
        caseSensitive=caseSensitive,
        insertionOrder=_number(raw.get("insertion_order")),
        priority=_number(raw.get("priority")),
        position=BEFORE_CHAR if position == BEFORE_CHAR else AFTER_CHAR,
        name=str(raw.get("name") or raw.get("comment") or (keys[0] if keys else "")),
        source=source,
        matchers=tuple(m for m in (matcher(k, caseSensitive) for k in keys) if m is not None),
        secondaryMatchers=tuple(
            m for m in (matcher(k, caseSensitive) for k in secondary) if m is not None
        ),
    )


class EntryReader:
    """
    Reads book entries, remembering each by its content.

    A card's book is read for each request whose card is a new document (a
    game that edits its card every turn sends one each turn), and a book of
    850 entries took about 95 ms on the reactor to read when each key's
    pattern was compiled as it was read (it has more keys than C{re} keeps
    compiled, 512).  An entry whose JSON is unchanged is found here instead,
    with the patterns it has compiled since.

    @param size: how many entries are remembered at most (least recently
        read go first).
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[str, bytes], Entry | None] = OrderedDict()

    def __call__(self, raw: Mapping[str, Any], source: str = "card") -> Entry | None:
        try:
            content = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            # Not JSON (a game's odd dict): read as it is, not remembered.
            return entryFrom(raw, source)
        key = (source, content)
        entries = self._entries
        if key in entries:
            entries.move_to_end(key)
            return entries[key]
        entry = entries[key] = entryFrom(raw, source)
        if len(entries) > self._size:
            entries.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._entries)


def bookOf(
    card: Mapping[str, Any],
    read: Callable[[Mapping[str, Any]], Entry | None] = entryFrom,
) -> Book:
    """
    The book of a Character Card V2 (an empty one when it has none), its
    entries read with C{read} (an L{EntryReader} remembers them).
    """
    data = card.get("data")
    book = data.get("character_book") if isinstance(data, Mapping) else None
    if not isinstance(book, Mapping):
        return Book(())
    raw = book.get("entries")
    entries = (
        tuple(e for e in (read(r) for r in raw if isinstance(r, Mapping)) if e is not None)
        if isinstance(raw, list)
        else ()
    )
    depth = book.get("scan_depth")
    budget = book.get("token_budget")
    return Book(
        entries,
        int(depth)
        if isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0
        else DEFAULT_SCAN_DEPTH,
        int(budget)
        if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0
        else None,
        book.get("recursive_scanning") is True,
    )


def _found(matchers: tuple[Matcher, ...], text: str, folded: str) -> bool:
    for pattern, needle in matchers:
        # A substring test first spares most regex searches.
        if needle is not None and needle not in folded:
            continue
        if pattern.search(text):
            return True
    return False


def _matches(entry: Entry, text: str, folded: str) -> bool:
    if not _found(entry.matchers, text, folded):
        return False
    if entry.selective and entry.secondaryMatchers:
        return _found(entry.secondaryMatchers, text, folded)
    return True


def activate(
    entries: Sequence[Entry], scanned: Iterable[str], recursive: bool, budget: int
) -> tuple[list[Entry], list[Entry]]:
    """
    The entries that activate on C{scanned} (the new line and the recent
    messages), kept within C{budget} tokens; and those that activated but
    did not fit.

    @return: C{(kept in insertion order, left out)}.
    """
    text = "\n".join(scanned)
    folded = text.lower()
    active: dict[int, Entry] = {}
    candidates = [(i, e) for i, e in enumerate(entries) if e.enabled]
    for i, e in candidates:
        if e.constant or _matches(e, text, folded):
            active[i] = e
    passes = 0
    while recursive and passes < MAX_RECURSION:
        passes += 1
        more = "\n".join(active[i].content for i in active)
        low = more.lower()
        found = {i: e for i, e in candidates if i not in active and _matches(e, more, low)}
        if not found:
            break
        active.update(found)
    ranked = sorted(
        active.items(), key=lambda item: (-item[1].priority, item[1].insertionOrder, item[0])
    )
    kept: list[tuple[int, Entry]] = []
    left: list[Entry] = []
    used = 0
    for i, e in ranked:
        cost = e.tokens + 1
        if used + cost <= budget:
            kept.append((i, e))
            used += cost
        else:
            left.append(e)
    kept.sort(key=lambda item: (item[1].insertionOrder, item[0]))
    return [e for _, e in kept], left
