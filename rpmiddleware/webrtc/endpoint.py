"""
WebRTC for the client endpoint: the hook the endpoint's C{offer} calls.

One L{WebRTCEndpoint} per client endpoint.  It imports nothing of aiortc
until an offer arrives, so the endpoint runs the same without the extra,
answering C{offer} with C{error} WEBRTC_UNAVAILABLE and the reason (the
extra is missing, WebRTC is disabled, or the reactor is not asyncio).

With WebRTC available, each client connection gets one
L{rpmiddleware.webrtc.voice.VoiceLink} at its first offer; the endpoint
keeps them so that shutting the daemon down closes every peer connection
(a before-shutdown trigger, in place only while peers exist).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger

from rpmiddleware.config.settings import Settings
from rpmiddleware.webrtc.reactor import availability

WEBRTC_UNAVAILABLE = "WEBRTC_UNAVAILABLE"


class WebRTCEndpoint:
    log = Logger()

    def __init__(self, reactor: Any, settings: Settings) -> None:
        self.reactor = reactor
        self.settings = settings.webrtc
        #: The interface the listener is on; peers gather on its loopback address.
        self.interface = settings.server.interface
        self.links: set[Any] = set()
        self._trigger: Any = None

    def unavailable(self) -> str | None:
        """
        C{None} when offers can be answered; otherwise why not.
        """
        if not self.settings.enabled:
            return "WebRTC is disabled on this server (webrtc.enabled = false)"
        return availability(self.reactor)

    def offer(self, connection: Any, message: dict[str, Any]) -> Deferred[None] | None:
        """
        A client's C{offer}: answered with C{signal} (or C{error}) on its
        WebSocket.  The Deferred fires once the answer is sent, so the
        connection reads its next message only after that.
        """
        reason = self.unavailable()
        if reason is not None:
            connection.send(
                {
                    "type": "error",
                    "code": WEBRTC_UNAVAILABLE,
                    "message": f"{reason}. Send recordings in audio messages over this WebSocket.",
                    "retryable": False,
                }
            )
            return None
        link = getattr(connection, "voice", None)
        if link is None or link.closed:
            from rpmiddleware.webrtc.voice import VoiceLink

            link = VoiceLink(self, connection)
            connection.voice = link
            self._added(link)
        d: Deferred[None] = link.offer(message.get("signal"))
        return d

    # Every link, for shutdown.

    def _added(self, link: Any) -> None:
        self.links.add(link)
        if self._trigger is None:
            self._trigger = self.reactor.addSystemEventTrigger("before", "shutdown", self.closeAll)

    def removed(self, link: Any) -> None:
        self.links.discard(link)
        if not self.links and self._trigger is not None:
            trigger, self._trigger = self._trigger, None
            self.reactor.removeSystemEventTrigger(trigger)

    def closeAll(self) -> Deferred[Any]:
        """
        Close every peer connection (shutdown); fires when all are closed.
        """
        links = list(self.links)
        if links:
            self.log.info("closing {count} WebRTC peer connection(s)", count=len(links))
        return DeferredList([link.close("the server is shutting down") for link in links])
