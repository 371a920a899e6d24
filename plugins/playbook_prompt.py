"""
What a request is told: the current stage's prompt fields and voice, the
game's scene, and the game events waiting, written onto a C{reply.request}
or C{voice.capture.start} as it passes.

RPEngine has no playbooks: it reads C{interactionMode}, C{promptScene} and
C{promptDirective} on each request, so the stage lives in those fields and
nowhere else.  The client's own fields are kept and overlaid key by key, so a
game that sets its own scene or guide keeps it where the stage says nothing.
"""

from __future__ import annotations

from typing import Any

from plugins.playbook_state import SessionState
from rpmiddleware.envelope import Envelope


def _table(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def decorate(
    envelope: Envelope,
    state: SessionState,
    auto: bool,
    ours: bool,
    event: dict[str, Any] | None,
) -> None:
    """
    @param auto: an auto_event turn (game events, a playbook's C{say}), as
        opposed to the player's.
    @param ours: a turn the plugin asked for, whose text is the events
        themselves (so they are not told twice).
    @param event: the request's C{event}, when it has one to carry the
        waiting events (a voice capture has none: they wait for its end).
    """
    playbook = state.playbook
    stage = playbook.stage(state.stage) if playbook is not None and state.stage else None
    if stage is not None:
        envelope["interactionMode"] = "auto_event" if auto else "direct_user"
        directive = _table(envelope.get("promptDirective"))
        directive.update(stage.promptDirective)
        # RPEngine reads only the guide of the turn's mode; the other is noise.
        directive.pop("directUserGuide" if auto else "autoEventGuide", None)
        if directive:
            envelope["promptDirective"] = directive
        else:
            envelope.fields.pop("promptDirective", None)
        output = envelope.get("output")
        if stage.voice and isinstance(output, dict) and isinstance(output.get("audio"), dict):
            envelope["output"] = {**output, "audio": {**output["audio"], "voice": stage.voice}}
    if stage is not None or state.scene:
        scene = _table(envelope.get("promptScene"))
        if stage is not None:
            scene.update(stage.promptScene)
        if state.scene:
            base = scene.get("sceneContext")
            scene["sceneContext"] = f"{base}\n\n{state.scene}" if base else state.scene
        if scene:
            envelope["promptScene"] = scene
    if event is None or not (state.context or state.pending):
        return
    lines = state.takeLines()
    said = event.get("text") if isinstance(event.get("text"), str) else None
    if auto and (ours or not said):
        text = "\n".join(lines)
    elif auto:
        text = "\n".join([*lines, said or ""])
    else:
        told = "\n".join(f"[Event: {line}]" for line in lines)
        text = f"{told}\n{said}" if said else told
    envelope["event"] = {**event, "text": text}
