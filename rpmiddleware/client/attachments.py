"""
Vision attachments, for an RPEngine that takes no images.

RPEngine protocol v3 has no field for an image, so what can be passed is
passed and the rest is said: each attachment's alt text goes with the
client's next turn as context in C{event.text}; the image itself (its data URI
or URL) never leaves the middleware, and the client is told so in an
C{attachments-ack}.

Attachments come in an C{attachments} message (for the next turn) or inside
an C{audio} message (for that turn).
"""

from __future__ import annotations

from typing import Any

from rpmiddleware.client import messages as wire
from rpmiddleware.client.messages import Attachment
from rpmiddleware.client.surface import ClientSurface


def keepPending(
    pending: list[Attachment], attached: list[Attachment], limit: int
) -> tuple[list[Attachment], int]:
    """
    Add C{attached} to the attachments waiting for the next turn, keeping
    the newest C{limit}.

    @return: what is kept, and how many older ones were dropped.
    """
    kept = pending + attached
    dropped = max(0, len(kept) - limit)
    return kept[dropped:], dropped


def acknowledgement(
    attached: list[Attachment], dropped: int, limit: int, when: str
) -> dict[str, Any]:
    """
    The C{attachments-ack} telling the client what of C{attached} reaches
    RPEngine (C{when}: "this turn" or "your next turn").
    """
    withAlt = sum(1 for a in attached if a.usableAlt)
    notes = [
        "RPEngine takes no images, so the images themselves are not sent.",
        f"The alt text of {withAlt} of {len(attached)} goes with {when} as context."
        if withAlt
        else "None of them has alt text, so nothing of them reaches the character.",
    ]
    if dropped:
        notes.append(f"{dropped} older attachment(s) beyond {limit} were dropped.")
    return {
        "type": "attachments-ack",
        "received": len(attached),
        "altTextKept": withAlt,
        "imagesDropped": len(attached),
        "olderDropped": dropped,
        "message": " ".join(notes),
    }


def contextText(attachments: list[Attachment]) -> str | None:
    """
    The C{event.text} context standing for the attachments: one line per
    image that has alt text, or C{None}.
    """
    alts = [a.usableAlt for a in attachments if a.usableAlt]
    if not alts:
        return None
    return "\n".join(f"[The player shows an image: {alt}]" for alt in alts)


def keepAttachments(client: ClientSurface, attached: list[Attachment], when: str) -> None:
    """
    Keep attachments for the client's next turn, and tell the client what
    of them can reach RPEngine (alt text only: v3 takes no images).
    """
    settings = client.settings
    kept, dropped = keepPending(client.session.attachments, attached, settings.max_attachments)
    client.session.attachments = kept
    client.send(acknowledgement(attached, dropped, settings.max_attachments, when))


def attachmentContext(client: ClientSurface) -> str | None:
    """
    The context standing for the attachments waiting for this turn, which
    are taken.
    """
    return contextText(client.session.takeAttachments())


def handleAttachments(client: ClientSurface, message: dict[str, Any]) -> None:
    keepAttachments(client, wire.attachments(message, required=True), "your next turn")
