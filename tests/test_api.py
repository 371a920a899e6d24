"""
The Python API: reply streams, characters, and what the middleware lends plugins.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from rpmiddleware.cards.validation import InvalidCard, canonicalHash
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.replystream import ReplyCancelled, ReplyFailed, ReplyStream
from rpmiddleware.plugin.interfaces import IPluginServices, IReplyStream
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard, examplePromptContext


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
        stream.received(Envelope.build("reply.text.delta", requestId="r1", sequence=0, delta="Hi "))
        stream.received(
            Envelope.build("reply.text.delta", requestId="r1", sequence=1, delta="there")
        )
        stream.received(Envelope.build("reply.completed", requestId="r1"))
        self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        self.assertEqual(
            seen, ["reply.accepted", "reply.text.delta", "reply.text.delta", "reply.completed"]
        )
        self.assertEqual(stream.text(), "Hi there")
        stream.received(Envelope.build("reply.text.delta", requestId="r1", sequence=2, delta="x"))
        self.assertEqual(len(stream.envelopes), 4, "nothing after the terminal envelope")

    def test_finishedStreamLetsFollowersGo(self) -> None:
        """
        A follower that holds its stream (a client turn does) and the stream
        are freed as soon as the stream ends, without waiting for the
        garbage collector: at 250 voice streams, finished turns kept in that
        cycle made the collector's full pass hold the reactor for 26-31 ms.
        A follower that subscribes to a finished stream is shown it and not
        kept.
        """

        class Follower:
            def __init__(self, stream: ReplyStream) -> None:
                self.stream = stream
                self.seen: list[str] = []
                stream.subscribe(self.received)

            def received(self, envelope: Envelope) -> None:
                self.seen.append(envelope.type)

        stream, _ = self.stream()
        follower = Follower(stream)
        gone = weakref.ref(follower)
        stream.received(Envelope.build("reply.completed", requestId="r1"))
        late = Follower(stream)
        self.assertEqual((follower.seen, late.seen), (["reply.completed"], ["reply.completed"]))
        collecting = gc.isenabled()
        gc.disable()
        try:
            del stream, follower, late
            self.assertIsNone(gone())
        finally:
            if collecting:
                gc.enable()

    def test_bufferedTextAndExtractedContent(self) -> None:
        """
        With buffered response processing RPEngine sends no deltas: the text
        and the captures come in reply.text.completed (app.rs gemma_completed).
        """
        stream, _ = self.stream()
        self.assertEqual(stream.extractedContent(), {})
        stream.received(
            Envelope.build(
                "reply.text.completed",
                requestId="r1",
                text="Welcome in.",
                tokenCount=4,
                elapsedMs=120.5,
                extractedContent={"emotion": ["happy"]},
            )
        )
        self.assertEqual(stream.text(), "Welcome in.")
        self.assertEqual(stream.extractedContent(), {"emotion": ["happy"]})

    def test_transcript(self) -> None:
        stream, _ = self.stream()
        self.assertIsNone(stream.transcript())
        stream.received(
            Envelope.build(
                "voice.capture.transcript", requestId="r1", text="Any work?", language="en"
            )
        )
        self.assertEqual(stream.transcript(), "Any work?")

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

    def test_textNotRetained(self) -> None:
        """
        A stream asked not to retain text keeps the deltas that came before
        anyone followed it (a follower is shown them) and only the text of
        those after; its text is the same.
        """
        stream = ReplyStream("r1", lambda s: None, retainText=False)

        def delta(i: int, text: str) -> Envelope:
            return Envelope.build("reply.text.delta", requestId="r1", sequence=i, delta=text)

        stream.received(delta(0, "Well "))
        seen: list[str] = []
        stream.subscribe(lambda e: seen.append(e.get("delta", e.type)))
        stream.received(delta(1, "met, "))
        stream.received(delta(2, "traveller."))
        self.assertEqual(stream.text(), "Well met, traveller.")
        stream.received(Envelope.build("reply.completed", requestId="r1"))
        self.assertEqual(seen, ["Well ", "met, ", "traveller.", "reply.completed"])
        self.assertEqual(
            [e.type for e in stream.envelopes], ["reply.text.delta", "reply.completed"]
        )

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
        A request carries RPEngine's fields, a snapshot of the card (under
        C{snapshot}, as session.rs reads it) with its hash, and the caller's
        meta (never on the wire).
        """
        self.middleware.registerCharacter("mira", exampleCard())
        stream = self.middleware.requestReply(
            "mira", text="hi", **PROMPT_CONTEXT, meta={"client": "c1"}
        )
        # No RPEngine is connected, so the request waits at the end of the chain.
        [request] = self.middleware.link.waiting
        fields: dict[str, Any] = request.fields
        self.assertEqual(fields["requestId"], stream.requestId)
        self.assertEqual(fields["event"], {"text": "hi"})
        self.assertEqual(fields["characterId"], "mira")
        self.assertEqual(fields["integrationId"], "rpmiddleware")
        self.assertEqual(fields["promptScene"], PROMPT_CONTEXT["promptScene"])
        self.assertEqual(fields["card"]["mode"], "snapshot")
        self.assertEqual(fields["card"]["snapshot"], exampleCard())
        self.assertNotIn("card", fields["card"])
        self.assertEqual(fields["card"]["targetHash"], self.middleware.cards.hashNow(exampleCard()))
        self.assertEqual(request.meta["client"], "c1")
        self.assertNotIn("client", request.toBytes().decode())

    def test_refusedAtOnceNamingTheField(self) -> None:
        """
        A request RPEngine would refuse (a partial prompt context, which
        json_core.rs validate_prompt_context refuses) ends at once with the
        field named, instead of waiting for RPEngine's untied invalid_payload.
        """
        self.middleware.registerCharacter("mira", exampleCard())
        stream = self.middleware.requestReply("mira", text="hi", promptScene={"kind": "x"})
        self.assertEqual(self.middleware.link.waiting, [])
        failure = self.failureResultOf(stream.done, ReplyFailed)
        error = failure.value.envelope
        self.assertEqual(error["code"], "invalid_payload")
        self.assertEqual(error["field"], "interactionMode")
        self.assertIn("go together", error["message"])

    def test_voiceCaptureAsksForTheTranscript(self) -> None:
        self.middleware.registerCharacter("mira", exampleCard())
        self.middleware.captureVoice("mira", silenceBehavior="restart")
        [request] = self.middleware.link.waiting
        self.assertIs(request["returnTranscript"], True)
        self.assertEqual(request["silenceBehavior"], "restart")


PROMPT_CONTEXT = examplePromptContext()


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
        self.assertIs(first["snapshot"], second["snapshot"])
        self.assertEqual(first["snapshot"], exampleCard())
        self.assertEqual(first["targetHash"], canonicalHash(exampleCard()))

    def test_gameDictReadEachTime(self) -> None:
        card = exampleCard()
        self.middleware.requestReply("mira", text="one", card=card)
        card["data"]["description"] = "changed in place"
        self.middleware.requestReply("mira", text="two", card=card)
        first, second = self.sentCards()
        self.assertEqual(first["targetHash"], canonicalHash(exampleCard()))
        self.assertEqual(second["targetHash"], canonicalHash(card))
        self.assertIsNot(second["snapshot"], card)
        self.assertEqual(
            first["snapshot"]["data"]["description"], exampleCard()["data"]["description"]
        )
