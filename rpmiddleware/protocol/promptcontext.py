"""
Adding text to what RPEngine tells its model about the scene, keeping the
request's prompt context whole.

RPEngine reads C{interactionMode}, C{promptScene} and C{promptDirective}
together or not at all (C{crates/rp-engine-core/src/json_core.rs},
C{validate_prompt_context}) and puts C{promptDirective.sceneContext} and the
guide of the turn's mode in the system prompt as mandatory blocks
(C{prompt.rs}, C{prompt_context}).  So a plugin with something every reply
must know (who else is in a scene, which actions a character may take)
appends it to C{sceneContext} when the request has a complete context (a
playbook stage's, the game's own), makes a complete one when it has none, and
leaves a partial one alone for RPEngine's refusal to name.

Given the request's envelope (rather than its fields), it also notes the text
in C{envelope.meta} (L{meta.SCENE_TEXT}): a playbook stage, applied by the
playbook plugin further from the game, replaces the request's prompt context
whole, and adds the noted texts to its own, so a plugin nearer the game than
the playbook still reaches the model.
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.meta import SCENE_TEXT
from rpmiddleware.protocol.rules import PROMPT_CONTEXT_FIELDS, EngineRefusal, checkPromptContext

AUTO_EVENT = "auto_event"
DIRECT_USER = "direct_user"

#: The guides of a context made here (RPEngine renders C{{{user}}}).
AUTO_EVENT_GUIDE = "React in character to what just happened, briefly."
DIRECT_USER_GUIDE = "Answer {{user}} in character."


def addSceneText(
    request: Envelope | dict[str, Any],
    text: str,
    label: str = "scene",
    mode: str | None = None,
) -> bool:
    """
    Append C{text} to the request's C{promptDirective.sceneContext}, making
    a complete prompt context when the request has none; C{mode} sets its
    C{interactionMode}.  The request's dicts are replaced, never changed in
    place (another request may share them).

    @param request: the request's envelope, or its fields.  Given the
        envelope, the text added is also noted in its C{meta}
        (L{SCENE_TEXT}), where a playbook stage applied later finds it.

    @return: whether the text was added (not, for a partial or invalid
        context the game sent, which RPEngine will refuse by name).
    """
    if isinstance(request, Envelope):
        added = addSceneText(request.fields, text, label, mode)
        if added:
            request.meta[SCENE_TEXT] = [*request.meta.get(SCENE_TEXT, ()), text]
        return added
    fields = request
    present = [name for name in PROMPT_CONTEXT_FIELDS if name in fields]
    if not present:
        fields["interactionMode"] = mode or DIRECT_USER
        fields["promptScene"] = {
            "kind": "conversation",
            "family": "rpmiddleware",
            "label": label,
            "sceneLine": label,
            "priority": 0,
        }
        fields["promptDirective"] = {
            "protocolVersion": 1,
            "sceneContext": text,
            "autoEventGuide": AUTO_EVENT_GUIDE,
            "directUserGuide": DIRECT_USER_GUIDE,
        }
        return True
    try:
        checkPromptContext(fields)
    except EngineRefusal:
        return False
    directive = dict(fields["promptDirective"])
    directive["sceneContext"] = f"{directive['sceneContext']}\n\n{text}"
    fields["promptDirective"] = directive
    if mode is not None:
        fields["interactionMode"] = mode
    return True


__all__ = ["AUTO_EVENT", "DIRECT_USER", "addSceneText"]
