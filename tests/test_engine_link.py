"""
The engine link: one live RPEngine, waiting work, and what a lost session
means for the requests in it.  Sessions are driven without sockets.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.core.replystream import ReplyCancelled, ReplyFailed
from rpmiddleware.engine.session import CLOSE_SUPERSEDED
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import captureLogEvents, exampleCard
from tests.support.engine import Harness


class ConnectionRuleTests(SynchronousTestCase):
    def test_newestWins(self) -> None:
        """
        A second RPEngine that completes its handshake replaces the first,
        which is closed with code 4001 and a reason.
        """
        h = Harness()
        first, firstWriter = h.connect()
        second, _ = h.connect()
        self.assertIs(h.middleware.link.session, second)
        self.assertEqual(firstWriter.closedWith[0], CLOSE_SUPERSEDED)  # type: ignore[index]
        self.assertIn("newer", firstWriter.closedWith[1])  # type: ignore[index]
        first.connectionLost()
        self.assertIs(h.middleware.link.session, second, "the old close does not undo the new")
        self.assertEqual(
            h.plugin.sessions,
            [("started", first.sessionId), ("ended", first.sessionId),
             ("started", second.sessionId)],
        )  # fmt: skip

    def test_oldSessionMessagesIgnored(self) -> None:
        h = Harness()
        first, _ = h.connect()
        h.connect()
        before = len(h.trail)
        h.engineSays(first, "capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=1)
        self.assertEqual(len(h.trail), before)

    def test_reconnectResetsState(self) -> None:
        """
        Every reconnect is a new session: plugins are told, and the link
        forgets the old one.
        """
        h = Harness()
        first, _ = h.connect()
        first.connectionLost()
        self.assertFalse(h.middleware.link.connected)
        second, _ = h.connect()
        self.assertNotEqual(first.sessionId, second.sessionId)
        self.assertEqual(
            h.plugin.sessions,
            [("started", first.sessionId), ("ended", first.sessionId),
             ("started", second.sessionId)],
        )  # fmt: skip


class EngineEndTests(SynchronousTestCase):
    def test_onlyRpengineTypesLeave(self) -> None:
        """
        An envelope of a type RPEngine does not take (a plugin's internal
        message nobody consumed, or an engine-to-game type) is dropped at the
        engine end with a log line instead of being sent.
        """
        h = Harness()
        _, writer = h.connect()
        events = captureLogEvents(self)
        h.middleware.chain.sendToEngine(Envelope.build("x.playbook.event", text="a dragon"))
        h.middleware.chain.sendToEngine(Envelope.build("reply.completed", requestId="r"))
        self.assertEqual(writer.types(), ["welcome"])
        dropped = [e.get("type") for e in events if "does not take" in e.get("log_format", "")]
        self.assertEqual(dropped, ["x.playbook.event", "reply.completed"])


class WaitingTests(SynchronousTestCase):
    def test_waitsForEngine(self) -> None:
        """
        With no RPEngine a request waits and is sent, through the chain, once
        one connects.
        """
        h = Harness()
        stream = h.middleware.requestReply("mira", text="Hello")
        self.assertEqual([r.requestId for r in h.middleware.link.waiting], [stream.requestId])
        session, writer = h.connect()
        requests = [m for m in writer.sent if m["type"] == "reply.request"]
        self.assertEqual([m["requestId"] for m in requests], [stream.requestId])
        self.assertEqual(requests[0]["sessionId"], session.sessionId)
        self.assertEqual(h.trail.count("recorder>"), 2, "it passed the chain again")
        self.assertEqual(h.middleware.link.waiting, [])

    def test_waitingLimit(self) -> None:
        h = Harness(waitingLimit=1)
        h.middleware.requestReply("mira", text="one")
        second = h.middleware.requestReply("mira", text="two")
        failure = self.failureResultOf(second.done, ReplyFailed)
        self.assertEqual(failure.value.code, "engine_unavailable")
        self.assertTrue(failure.value.retryable)

    def test_cancelWhileWaiting(self) -> None:
        h = Harness()
        stream = h.middleware.requestReply("mira", text="Hello")
        stream.cancel()
        self.failureResultOf(stream.done, ReplyCancelled)
        _, writer = h.connect()
        self.assertNotIn("reply.request", writer.types())


class LostSessionTests(SynchronousTestCase):
    def test_unackedResent(self) -> None:
        """
        A request RPEngine never acknowledged is sent again in the next
        session, once.
        """
        h = Harness()
        first, firstWriter = h.connect()
        stream = h.middleware.requestReply("mira", text="Hello")
        self.assertIn("reply.request", firstWriter.types())
        first.connectionLost()
        self.assertNoResult(stream.done)
        second, secondWriter = h.connect()
        resent = [m for m in secondWriter.sent if m["type"] == "reply.request"]
        self.assertEqual([m["requestId"] for m in resent], [stream.requestId])
        self.assertEqual(resent[0]["sessionId"], second.sessionId)
        self.assertEqual(resent[0]["card"]["mode"], "snapshot")
        # RPEngine's duplicate window outlives a reconnect of the same tab
        # (app.rs seen): the old messageId would be acked as a duplicate and
        # never run.
        [original] = [m for m in firstWriter.sent if m["type"] == "reply.request"]
        self.assertNotEqual(resent[0]["messageId"], original["messageId"])

    def test_resentKeepsCallerMeta(self) -> None:
        """
        A resent request keeps the caller's annotations (who asked, the rate
        it wants audio at), which plugins need on the second pass too.
        """
        h = Harness()
        seen = h.plugin.metas
        first, _ = h.connect()
        h.middleware.requestReply(
            "mira", text="Hello", meta={"client": "c7", "outputSampleRate": 24000}
        )
        first.connectionLost()
        h.connect()
        self.assertEqual(len(seen), 2)
        self.assertEqual(seen[1]["client"], "c7")
        self.assertEqual(seen[1]["outputSampleRate"], 24000)
        self.assertTrue(seen[1]["resubmitted"])
        self.assertNotIn("decisions", seen[1])

    def test_ackedEndsWithRetryableError(self) -> None:
        """
        A request RPEngine acknowledged is lost with its session: it ends
        with a retryable engine_disconnected error and is not sent again.
        """
        h = Harness()
        first, firstWriter = h.connect()
        stream = h.middleware.requestReply("mira", text="Hello")
        h.ack(first, firstWriter, "reply.request")
        h.engineSays(first, "reply.accepted", requestId=stream.requestId)
        first.connectionLost()
        failure = self.failureResultOf(stream.done, ReplyFailed)
        self.assertEqual(failure.value.code, "engine_disconnected")
        self.assertTrue(failure.value.retryable)
        _, secondWriter = h.connect()
        self.assertNotIn("reply.request", secondWriter.types())

    def test_completedNotTouched(self) -> None:
        h = Harness()
        first, firstWriter = h.connect()
        stream = h.middleware.requestReply("mira", text="Hello")
        h.ack(first, firstWriter, "reply.request")
        h.engineSays(first, "reply.completed", requestId=stream.requestId)
        self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        first.connectionLost()
        self.assertEqual(h.middleware.link.openRequests(), [])


class ApiToEngineTests(SynchronousTestCase):
    def test_syncCharacter(self) -> None:
        """
        C{syncCharacter} preloads a card with C{character.sync}: a snapshot
        with its canonical hash, no inference.
        """
        h = Harness()
        _, writer = h.connect()
        h.middleware.syncCharacter("mira")
        [sync] = [m for m in writer.sent if m["type"] == "character.sync"]
        self.assertEqual(sync["characterId"], "mira")
        self.assertEqual(sync["integrationId"], "rpmiddleware")
        self.assertEqual(sync["card"]["mode"], "snapshot")
        self.assertEqual(sync["card"]["targetHash"], h.middleware.cards.hashNow(exampleCard()))
        self.assertNotIn("reply.request", writer.types())

    def test_captureVoiceStopAndCancel(self) -> None:
        """
        C{captureVoice} opens a microphone turn; stopping it sends
        C{voice.capture.stop} and cancelling it C{voice.capture.cancel}, both
        for the same requestId.
        """
        h = Harness()
        _, writer = h.connect()
        stream = h.middleware.captureVoice("mira")
        h.middleware.stopVoiceCapture(stream)
        stream.cancel()
        sent = [(m["type"], m.get("requestId")) for m in writer.sent if m["type"] != "welcome"]
        self.assertEqual(
            sent,
            [
                ("voice.capture.start", stream.requestId),
                ("voice.capture.stop", stream.requestId),
                ("voice.capture.cancel", stream.requestId),
            ],
        )
        [start] = [m for m in writer.sent if m["type"] == "voice.capture.start"]
        self.assertNotIn("event", start)


class RefusalTests(SynchronousTestCase):
    """
    What RPEngine would refuse never leaves, and what it refuses ends the
    turn at once: it answers in order, so its untied invalid_payload names
    the oldest message it has not answered (app.rs transport_message).
    """

    def test_refusedBeforeSending(self) -> None:
        h = Harness()
        _, writer = h.connect()
        stream = h.middleware.requestReply(
            "mira", text="Hi", output={"modalities": ["text", "audio"], "language": "en"}
        )
        self.assertEqual(writer.types(), ["welcome"])
        error = self.failureResultOf(stream.done, ReplyFailed).value.envelope
        self.assertEqual((error["code"], error["field"]), ("invalid_payload", "output.audio"))
        self.assertIs(error["retryable"], False)

    def test_withdrawalRefusedBeforeSending(self) -> None:
        """
        A withdrawal RPEngine would refuse (no requestId) is not written,
        and answers nobody: it has no request to end.
        """
        h = Harness()
        _, writer = h.connect()
        seen: list[Envelope] = []
        self.addCleanup(h.middleware.router.observe(seen.append))
        events = captureLogEvents(self)
        h.middleware.chain.sendToEngine(Envelope.build("request.cancel"))
        self.assertEqual(writer.types(), ["welcome"])
        self.assertEqual(seen, [])
        self.assertIn("requestId", " ".join(str(e.get("field")) for e in events))

    def test_checkedOnce(self) -> None:
        """
        Each envelope that leaves the chain toward RPEngine is checked once,
        at the engine link; the session only stamps and sizes it.
        """
        from rpmiddleware.protocol import rules as enginerules

        checked: list[str] = []
        check = enginerules.checkEnvelope

        def counting(fields: Any) -> None:
            checked.append(str(fields.get("type")))
            check(fields)

        self.patch(enginerules, "checkEnvelope", counting)
        h = Harness()
        session, writer = h.connect()
        h.ack(session, writer, "welcome")
        h.middleware.requestReply("mira", text="Hi")
        self.assertEqual(writer.types(), ["welcome", "reply.request"])
        self.assertEqual(checked, ["reply.request"])

    def test_invalidCardRefusedBeforeSending(self) -> None:
        """
        A snapshot RPEngine would answer with invalid_character_card (here a
        character_book entry without its required fields, json_core.rs
        validate_card_value), as a plugin might produce, is refused at the
        engine end with the field named.  (The Python API refuses such a card
        earlier, when it is registered.)
        """
        h = Harness()
        _, writer = h.connect()
        seen: list[Envelope] = []
        self.addCleanup(h.middleware.router.observe(seen.append))
        card = exampleCard(
            character_book={"extensions": {}, "entries": [{"keys": ["inn"], "content": "x"}]}
        )
        h.middleware.chain.sendToEngine(
            Envelope.build(
                "reply.request",
                requestId="odd",
                eventId="e",
                integrationId="game",
                characterId="odd",
                event={"text": "Hi"},
                output={"modalities": ["text"], "language": "en"},
                card={"format": "chara_card_v2", "mode": "snapshot", "snapshot": card},
            )
        )
        self.assertEqual(writer.types(), ["welcome"])
        [error] = [e for e in seen if e.type == "request.error"]
        self.assertEqual(error["code"], "invalid_character_card")
        self.assertEqual(error["field"], "card.snapshot.data.character_book.entries[0].extensions")

    def test_engineRefusalEndsTheTurn(self) -> None:
        """
        Should RPEngine refuse what we checked anyway (a rule we do not know
        yet), the refusal reaches the request's stream at once, and the
        request is not sent again.
        """
        h = Harness()
        session, writer = h.connect()
        h.ack(session, writer, "welcome")
        stream = h.middleware.requestReply("mira", text="Hi")
        h.engineSays(session, "request.error", code="invalid_payload", message="Nope.")
        error = self.failureResultOf(stream.done, ReplyFailed).value.envelope
        self.assertEqual(error["requestId"], stream.requestId)
        self.assertIn("Nope.", error["message"])
        h.clock.advance(60)
        self.assertEqual(writer.types().count("reply.request"), 1)
