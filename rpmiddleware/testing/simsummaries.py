"""
Summaries as lossy as a small model's, for the simulated RPEngine.

The memory plugin asks RPEngine to condense what no longer fits; a model of a
few billion parameters keeps little of it.  With
C{SimulatorOptions(summaryDetails=N)} the simulator answers such a request
with the newest C{N} details only: the sentences that match
C{SimulatorOptions.detailPattern}, taken from the summary so far and the
lines to fold in, newest last; everything else is dropped.  That is the
worst case recall has to make up for (issue 33): a detail told long ago is
in the store, word for word, and nowhere in the summary.

A summary request is known by its event text, as the memory plugin writes
it (C{The summary so far of the conversation between ...}, then C{What was
said since:}); the simulator does not import the plugin.
"""

from __future__ import annotations

import re
from typing import Any

#: How the memory plugin's summary request opens and where its new lines begin.
SUMMARY_OPENING = "The summary so far of the conversation between "
SINCE = "\n\nWhat was said since:\n"
#: The default details: sentences that say "remember this" (the bench's and
#: the tests' way of marking what a player wants kept).
DETAIL_PATTERN = r"(?i)\bremember this\b"
#: What a lossy summary says besides its details.
FILLER = "They talked at length."

_SENTENCE = re.compile(r"[^.!?]+[.!?]*")
#: A line to fold in is "Speaker: words".
_SPEAKER = re.compile(r"^[^:\n]{1,80}: ")


def isSummaryRequest(request: dict[str, Any]) -> bool:
    event = request.get("event")
    text = event.get("text") if isinstance(event, dict) else None
    return isinstance(text, str) and text.startswith(SUMMARY_OPENING) and SINCE in text


def lossySummary(request: dict[str, Any], keep: int, pattern: str = DETAIL_PATTERN) -> str:
    """
    The summary a small model would write for a summary C{request}: the
    newest C{keep} sentences matching C{pattern} of the summary so far and
    the lines to fold in (each once), after L{FILLER}.
    """
    text = request["event"]["text"]
    head, since = text.split(SINCE, 1)
    old = head.split(":\n", 1)[1] if ":\n" in head else ""
    new = since.rsplit("\n\n", 1)[0]
    detail = re.compile(pattern)
    found: list[str] = []
    lines = [old, *(_SPEAKER.sub("", line, count=1) for line in new.split("\n"))]
    for line in lines:
        for sentence in _SENTENCE.findall(line):
            sentence = " ".join(sentence.split())
            marked = detail.search(sentence)
            # Counted once from its mark on: a reply quoting it ("You said
            # "Remember this: ...") is the same detail.
            if marked and sentence[marked.start() :] not in found:
                found.append(sentence[marked.start() :])
    kept = found[-keep:] if keep else []
    return " ".join([FILLER, *kept])
