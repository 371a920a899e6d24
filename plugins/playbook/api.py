"""
The playbook plugin's Python API, for games that embed the middleware:
C{middleware.plugin(IPlaybooks)} finds it.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IPlaybooks(Interface):
    playbooks = Attribute("The configured playbook of each characterId (dict).")

    def state(clientId):  # type: ignore[no-untyped-def]
        """The session's playbook and stage (a dict), or None."""

    def stop():  # type: ignore[no-untyped-def]
        """Cancel every timer: the middleware is stopping."""
