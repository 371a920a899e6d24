"""
Client turns end to end through RPEngine's file mailbox: real loopback
clients, the plugin chain, the mailbox service on the real reactor (inotify
where the platform has it), and the simulated RPEngine in file mode
(rpmiddleware/testing/simmailbox.py, after RPEngine's
src/filesystem-mailbox-adapter.ts).

The client end-to-end suites (tests/support/clientsuites.py) run here again
unchanged with RPEngine behind the mailbox instead of the WebSocket (typed,
recorded and voice-capture turns, barge-in, cancel, two clients, refusals),
which is the promise: the client endpoint looks the same either way.  Then
what only the mailbox has: both transports at once, card references and
patches, a burst of 22 clients, RPEngine reconnecting, and the demo.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import DeferredList, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.internet.testing import EventLoggingObserver
from twisted.logger import globalLogPublisher

from rpmiddleware.engine.mailbox.service import MailboxOptions, MailboxService
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.simmailbox import MailboxTransport
from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator
from tests.support import clientsuites as suites
from tests.support.client import OnRealSockets, pcmSamples, requestsOf, types
from tests.support.clientsuites import TurnCase


class MailboxMixin(OnRealSockets):
    """
    L{tests.support.client.LiveClientCase} with the mailbox service
    beside the WebSocket, and C{engine()} connecting RPEngine through it.
    """

    mailboxSlots = 2048

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        case: Any = self
        self.mailboxRoot = os.path.abspath(case.mktemp())
        options = MailboxOptions(path=self.mailboxRoot, slotCount=self.mailboxSlots)
        self.mailbox = MailboxService(reactor, case.middleware, options)
        self.mailbox.privilegedStartService()
        self.mailbox.startService()
        case.addCleanup(self.mailbox.stopService)

    @inlineCallbacks
    def engine(self, **options: Any) -> Any:
        case: Any = self
        options.setdefault("tokensPerSecond", None)
        options.setdefault("audioRealtime", False)
        options.setdefault("captureSpeechSeconds", 0.0)
        transport = MailboxTransport(reactor, self.mailboxRoot, SimulatorOptions(**options))
        engine = yield transport.connect()
        yield self.settled(engine)
        case.engines.append(engine)
        case.addCleanup(case._closeEngine, engine)
        return engine

    @inlineCallbacks
    def settled(self, engine: Any) -> Any:
        """
        Wait (at most five seconds) until the middleware's live session is
        the one this RPEngine adopted.
        """
        link = self.middleware.link  # type: ignore[attr-defined]
        for _ in range(500):
            session = link.session
            if session is not None and session.sessionId == engine.sessionId:
                return
            yield deferLater(reactor, 0.01, lambda: None)
        raise AssertionError("the mailbox session never went live")


class MailboxTextTurns(MailboxMixin, suites.VoiceAndTextTurns):
    pass


class MailboxInterruptions(MailboxMixin, suites.Interruptions):
    pass


class MailboxVoiceCapture(MailboxMixin, suites.VoiceCapture):
    pass


class MailboxSharing(MailboxMixin, suites.Sharing):
    @inlineCallbacks
    def test_engineLossAndRecovery(self) -> Any:
        """
        Over the mailbox nothing says RPEngine's tab closed; when a new one
        opens (a hello in the folder) the turn the old one had accepted ends
        with a retryable error, and a turn asked meanwhile, which waited in
        the folder, is played once by the new tab.
        """
        engine = yield self.engine(tokensPerSecond=200.0, replyText=suites.storyteller)
        alice = yield self.client()
        bob = yield self.client()
        alice.send({"type": "text", "text": "Tell me a story"})
        first = yield alice.nextOfType("llm-chunk")
        lost = first["turnId"]
        engine.disconnect()
        yield engine.closed
        bob.send({"type": "text", "text": "Anyone there?"})
        echo = yield bob.nextOfType("transcript")
        again = yield self.engine()
        messages = yield self.turn(alice)
        self.assertEqual(types(messages)[-2:], ["error", "tts-cancelled"])
        error = messages[-2]
        self.assertEqual(
            (error["code"], error["engineCode"], error["retryable"], error["turnId"]),
            ("LLM_ERROR", "engine_disconnected", True, lost),
        )
        bobs = yield self.turn(bob)
        self.assertIn("Anyone there", bobs[-1]["text"])
        self.assertEqual(dict(engine.processed), {lost: 1})
        self.assertEqual(dict(again.processed), {echo["turnId"]: 1})


class SameForClients(MailboxMixin, TurnCase):
    @inlineCallbacks
    def test_clientSeesTheSame(self) -> Any:
        """
        The same turn over the WebSocket and over the mailbox gives the
        client the same messages (fewer, longer llm-chunks: RPEngine batches
        text in file mode), the same text and the same speech.
        """
        seen = []
        for mailbox in (False, True):
            if mailbox:
                engine = yield self.engine()
            else:
                engine = yield connectSimulator(
                    reactor,
                    self.live.port,
                    SimulatorOptions(tokensPerSecond=None, captureSpeechSeconds=0.0),
                )
            client = yield self.client()
            client.send({"type": "text", "text": "Where does the road go?"})
            messages = yield self.turn(client)
            self.assertStreamedTurn(messages)
            seen.append(messages)
            engine.disconnect()
            yield engine.closed
            yield client.close()
        socket, mailbox = seen

        def shape(messages: list[dict[str, Any]]) -> list[str]:
            kinds = types(messages)
            return [k for i, k in enumerate(kinds) if k != "llm-chunk" or kinds[i - 1] != k]

        self.assertEqual(shape(socket), shape(mailbox))
        self.assertEqual(socket[-1]["text"], mailbox[-1]["text"])
        self.assertEqual(pcmSamples(socket), pcmSamples(mailbox))
        speech = [
            b"".join(base64.b64decode(m["data"]) for m in t if m["type"] == "tts-chunk")
            for t in seen
        ]
        self.assertEqual(speech[0], speech[1])
        for key in ("speech", "modalities"):
            self.assertEqual(socket[-1][key], mailbox[-1][key])
        self.assertEqual(socket[-1]["stats"]["audio"], mailbox[-1]["stats"]["audio"])


class BothTransports(MailboxMixin, TurnCase):
    @inlineCallbacks
    def test_websocketTakesOver(self) -> Any:
        """
        With a mailbox session live, RPEngine connecting over the WebSocket
        becomes the session and the mailbox one ends (as an older WebSocket
        does); its later files are dropped with a reason.  Then a hello in
        the mailbox takes over again and the WebSocket is closed with 4001.
        """
        events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        filed = yield self.engine()
        mailboxSession = self.middleware.link.session
        socket = yield connectSimulator(
            reactor, self.live.port, SimulatorOptions(tokensPerSecond=None)
        )
        live = self.middleware.link.session
        assert live is not None and mailboxSession is not None
        self.assertIsNot(live, mailboxSession)
        self.assertFalse(live.fileMode)
        self.assertTrue(mailboxSession.closed)
        client = yield self.client()
        client.send({"type": "text", "text": "Over the socket?"})
        messages = yield self.turn(client)
        self.assertStreamedTurn(messages)
        self.assertEqual(len(requestsOf(socket)), 1)
        self.assertEqual(requestsOf(filed), [])
        filed.setAccepting(True)  # the file tab still talks: dropped
        yield deferLater(reactor, 0.5, lambda: None)
        self.assertTrue([e for e in events if "no mailbox session" in str(e.get("why", ""))])
        transport = filed.carrier
        yield transport.connect()
        yield self.settled(filed)
        yield socket.closed
        closes = [e for e in events if e.get("log_format", "").startswith("a second RPEngine")]
        self.assertEqual(len(closes), 2)
        client.send({"type": "text", "text": "And through the folder?"})
        messages = yield self.turn(client)
        self.assertStreamedTurn(messages)
        self.assertEqual(len(requestsOf(filed)), 1)

    @inlineCallbacks
    def test_waitingTurnsGoToWhicheverConnects(self) -> Any:
        """
        A turn asked with no RPEngine waits; RPEngine connecting through the
        mailbox takes it, once.
        """
        client = yield self.client()
        client.send({"type": "text", "text": "Anyone?"})
        transcript = yield client.nextOfType("transcript")
        engine = yield self.engine()
        messages = yield self.turn(client)
        turnId = self.assertStreamedTurn([transcript, *messages])
        self.assertEqual(dict(engine.processed), {turnId: 1})


class Cards(MailboxMixin, TurnCase):
    @inlineCallbacks
    def test_snapshotReferencePatch(self) -> Any:
        """
        The card cache works through the mailbox as over the WebSocket: the
        card once, then a reference, then a patch when it changes.
        """
        engine = yield self.engine()
        client = yield self.client()
        for text in ("One", "Two"):
            client.send({"type": "text", "text": text})
            yield self.turn(client)
        changed = exampleCard(personality="Gruff today.")
        client.send({"type": "character", "characterId": "mira", "card": changed})
        client.send({"type": "text", "text": "Three"})
        yield self.turn(client)
        modes = [mode for mode, size in engine.cardTransfers]
        self.assertEqual(modes, ["snapshot", "reference", "patch"])


class Burst(MailboxMixin, TurnCase):
    timeout = 60

    @inlineCallbacks
    def test_twentyTwoClients(self) -> Any:
        """
        22 clients at once against RPEngine's queue of 20, through the
        mailbox: every turn is played once and reaches its client; RPEngine
        never refuses one for capacity.
        """
        engine = yield self.engine(concurrency=4)
        clients = []
        for _ in range(22):
            clients.append((yield self.client()))
        for index, client in enumerate(clients):
            client.send({"type": "text", "text": f"I am number {index}"})
        results = yield DeferredList([self.turn(c) for c in clients], fireOnOneErrback=True)
        for index, (_ok, messages) in enumerate(results):
            self.assertStreamedTurn(messages)
            self.assertIn(f"number {index}", messages[-1]["text"])
        self.assertEqual(len(engine.processed), 22)
        self.assertEqual(set(engine.processed.values()), {1})
        refusals = engine.sentOfType("request.error")
        self.assertEqual(refusals, [])


class Reconnect(MailboxMixin, TurnCase):
    @inlineCallbacks
    def test_rpengineReconnects(self) -> Any:
        """
        The same RPEngine tab connects again (says hello again): a new
        session, and the next turn is played once.
        """
        engine = yield self.engine()
        client = yield self.client()
        client.send({"type": "text", "text": "Before"})
        yield self.turn(client)
        first = self.middleware.link.session
        yield engine.carrier.connect()
        yield self.settled(engine)
        self.assertIsNot(self.middleware.link.session, first)
        client.send({"type": "text", "text": "After"})
        messages = yield self.turn(client)
        turnId = self.assertStreamedTurn(messages)
        self.assertEqual(engine.processed[turnId], 1)
