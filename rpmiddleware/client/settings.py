"""
The client endpoint's settings, and the default character it serves.

The settings themselves are the C{[client]} section of the configuration
(L{rpmiddleware.config.settings.ClientSettings}, re-exported here); this module adds
the default character they point at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rpmiddleware.cards.validation import InvalidCard, validateCard
from rpmiddleware.config.settings import (
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    ClientSettings,
    ConfigError,
    Settings,
)


@dataclass(frozen=True)
class Character:
    """
    The character a client plays: who, for which integration, and the card.
    """

    characterId: str
    integrationId: str | None
    card: dict[str, Any]


def loadDefaultCharacter(settings: Settings) -> Character | None:
    """
    The character named by C{game.default_character} (a Character Card V2
    JSON file) and C{game.default_character_id}, or C{None} when unset.

    Read once at start-up so that a broken file stops the daemon with a
    sentence, not the first client's turn.

    @raise ConfigError: when the file cannot be read or is not a valid card.
    """
    game = settings.game
    if not game.default_character:
        return None
    path = settings.relativePath(game.default_character)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(
            f"{settings.source}: game.default_character {str(path)!r} cannot be read: "
            f"{e.strerror or e}"
        )
    except ValueError as e:
        raise ConfigError(
            f"{settings.source}: game.default_character {str(path)!r} is not valid JSON: {e}"
        )
    try:
        validateCard(document)
    except InvalidCard as e:
        raise ConfigError(f"{settings.source}: game.default_character {str(path)!r}: {e}")
    if not game.default_character_id:
        raise ConfigError(f"{settings.source}: game.default_character_id must not be empty")
    return Character(game.default_character_id, game.integration_id or None, document)


__all__ = [
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "Character",
    "ClientSettings",
    "loadDefaultCharacter",
]
