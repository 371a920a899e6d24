"""
The C{envelope.meta} keys more than one part reads: what one plugin tells the
plugins after it, and the ends, about an envelope.  C{meta} never reaches the
wire.  A plugin's own keys stay in that plugin (the memory plugin's C{said},
the playbook's C{playbookTurn}).
"""

from __future__ import annotations

#: The client session that asked (C{"api"} for the Python API's requests).
CLIENT = "client"
#: The plugin that originated the envelope (set by C{context.sendToEngine}
#: and C{sendToGame}).
ORIGIN = "origin"
#: The playbook stage a request plays in (the playbook writes it; the actions
#: plugin offers actions by it).
STAGE = "stage"
#: On a plugin's own request: the game's request it belongs to (a scene's
#: reaction belongs to the player's turn), where the console shows it.
TURN = "turn"
#: On a reply's envelopes: the character speaking this line, C{{characterId,
#: name, voice?}} (a scene's lines); the client's turn tags its messages
#: with it.
SPEAKER = "speaker"
#: On a client's message no plugin could take: why, for the error the
#: client gets at the engine end (a C{tool-result} nobody waits for).
UNCLAIMED = "unclaimed"
#: On a request: the texts plugins added to its C{promptDirective.sceneContext}
#: with C{addSceneText}, in order, so that a playbook stage applied further
#: from the game (which replaces the request's prompt context) adds them again.
SCENE_TEXT = "sceneText"
#: On a request's cancel (C{request.cancel}, C{voice.capture.cancel}): how
#: much of the reply's speech the player was played before it was cut,
#: C{{samples, sampleRate}} counted from the first sample of its speech.
#: The client endpoint sets it (from the client's C{played}, or the WebRTC
#: speech track's playout); the memory plugin remembers the reply as far as
#: that speech said it.  Absent when nobody knows.  In a turn of several
#: lines (a scene's) it may say which line was playing, C{line} (its place
#: among the turn's lines whose speech passed toward the client, from 0),
#: and then counts from that line's first sample; the scene plugin carries it
#: to that line's own request (L{PLAYED_LINE}).
PLAYED = "played"
#: The key of L{PLAYED} that names the line of a turn that was playing.
PLAYED_LINE = "line"
#: On a request: where its reply's feelings come from, one of
#: L{rpmiddleware.protocol.feelings.FEELING_SOURCES} (the client's
#: C{configure.feelings}, or a turn's C{options.feelings}); absent, the
#: feelings plugin's own default.
FEELINGS = "feelings"
#: The character's mood in a conversation, C{{feeling, intensity}}: on a
#: reply's C{reply.text.completed} the feelings plugin writes the mood the
#: line leaves (for the memory plugin to keep with the conversation); on a
#: request, what was kept, given back (the feelings plugin starts from it).
MOOD = "mood"
#: On the first C{reply.audio.chunk} of a speech segment that came through
#: RPEngine's file mailbox: the text the segment speaks (its audio slot's
#: C{spokenText}, expression tags kept); the WebSocket never says it.  The
#: speech-marks plugin matches the segment by it.
SPOKEN_TEXT = "spokenText"

__all__ = [
    "CLIENT",
    "FEELINGS",
    "MOOD",
    "ORIGIN",
    "PLAYED",
    "PLAYED_LINE",
    "SCENE_TEXT",
    "SPEAKER",
    "SPOKEN_TEXT",
    "STAGE",
    "TURN",
    "UNCLAIMED",
]
