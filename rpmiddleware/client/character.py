"""
The messages that set what a client's turns play: C{character} (the
Character Card V2) and C{configure} (voice, language, sample rate, prompt
fields, ...).  Both change the client's session, so they survive a
reconnect.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from rpmiddleware.cards.validation import InvalidCard, validateCard
from rpmiddleware.client import messages as wire
from rpmiddleware.client.settings import Character
from rpmiddleware.client.surface import ClientSurface
from rpmiddleware.protocol import clientfields
from rpmiddleware.protocol.clienterrors import InvalidMessage

log = Logger()


def handleCharacter(client: ClientSurface, message: dict[str, Any]) -> None:
    characterId = clientfields.identifier(message, "characterId")
    integrationId = clientfields.identifier(message, "integrationId", required=False)
    card = clientfields.obj(message, "card")
    try:
        validateCard(card)
    except InvalidCard as e:
        raise InvalidMessage(f"character.card: {e}")
    assert characterId is not None
    # Parsed for this connection alone and never changed: the hasher may
    # find its hash by identity on every turn.
    card = client.middleware.adoptCard(card)
    client.session.character = Character(characterId, integrationId, card)
    log.info(
        "client {peer} plays character {characterId}",
        peer=client.peer,
        characterId=characterId,
    )


def handleConfigure(client: ClientSurface, message: dict[str, Any]) -> None:
    config = client.session.config.updated(wire.configureChanges(message))
    config.check(client.settings, "configure")
    client.session.config = config
