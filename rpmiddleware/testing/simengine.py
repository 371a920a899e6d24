"""
The RPEngine side of protocol v3, without any transport.

L{SimulatedEngine} reads envelopes from the game and writes full envelopes
through a callable, pacing everything with an L{IReactorTime}, so tests drive
it with a list and a L{Clock} and the WebSocket client in
L{rpmiddleware.testing.simulator} drives it with the real reactor.

It behaves as RPEngine's core does (crates/rp-engine-core/src/app.rs,
C{CoreSession}; each method below names the function it follows): the same
acknowledgements, the same errors in the same order, the same
C{capacity.update} at the same moments, the same streams.  What RPEngine's
browser host does around the core -- the microphone, the models -- is
simulated (L{rpmiddleware.testing.capture},
L{rpmiddleware.testing.replystream}), and where the host changes what a
game receives the simulator follows it too (src/app-host.ts,
src/socket-adapter.ts, src/browser-voice-capture.ts,
src/filesystem-mailbox-adapter.ts, src/app-version.ts): the version in
C{hello}, one message handled at a time, the browser's checks on a
recording, the capture it keeps after some failures, the host's
C{audio_transport_failed}.  docs/protocol-choices.md lists each rule.  It
keeps logs (what it received, sent, processed, cancelled) for assertions.

It is built in layers, one job each: L{rpmiddleware.testing.simcore} (the
session: handshake, acknowledgements, capacity, cards, the checks before a
request), L{rpmiddleware.testing.simreplies} (replies: queue, transcription,
generation), L{rpmiddleware.testing.simcapture} (the microphone), and here
what needs them all: which request a message is about, and cancelling.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger

from rpmiddleware.testing.capture import CANCELLED_MESSAGE, CaptureEvents
from rpmiddleware.testing.simcapture import Captures
from rpmiddleware.testing.simrequests import SimCapture

_log = Logger(namespace="rpmiddleware.testing.simengine")


class SimulatedEngine(Captures, CaptureEvents):
    """
    RPEngine's side of one connection at a time.

    Logs (C{sent}, C{receivedMessages}, C{processed}, C{cancelled},
    C{cancellations}, C{completed}, C{duplicates}, C{protocolErrors},
    C{cardTransfers}, C{acksReceived}) span every connection of this
    object, and so does the duplicate window, as RPEngine keeps its seen
    messageIds across reconnects; the session, its card cache and its
    requests end with the connection.

    @ivar welcomed: fires with this engine when the session is established;
        it never errbacks (nothing may be waiting for it).
    @ivar closed: fires when the connection is gone.
    @ivar transportDisconnect: set by a transport to let L{disconnect}
        drop the real connection.
    """

    # The game's requests (app.rs transport_message)

    def _request(self, kind: str, requestId: str, fields: dict[str, Any]) -> None:
        if kind == "reply.request":
            self._acceptReply(fields)
        elif kind == "voice.capture.start":
            self._acceptCapture(fields)
        elif kind == "voice.capture.stop":
            self._stopCapture(requestId)
        elif kind in ("voice.capture.cancel", "request.cancel"):
            self._cancelRequest(requestId, "requested_by_game")

    # Cancelling (app.rs cancel_request, cancel_all)

    def _cancelled(self, requestId: str, reason: str) -> None:
        self.cancellations.append((requestId, reason))
        if reason == "requested_by_game":
            self.cancelled.append(requestId)
        self._emit("reply.cancelled", requestId=requestId, reason=reason)

    def _cancelRequest(self, requestId: str, reason: str) -> None:
        capture = self._capture
        if capture is not None and capture.requestId == requestId:
            finishing = self._dropCapture()
            self._accepted.discard(requestId)
            self._cancelled(requestId, reason)
            self._publishCapacity()
            if finishing:
                self._cancelledWhileFinishing(capture)
            return
        queued = next((r for r in self._queue if r.requestId == requestId), None)
        if queued is not None:
            self._queue.remove(queued)
            self._accepted.discard(requestId)
            self._cancelled(requestId, reason)
            self._publishCapacity()
            return
        active = self._active.pop(requestId, None)
        if active is not None:
            self._stopReply(active)
            self._accepted.discard(requestId)
            self._cancelled(requestId, reason)
            self._publishCapacity()
            self._startNextReply()
            return
        self.cancellations.append((requestId, "not_active"))
        self._emit("reply.cancelled", requestId=requestId, reason="not_active")

    def _cancelledWhileFinishing(self, capture: SimCapture) -> None:
        """
        A capture cancelled after C{voice.capture.stop} but before the
        browser handed its recording over: the browser rejects the
        unfinished stop, and the host passes that on as C{captureFailed}
        right after the cancel is handled (src/browser-voice-capture.ts
        C{cancel}, src/app-host.ts C{execute} C{captureStop}).  The core,
        whose capture is already gone, still answers it with
        C{request.error request_failed} and an empty C{sourceMessageId}, and
        publishes capacity (app.rs C{capture_failed}), so the game gets
        that after its C{reply.cancelled}.
        """
        _log.info(
            "Capture {requestId} cancelled while its recording was finishing",
            requestId=capture.requestId,
        )
        self.captureFailed(capture.microphone, CANCELLED_MESSAGE)

    def _cancelAll(self, reason: str) -> None:
        """
        Cancel everything: queued, then active, then the capture, in that
        order, with no capacity update (app.rs cancel_all).
        """
        ids = [r.requestId for r in self._queue] + list(self._active)
        if self._capture is not None:
            ids.append(self._capture.requestId)
        for reply in self._active.values():
            self._stopReply(reply)
        self._dropCapture()
        self._queue.clear()
        self._active.clear()
        self._accepted.clear()
        for requestId in ids:
            self._cancelled(requestId, reason)
