"""
The built-in plugins of rpmiddleware.

C{FACTORIES} lists every built-in factory; C{DEFAULT_CHAIN} is the chain a
configuration starts from (name -> priority, lower nearer the game).  This
package's path is never extended: only these modules are built-ins, whatever
folder called C{plugins} lies in the working directory.

The default order, game side first: the capacity gate holds work before the
card cache chooses a transfer, so that the transfer is chosen for the session
the request actually leaves in.
"""

from __future__ import annotations

from plugins.audio_resample import audioResample
from plugins.capacity_gate import capacityGate
from plugins.card_cache import cardCache
from plugins.envelope_log import envelopeLog
from plugins.moderation import moderation
from plugins.playbook import playbook
from rpmiddleware.interfaces import IPluginFactory

FACTORIES: list[IPluginFactory] = [
    moderation,
    audioResample,
    capacityGate,
    cardCache,
    envelopeLog,
    playbook,
]

#: Moderation nearest the game so a blocked turn takes no capacity; audio is
#: checked before it takes a place in the gate; the per-envelope log is opt-in
#: (``logging = 500`` in [chain.plugins]) because it is one line per envelope.
#: The playbook plugin sits nearest the game: it must see every request and
#: every ending of a turn, even those another plugin answers itself; it
#: changes nothing for a client with no playbook and no game events.
DEFAULT_CHAIN: dict[str, int] = {
    "playbook": 50,
    "moderation": 100,
    "audio-resample": 200,
    "capacity-gate": 300,
    "card-cache": 400,
}
