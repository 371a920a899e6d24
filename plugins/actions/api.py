"""
The actions plugin's Python API, for games that embed the middleware:
C{middleware.plugin(IActions)} finds it.

Actions are declared per client session (C{meta["client"]} of the requests;
C{"api"} for the Python API's own).  A call reaches an in-process game as an
C{x-client.send} envelope for client C{"api"} (router observers see it, its
C{message} the C{tool-call-start}); the game answers with L{IActions.answer}.
"""

from __future__ import annotations

from zope.interface import Interface


class IActions(Interface):
    def declare(declarations, client="api"):  # type: ignore[no-untyped-def]
        """
        Replace C{client}'s actions: a list of C{{name, description,
        parameters (JSON Schema), characters?, stages?}}; [] clears them.
        Returns them as declared; raises ActionError naming the field.
        """

    def answer(callId, result=None, error=None, client="api"):  # type: ignore[no-untyped-def]
        """End a running call with its result or error; whether it was running."""
