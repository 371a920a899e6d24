"""
L{rpmiddleware.core.inorder}: the game's envelopes reach the chain in the order
it gave them, whenever each becomes ready.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rpmiddleware.config.settings import Settings
from rpmiddleware.core.inorder import InOrder
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.replystream import ReplyCancelled
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.base import ChainPlugin
from rpmiddleware.plugin.interfaces import IEnvelopePlugin
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import HeldHasher, exampleCard


def envelope(requestId: str) -> Envelope:
    return Envelope.build("request.cancel", requestId=requestId)


class InOrderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent: list[str | None] = []

        def send(e: Envelope) -> Deferred[None]:
            self.sent.append(e.requestId)
            return succeed(None)

        self.inOrder = InOrder(send)

    def test_readyGoesAtOnce(self) -> None:
        self.successResultOf(self.inOrder.submit(succeed(envelope("a"))))
        self.assertEqual(self.sent, ["a"])
        self.assertEqual(len(self.inOrder), 0)

    def test_laterWaitsForEarlier(self) -> None:
        first: Deferred[Envelope] = Deferred()
        d1 = self.inOrder.submit(first)
        d2 = self.inOrder.submit(succeed(envelope("b")))
        self.assertEqual(self.sent, [])
        self.assertNoResult(d2)
        first.callback(envelope("a"))
        self.assertEqual(self.sent, ["a", "b"])
        self.successResultOf(d1)
        self.successResultOf(d2)

    def test_failureHoldsNothingUp(self) -> None:
        first: Deferred[Envelope] = Deferred()
        d1 = self.inOrder.submit(first)
        d2 = self.inOrder.submit(succeed(envelope("b")))
        first.errback(ValueError("no hash"))
        self.failureResultOf(d1, ValueError)
        self.successResultOf(d2)
        self.assertEqual(self.sent, ["b"])
        self.failureResultOf(self.inOrder.submit(fail(ValueError("again"))), ValueError)
        self.assertEqual(len(self.inOrder), 0)


@implementer(IEnvelopePlugin)
class Recorder(ChainPlugin):
    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    def envelopeToEngine(self, envelope: Envelope, context: Any) -> Envelope:
        self.seen.append((envelope.type, envelope.requestId))
        return envelope


class MiddlewareOrderTests(SynchronousTestCase):
    def test_cancelDoesNotOvertakeItsRequest(self) -> None:
        """
        A request whose card is still being hashed goes out before the
        cancel given after it, and before a later request.
        """
        hasher = HeldHasher()
        clock = Clock()
        recorder = Recorder()
        middleware = Middleware(
            clock, Settings(), [recorder], PluginServices(clock, Settings(), hasher, Timeline())
        )
        stream = middleware.requestReply("mira", text="one", card=exampleCard())
        stream.cancel()
        later = middleware.requestReply("mira", text="two", card=exampleCard(name="Bram"))
        self.assertEqual(recorder.seen, [])
        hasher.release()
        self.assertEqual(
            recorder.seen,
            [("reply.request", stream.requestId), ("request.cancel", stream.requestId)],
        )
        hasher.release()
        self.assertEqual(recorder.seen[-1], ("reply.request", later.requestId))
        self.failureResultOf(stream.done, ReplyCancelled)
