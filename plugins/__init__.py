"""
The built-in plugins of rpmiddleware: C{rpmiddleware.builtin}.

This folder is the repository's top-level C{plugins/}; it is shipped and
imported as C{rpmiddleware.builtin} (setup.cfg's C{package_dir} in a wheel,
L{rpmiddleware.runtime.sourcelayout} in a checkout), never as a top-level
C{plugins} package, so a folder or package of that name elsewhere, in the
working directory or in site-packages, is never ours and changes nothing.

C{FACTORIES} lists every built-in factory; C{DEFAULT_CHAIN} is the chain a
configuration starts from (name -> priority, lower nearer the game).  This
package's path is never extended: only these modules are built-ins.

The default order, game side first: the capacity gate holds work before the
card cache chooses a transfer, so that the transfer is chosen for the session
the request actually leaves in.
"""

from __future__ import annotations

from rpmiddleware.builtin import (
    actions,
    audio_resample,
    capacity_gate,
    card_cache,
    envelope_log,
    memory,
    moderation,
    playbook,
    scene,
)
from rpmiddleware.builtin.animation import feelings as animation_feelings
from rpmiddleware.builtin.animation import marks as speech_marks
from rpmiddleware.plugin import IPluginFactory

# The factories are reached through their modules, so that each name here
# stays the module (``import rpmiddleware.builtin.playbook.tools as t`` works).
FACTORIES: list[IPluginFactory] = [
    moderation.moderation,
    audio_resample.audioResample,
    capacity_gate.capacityGate,
    card_cache.cardCache,
    envelope_log.envelopeLog,
    playbook.playbook,
    memory.memory,
    scene.scene,
    actions.actions,
    speech_marks.speechMarks,
    animation_feelings.feelings,
]

#: Moderation nearest the game so a blocked turn takes no capacity; audio is
#: checked before it takes a place in the gate; the per-envelope log is opt-in
#: (``logging = 500`` in [chain.plugins]) because it is one line per envelope.
#: The playbook plugin sits nearest the game: it must see every request and
#: every ending of a turn, even those another plugin answers itself; it
#: changes nothing for a client with no playbook and no game events.  Memory
#: comes next: it plans with the prompt fields the playbook set, and records
#: replies after moderation has masked them, as the client gets them.  Scene
#: and actions sit between them: a scene gives a request to its character
#: after the playbook set the stage, actions are offered to that character,
#: and memory then plans with all of it and hears what both tell it.
#: Feelings sits between memory and moderation: it reads the text as the
#: client gets it (masked), and writes the mood on the reply before memory
#: keeps it; it does nothing for a client that asks for no feelings.
#: Speech marks sit between audio-resample and the capacity gate: they align
#: RPEngine's own 44.1 kHz speech, whatever rate each client asked for, and
#: count each segment at the client's rate as audio-resample converts it; a
#: request that asked for no marks costs a dict lookup, and no thread starts.
DEFAULT_CHAIN: dict[str, int] = {
    "playbook": 50,
    "scene": 60,
    "actions": 70,
    "memory": 80,
    "feelings": 90,
    "moderation": 100,
    "audio-resample": 200,
    "speech-marks": 250,
    "capacity-gate": 300,
    "card-cache": 400,
}
