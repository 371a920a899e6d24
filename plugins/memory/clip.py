"""
Prompt text cut to a budget: what the planner's summary and facts and
recall's moments share.
"""

from __future__ import annotations


def clip(text: str, tokens: int) -> str:
    """C{text} cut to about C{tokens} tokens, at a word where it can."""
    limit = tokens * 4
    if len(text) <= limit:
        return text
    cut = text[: max(0, limit - 1)]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut) + "…"
