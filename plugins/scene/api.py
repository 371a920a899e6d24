"""
The scene plugin's Python API, for games that embed the middleware:
C{middleware.plugin(IScenes)} finds it.

Scenes are kept per client session (C{meta["client"]} of the requests; the
Python API's requests are C{"api"} unless they name another), one at a
time: every request of that client is then a player's line in the scene.
"""

from __future__ import annotations

from zope.interface import Interface


class IScenes(Interface):
    def openScene(description, client="api"):  # type: ignore[no-untyped-def]
        """
        Open (or replace) C{client}'s scene: C{description} as the client's
        C{scene open} message (sceneId, cast, context, director, reactions).
        Returns the scene's description; raises SceneError naming the field.
        """

    def join(member, client="api"):  # type: ignore[no-untyped-def]
        """A character (characterId, card, voice, hears) joins the running scene."""

    def leave(characterId, client="api"):  # type: ignore[no-untyped-def]
        """A character leaves the running scene; a line it is saying still ends."""

    def address(characterId, client="api"):  # type: ignore[no-untyped-def]
        """The client's next player line is for C{characterId}."""

    def closeScene(client="api"):  # type: ignore[no-untyped-def]
        """Close the scene; whether there was one."""

    def scene(client="api"):  # type: ignore[no-untyped-def]
        """The client's scene (description dict), or None."""
