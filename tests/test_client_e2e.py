"""
Turns end to end: a client over the middleware's WebSocket, the plugin chain
(capacity gate, audio resampling, card cache), and the simulated RPEngine.
They run in memory on a clock (L{rpmiddleware.testing.memorynet}: the real
site, upgrade and framing, no socket); L{SlowClientTests}, which is about
the kernel's socket buffers and a peer that stops reading, runs on real
loopback sockets.  The other suites are in tests/support/clientsuites.py;
tests/test_mailbox_e2e.py runs them again over real sockets with RPEngine
behind the mailbox.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import deferLater

from rpmiddleware.testing.memorynet import runOnNetwork
from rpmiddleware.testing.simmailbox import spokenChunks
from rpmiddleware.testing.simoptions import defaultReplyText
from tests.support import clientsuites as suites
from tests.support.client import (
    OnRealSockets,
    requestsOf,
    types,
    whenLogged,
    whenRouted,
)
from tests.support.clientsuites import TurnCase


class VoiceAndTextTurnTests(suites.VoiceAndTextTurns):
    """
    Typed and recorded turns over the WebSocket (L{suites.VoiceAndTextTurns}).
    """


class InterruptionTests(suites.Interruptions):
    """
    Barge-in and cancel over the WebSocket (L{suites.Interruptions}).
    """


class VoiceCaptureTests(suites.VoiceCapture):
    """
    RPEngine's microphone over the WebSocket (L{suites.VoiceCapture}).
    """


class SharingTests(suites.Sharing):
    """
    Clients sharing one RPEngine over the WebSocket (L{suites.Sharing}).
    """


class SlowClientTests(OnRealSockets, TurnCase):
    """
    A client that stops reading: its audio stops and its turn is cancelled
    upstream; it is closed if it stays that way; others are not slowed.
    """

    def configure(self, settings: Any, client: Any) -> None:
        client.send_buffer_soft = 64 * 1024
        client.slow_client_grace = 30.0

    def slowReply(self, request: dict[str, Any]) -> str:
        event = request.get("event") or {}
        if "slowly" in str(event.get("text", "")):
            return "Listen closely to every word of this. " * 20
        return defaultReplyText(request)

    @inlineCallbacks
    def stopReading(self, client: Any, tiny: bool = False) -> Any:
        """
        The client stops reading; a small kernel send buffer on the server's
        side makes the backlog reach the transport sooner, and a tiny receive
        buffer on the client's (C{tiny}) keeps it there.  (Only for a client
        that never reads again: a window smaller than loopback's MSS stalls
        the stream on zero-window probes once it does.)
        """
        [server] = [
            p for p in self.factory.connections if p.connection.session.id == client.ready["id"]
        ]
        server.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        peer = client.factory.peer
        if tiny:
            peer.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        peer.transport.pauseProducing()
        yield None
        return server

    def readAgain(self, client: Any, server: Any) -> None:
        server.transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        client.factory.peer.transport.resumeProducing()

    @runOnNetwork
    def test_congestedTurnCancelled(self) -> Any:
        engine = yield self.engine(replyText=self.slowReply)
        slow = yield self.client()
        server = yield self.stopReading(slow)
        congested = whenLogged(self, lambda e: "is not reading" in e.get("log_format", ""))
        slow.send({"type": "text", "text": "Speak slowly"})
        yield congested
        [request] = requestsOf(engine)
        turnId = request["requestId"]
        yield whenRouted(self.middleware, "reply.cancelled", turnId)
        self.assertIn(turnId, engine.cancelled)
        # Nothing like the whole reply was queued for it.
        self.assertLess(server.connection.guard.peak, 1024 * 1024)
        # Another client is served meanwhile.
        other = yield self.client()
        other.send({"type": "text", "text": "Hello"})
        messages = yield self.turn(other)
        self.assertStreamedTurn(messages)
        # Once it reads again, it finds its turn cut short, and told why.
        self.readAgain(slow, server)
        messages = yield self.turn(slow)
        self.assertEqual(messages[-1]["type"], "tts-cancelled")
        self.assertEqual(
            messages[-1]["reason"], "the client is not reading its messages fast enough"
        )
        spoken = len(spokenChunks(engine, requestId=turnId))
        self.assertLess(types(messages).count("tts-chunk"), spoken)
        self.assertFalse(slow.closed.called)

    @runOnNetwork
    def test_bigWavIsNotSlowness(self) -> Any:
        """
        A non-streaming reply's WAV, one message far over the soft bound,
        reaches a client that reads, with nothing cancelled.
        """
        engine = yield self.engine(replyText=self.slowReply)
        client = yield self.client()
        client.send({"type": "configure", "output": {"streaming": False}})
        client.send({"type": "text", "text": "Speak slowly"})
        messages = yield self.turn(client)
        self.assertEqual(types(messages)[-3:], ["tts", "tts-complete", "reply-complete"])
        self.assertGreater(len(messages[-3]["data"]), 10 * self.clientSettings.send_buffer_soft)
        self.assertEqual(engine.cancelled, [])

    @runOnNetwork
    def test_closedWhenItStaysSlow(self) -> Any:
        """
        Still not reading after the grace period: closed with 1008 and a
        reason (which a client that does not read never sees; the frame is
        checked on the server's side).
        """
        self.clientSettings.slow_client_grace = 0.05
        yield self.engine(replyText=self.slowReply)
        slow = yield self.client()
        server = yield self.stopReading(slow, tiny=True)
        closing = whenLogged(self, lambda e: "closing slow client" in e.get("log_format", ""))
        slow.send({"type": "text", "text": "Speak slowly"})
        event = yield closing
        yield deferLater(self.reactor, 0, lambda: None)  # let the close frame be written
        self.assertIn("has not read its messages for 0.05 s", event["why"])
        self.assertEqual(server.state, server.STATE_CLOSING)
        self.assertEqual(server.localCloseCode, 1008)
        self.assertEqual(server.localCloseReason, b"client too slow: it does not read its messages")
        self.assertTrue(server.connection.closing)
        # The others go on.
        other = yield self.client()
        other.send({"type": "text", "text": "Hello"})
        messages = yield self.turn(other)
        self.assertStreamedTurn(messages)

    @runOnNetwork
    def test_closeReachesAClientThatReadsLate(self) -> Any:
        """
        Over the hard bound a client is closed at once; reading again, it
        finds the 1008 close and its reason.
        """
        self.clientSettings.send_buffer_hard = 80 * 1024
        self.clientSettings.send_buffer_soft = 80 * 1024
        yield self.engine(replyText=self.slowReply)
        slow = yield self.client()
        server = yield self.stopReading(slow)
        closing = whenLogged(self, lambda e: "closing slow client" in e.get("log_format", ""))
        slow.send({"type": "text", "text": "Speak slowly"})
        event = yield closing
        self.assertIn("(limit 81920)", event["why"])
        self.readAgain(slow, server)
        code, reason = yield slow.closed
        self.assertEqual(code, 1008)
        self.assertEqual(reason, "client too slow: it does not read its messages")
