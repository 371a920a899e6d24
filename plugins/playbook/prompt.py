"""
What a request is told: the current stage's prompt context and voice, the
game's scene, and the game events waiting, written onto a C{reply.request}
or C{voice.capture.start} as it passes.

RPEngine has no playbooks: it reads C{interactionMode}, C{promptScene} and
C{promptDirective} on each request, so the stage lives in those fields and
nowhere else.  RPEngine takes the three together, complete, or not at all
(C{crates/rp-engine-core/src/json_core.rs}, C{validate_prompt_context}), and
refuses a request with a partial one; so this module writes all three or
none, never a piece:

  - a stage with a prompt context (complete: checked when its playbook was
    loaded) replaces the game's three fields whole; what plugins nearer the
    game added to the request's C{sceneContext} with C{addSceneText} (noted
    in C{meta.SCENE_TEXT}) is added to the stage's, so it still reaches the
    model;
  - otherwise the game's own prompt context is kept when it is complete and
    valid (the turn's mode set on it, the scene added);
  - otherwise nothing is written.  A partial context the game sent itself is
    left as it is, for the refusal that names its field; only the lone
    C{interactionMode} with which the client endpoint marks the turns this
    plugin asked for is taken off, there being nothing to complete it with.

RPEngine puts C{sceneContext} and the guide of the turn's mode in the prompt
(C{crates/rp-engine-core/src/prompt.rs}, C{prompt_context}), so the game's
current scene goes at the end of C{sceneContext}.  With no prompt context to
carry it, the scene is told with the events, as a C{[Scene: ...]} line.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.builtin.playbook.model import Stage
from rpmiddleware.builtin.playbook.state import SessionState
from rpmiddleware.plugin import (
    PROMPT_CONTEXT_FIELDS,
    EngineRefusal,
    Envelope,
    checkPromptContext,
    meta,
)

AUTO_EVENT = "auto_event"
DIRECT_USER = "direct_user"


def modeOf(auto: bool) -> str:
    """
    The C{interactionMode} of an auto_event turn, or of the player's.
    """
    return AUTO_EVENT if auto else DIRECT_USER


def gamesOwn(envelope: Envelope, mode: str) -> dict[str, Any] | None:
    """
    The game's own prompt context on C{envelope}, copied with the turn's
    mode, if it is complete and RPEngine would take it; else C{None}.
    """
    if not all(name in envelope for name in PROMPT_CONTEXT_FIELDS):
        return None
    try:
        checkPromptContext(envelope.fields)
    except EngineRefusal:
        return None
    return {
        "interactionMode": mode,
        "promptScene": dict(envelope["promptScene"]),
        "promptDirective": dict(envelope["promptDirective"]),
    }


def promptContext(
    envelope: Envelope, stage: Stage | None, auto: bool, scene: str | None
) -> dict[str, Any] | None:
    """
    The three prompt-context fields a request gets, complete, or C{None}.
    """
    mode = modeOf(auto)
    context = stage.promptContext(mode) if stage is not None else None
    added: list[str] = []
    if context is not None:
        # The stage's replaces the request's context: what plugins nearer
        # the game added to it (addSceneText) is added again, after the scene.
        noted = envelope.meta.get(meta.SCENE_TEXT)
        added = [text for text in noted or () if isinstance(text, str) and text]
    else:
        context = gamesOwn(envelope, mode)
    if context is not None:
        directive = context["promptDirective"]
        for text in [scene, *added] if scene else added:
            directive["sceneContext"] = f"{directive['sceneContext']}\n\n{text}"
    return context


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
    context = promptContext(envelope, stage, auto, state.scene)
    if context is not None:
        for name, value in context.items():
            envelope[name] = value
    elif auto and "promptScene" not in envelope and "promptDirective" not in envelope:
        envelope.fields.pop("interactionMode", None)
    if stage is not None:
        output = envelope.get("output")
        if stage.voice and isinstance(output, dict) and isinstance(output.get("audio"), dict):
            envelope["output"] = {**output, "audio": {**output["audio"], "voice": stage.voice}}
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
    if context is None and state.scene:
        text = f"[Scene: {state.scene}]\n{text}"
    envelope["event"] = {**event, "text": text}
