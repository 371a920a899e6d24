"""
The kinds of speech marks a request asked for, read from its meta.

The client endpoint checks what a game asked for
(C{rpmiddleware.plugin.speechmarks.markKinds}) and puts the kinds on the
request's meta; a Python API caller puts them there itself.  Only
C{"sentence"} marks come from the sample counts alone; C{"word"} and
C{"viseme"} marks need the alignment's thread pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rpmiddleware.plugin import speechmarks

SENTENCE, WORD, VISEME = speechmarks.MARK_KINDS
#: The kinds that need the sentence's audio aligned (a worker thread).
ALIGNED = frozenset({WORD, VISEME})


def requested(meta: Mapping[str, Any]) -> frozenset[str]:
    """
    The kinds in C{meta} (L{speechmarks.META}); unknown ones are ignored
    (the client endpoint refuses them, a Python API caller is trusted).
    """
    value = meta.get(speechmarks.META)
    if not value or isinstance(value, str) or not isinstance(value, Iterable):
        return frozenset()
    return frozenset(kind for kind in value if kind in speechmarks.MARK_KINDS)


__all__ = ["ALIGNED", "SENTENCE", "VISEME", "WORD", "requested"]
