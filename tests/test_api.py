"""
The Python API: reply streams, characters, and what the middleware lends plugins.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from rpmiddleware.api import ReplyCancelled, ReplyFailed, ReplyStream
from rpmiddleware.cards import InvalidCard, canonicalHash
from rpmiddleware.envelope import Envelope
from rpmiddleware.interfaces import IPluginServices, IReplyStream
from rpmiddleware.middleware import Middleware
from rpmiddleware.testing.kit import exampleCard


class ReplyStreamTests(SynchronousTestCase):
    def stream(self) -> tuple[ReplyStream, list[str]]:
        cancelled: list[str] = []
        return ReplyStream("r1", lambda s: cancelled.append(s.requestId)), cancelled

    def test_verify(self) -> None:
        self.assertTrue(verifyObject(IReplyStream, self.stream()[0]))

    def test_completed(self) -> None:
        stream, _ = self.stream()
        seen: list[str] = []
        stream.received(Envelope.build("reply.accepted", requestId="r1"))
        stream.subscribe(lambda e: seen.append(e.type))
        stream.received(Envelope.build("reply.text.delta", requestId="r1", sequence=0, text="Hi "))
        stream.received(
            Envelope.build("reply.text.delta", requestId="r1", sequence=1, text="there")
        )
        stream.received(Envelope.build("reply.completed", requestId="r1"))
        self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        self.assertEqual(
            seen, ["reply.accepted", "reply.text.delta", "reply.text.delta", "reply.completed"]
        )
        self.assertEqual(stream.text(), "Hi there")
        stream.received(Envelope.build("reply.text.delta", requestId="r1", sequence=2, text="x"))
        self.assertEqual(len(stream.envelopes), 4, "nothing after the terminal envelope")

    def test_audioNotRetained(self) -> None:
        """
        A stream asked not to retain audio still shows every chunk to its
        observers but keeps none of them.
        """
        stream = ReplyStream("r1", lambda s: None, retainAudio=False)
        seen: list[str] = []
        stream.subscribe(lambda e: seen.append(e.type))
        chunk = Envelope.build(
            "reply.audio.chunk", requestId="r1", sequence=0, segmentSequence=0, data="AAAA"
        )
        stream.received(chunk)
        stream.received(Envelope.build("reply.completed", requestId="r1"))
        self.assertEqual(seen, ["reply.audio.chunk", "reply.completed"])
        self.assertEqual([e.type for e in stream.envelopes], ["reply.completed"])

    def test_failed(self) -> None:
        stream, _ = self.stream()
        stream.received(
            Envelope.build(
                "request.error",
                requestId="r1",
                code="unsupported_voice",
                message="no",
                retryable=False,
            )
        )
        failure = self.failureResultOf(stream.done, ReplyFailed)
        self.assertEqual(
            (failure.value.code, failure.value.retryable), ("unsupported_voice", False)
        )

    def test_cancel(self) -> None:
        stream, cancelled = self.stream()
        stream.cancel()
        stream.cancel()
        self.assertEqual(cancelled, ["r1"], "cancel is asked once")
        stream.received(Envelope.build("reply.cancelled", requestId="r1"))
        self.failureResultOf(stream.done, ReplyCancelled)

    def test_observerFailureIsolated(self) -> None:
        stream, _ = self.stream()

        def broken(envelope: Envelope) -> None:
            raise RuntimeError("observer bug")

        stream.subscribe(broken)
        stream.received(Envelope.build("reply.completed", requestId="r1"))
        self.successResultOf(stream.done)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class MiddlewareApiTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.middleware = Middleware(Clock())

    def test_servicesVerify(self) -> None:
        self.assertTrue(verifyObject(IPluginServices, self.middleware.services))

    def test_invalidCardRefused(self) -> None:
        card = exampleCard()
        del card["data"]["personality"]
        with self.assertRaises(InvalidCard) as caught:
            self.middleware.registerCharacter("x", card)
        self.assertEqual(caught.exception.field, "data.personality")

    def test_unknownCharacter(self) -> None:
        with self.assertRaises(KeyError) as caught:
            self.middleware.requestReply("nobody", text="hi")
        self.assertIn("nobody", str(caught.exception))

    def test_needsTextOrAudio(self) -> None:
        self.middleware.registerCharacter("mira", exampleCard())
        self.assertRaises(ValueError, self.middleware.requestReply, "mira")

    def test_requestShape(self) -> None:
        """
        A request carries the seed's fields, a snapshot of the card with its
        canonical hash, and the caller's meta (never on the wire).
        """
        self.middleware.registerCharacter("mira", exampleCard())
        stream = self.middleware.requestReply(
            "mira", text="hi", promptScene={"sceneContext": "tavern"}, meta={"client": "c1"}
        )
        # No RPEngine is connected, so the request waits at the end of the chain.
        [request] = self.middleware.link.waiting
        fields: dict[str, Any] = request.fields
        self.assertEqual(fields["requestId"], stream.requestId)
        self.assertEqual(fields["event"], {"text": "hi"})
        self.assertEqual(fields["characterId"], "mira")
        self.assertEqual(fields["integrationId"], "rpmiddleware")
        self.assertEqual(fields["promptScene"], {"sceneContext": "tavern"})
        self.assertEqual(fields["card"]["mode"], "snapshot")
        self.assertEqual(fields["card"]["card"], exampleCard())
        self.assertEqual(fields["card"]["targetHash"], self.middleware.cards.hashNow(exampleCard()))
        self.assertEqual(request.meta["client"], "c1")
        self.assertNotIn("client", request.toBytes().decode())


class CardOwnershipTests(SynchronousTestCase):
    """
    A registered character's card is a private copy hashed once; a card
    passed on each call is the game's dict, read again every time.
    """

    def setUp(self) -> None:
        self.middleware = Middleware(Clock())

    def sentCards(self) -> list[dict[str, Any]]:
        return [request["card"] for request in self.middleware.link.waiting]

    def test_registeredHashedOnce(self) -> None:
        card = exampleCard()
        self.middleware.registerCharacter("mira", card)
        card["data"]["description"] = "changed after registering"
        self.middleware.requestReply("mira", text="one")
        self.middleware.requestReply("mira", text="two")
        self.assertEqual(self.middleware.cards.computed, 1)
        first, second = self.sentCards()
        self.assertIs(first["card"], second["card"])
        self.assertEqual(first["card"], exampleCard())
        self.assertEqual(first["targetHash"], canonicalHash(exampleCard()))

    def test_gameDictReadEachTime(self) -> None:
        card = exampleCard()
        self.middleware.requestReply("mira", text="one", card=card)
        card["data"]["description"] = "changed in place"
        self.middleware.requestReply("mira", text="two", card=card)
        first, second = self.sentCards()
        self.assertEqual(first["targetHash"], canonicalHash(exampleCard()))
        self.assertEqual(second["targetHash"], canonicalHash(card))
        self.assertIsNot(second["card"], card)
        self.assertEqual(first["card"]["data"]["description"], exampleCard()["data"]["description"])
