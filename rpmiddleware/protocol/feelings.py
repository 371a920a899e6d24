"""
What a character feels while it speaks: the one set of feelings clients are
told, and where a game may ask them to come from.

The set is Paul Ekman's six basic emotions plus C{neutral}.  Each has a
face that reads the same across cultures (Ekman's studies, and the Facial
Action Coding System built on them), so a face rig, a blend-shape set or a
pose library has one clear target for each; it is the set game animation
tools and speech services already use (Azure's and Unity's facial presets,
Inworld's emotions map onto it), and small enough that a model told to name
one picks it reliably.  The client protocol (C{configure.feelings}) and the
feelings plugin both read these names here.
"""

from __future__ import annotations

#: The feelings, C{neutral} first (what a line with no cue gets).
FEELINGS: tuple[str, ...] = ("neutral", "joy", "sadness", "anger", "fear", "disgust", "surprise")

#: Where a game may ask a line's feelings to come from (C{configure.feelings},
#: a turn's C{options.feelings}): C{"text"}, read from each sentence as it
#: streams; C{"model"}, written by the model and taken out of the reply by
#: RPEngine's response processing; C{"off"}, none.
FEELING_SOURCES: tuple[str, ...] = ("text", "model", "off")

#: The envelope type that carries one sentence's feeling toward the game
#: (C{requestId}, C{speaker}, C{feeling}, C{intensity?}, C{start}, C{end},
#: C{sentence}, C{source}, C{mood}); the client's turn writes it as the
#: C{feeling} message (L{CLIENT_TYPE}) with the turn's id, unless the turn was
#: cancelled.  The engine end never sees one.
FEELING_ENVELOPE = "x-feelings.feeling"
#: The client message.
CLIENT_TYPE = "feeling"
#: The fields of a feeling the client is told, beside C{type} and C{turnId}.
FEELING_FIELDS = ("speaker", "feeling", "intensity", "start", "end", "sentence", "source", "mood")

__all__ = ["CLIENT_TYPE", "FEELINGS", "FEELING_ENVELOPE", "FEELING_FIELDS", "FEELING_SOURCES"]
