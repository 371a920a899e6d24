"""
Client sessions and their TTL, driven by a Clock; the send guard that bounds
a slow client, driven by a Clock and a fake backlog; the client settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.abstract import FileDescriptor
from twisted.internet.task import Clock
from twisted.internet.testing import EventLoggingObserver, MemoryReactor
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.client import flow
from rpmiddleware.client.flow import SendGuard, checkBacklogReadable, transportBacklog
from rpmiddleware.client.sessions import ClientConfig, SessionLookupError, SessionStore
from rpmiddleware.client.settings import ClientSettings, loadDefaultCharacter
from rpmiddleware.config.settings import ConfigError, Settings, parseSettings
from rpmiddleware.protocol.clienterrors import InvalidMessage
from rpmiddleware.testing.kit import exampleCard


class SessionStoreTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.settings = ClientSettings(session_ttl=60.0, max_sessions=3, history_limit=4)
        self.store = SessionStore(self.clock, self.settings)

    def test_createUnique(self) -> None:
        a, b = self.store.create("a"), self.store.create("b")
        self.assertNotEqual(a.id, b.id)
        self.assertEqual((a.owner, b.owner), ("a", "b"))
        self.assertEqual(len(self.store), 2)

    def test_resumeWithinTtl(self) -> None:
        session = self.store.create("first")
        session.remember("player", "hello")
        self.store.detach(session)
        self.assertIsNone(session.owner)
        self.clock.advance(59.9)
        resumed, previous = self.store.resume(session.id, "second")
        self.assertIs(resumed, session)
        self.assertIsNone(previous)
        self.assertEqual(resumed.owner, "second")
        self.assertEqual(list(resumed.history), [{"role": "player", "text": "hello"}])
        # Resumed, it no longer ages: it belongs to a connection again.
        self.clock.advance(3600)
        self.assertIs(self.store.resume(session.id, "third")[0], session)

    def test_endedSessionsAreTold(self) -> None:
        """
        Each session that is over is told once: expired past its TTL, or
        discarded for another; never one that still waits.
        """
        ended: list[str] = []
        store = SessionStore(self.clock, self.settings)
        store.onEnded = ended.append
        waiting, expiring, discarded = store.create("a"), store.create("b"), store.create("c")
        store.discard(discarded)
        store.detach(expiring)
        self.clock.advance(30)
        store.detach(waiting)
        self.clock.advance(31)
        store.sweep()
        self.assertEqual(ended, [discarded.id, expiring.id])
        store.sweep()
        self.assertEqual(len(ended), 2)

    def test_resumeLiveSessionNamesPreviousOwner(self) -> None:
        session = self.store.create("first")
        self.assertEqual(self.store.resume(session.id, "second"), (session, "first"))

    def test_expired(self) -> None:
        """
        Past the TTL a session is gone, and its id is told apart from one
        that never existed.
        """
        session = self.store.create("first")
        self.store.detach(session)
        self.clock.advance(60.0)
        with self.assertRaises(SessionLookupError) as caught:
            self.store.resume(session.id, "second")
        self.assertTrue(caught.exception.expired)
        self.assertEqual(len(self.store), 0)
        with self.assertRaises(SessionLookupError) as caught:
            self.store.resume("never-was", "second")
        self.assertFalse(caught.exception.expired)

    def test_ttlCountsFromDisconnect(self) -> None:
        session = self.store.create("first")
        self.clock.advance(1000)
        self.store.detach(session)
        self.clock.advance(30)
        self.assertIs(self.store.resume(session.id, "second")[0], session)

    def test_liveSessionsNeverExpire(self) -> None:
        session = self.store.create("first")
        self.clock.advance(10**6)
        self.store.sweep()
        self.assertIs(self.store.resume(session.id, "first")[0], session)

    def test_boundedDetached(self) -> None:
        """
        Beyond max_sessions detached sessions, the oldest expire early.
        """
        sessions = [self.store.create(i) for i in range(5)]
        for session in sessions:
            self.clock.advance(1)
            self.store.detach(session)
        self.assertEqual(len(self.store), 3)
        with self.assertRaises(SessionLookupError) as caught:
            self.store.resume(sessions[0].id, "x")
        self.assertTrue(caught.exception.expired)
        self.assertIs(self.store.resume(sessions[4].id, "x")[0], sessions[4])

    def test_discard(self) -> None:
        session = self.store.create("a")
        self.store.discard(session)
        with self.assertRaises(SessionLookupError) as caught:
            self.store.resume(session.id, "b")
        self.assertFalse(caught.exception.expired)

    def test_historyBounded(self) -> None:
        session = self.store.create("a")
        for i in range(10):
            session.remember("player", str(i))
        self.assertEqual([e["text"] for e in session.history], ["6", "7", "8", "9"])

    def test_noHistory(self) -> None:
        store = SessionStore(self.clock, ClientSettings(history_limit=0))
        session = store.create("a")
        session.remember("player", "x")
        self.assertEqual(list(session.history), [])


class ClientConfigTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        defaults = ClientSettings()
        config = ClientConfig()
        self.assertEqual(
            config.output(defaults),
            {
                "modalities": ["text", "audio"],
                "language": "en",
                "audio": {"model": "gemtavern-supertonic-3", "voice": "F1", "format": "pcm_s16le"},
            },
        )
        self.assertEqual(config.outputRate(defaults), 24000)
        self.assertTrue(config.streams(defaults))
        self.assertTrue(config.bargesIn(defaults))
        self.assertEqual(config.promptFields(), {})

    def test_updated(self) -> None:
        defaults = ClientSettings()
        config = ClientConfig().updated(
            {"modalities": ["text"], "language": "de", "streaming": False, "bargeIn": False}
        )
        self.assertEqual(config.output(defaults), {"modalities": ["text"], "language": "de"})
        self.assertFalse(config.streams(defaults))
        self.assertFalse(config.bargesIn(defaults))
        config = config.updated({"interactionMode": "auto_event", "promptScene": {"a": 1}})
        self.assertEqual(
            config.promptFields(), {"interactionMode": "auto_event", "promptScene": {"a": 1}}
        )

    def test_processingInRPEngineShape(self) -> None:
        """
        audioProcessing becomes output.audio.processing.profile (only when
        audio is asked for), responseProcessing output.responseProcessing.
        """
        defaults = ClientSettings()
        rules = {"mode": "buffered", "rules": []}
        config = ClientConfig().updated(
            {"audioProcessing": "narrowband_voice", "responseProcessing": rules, "voice": "M2"}
        )
        self.assertEqual(
            config.output(defaults),
            {
                "modalities": ["text", "audio"],
                "language": "en",
                "audio": {
                    "model": "gemtavern-supertonic-3",
                    "voice": "M2",
                    "format": "pcm_s16le",
                    "processing": {"profile": "narrowband_voice"},
                },
                "responseProcessing": rules,
            },
        )
        textOnly = config.updated({"modalities": ["text"]})
        self.assertEqual(
            textOnly.output(defaults),
            {"modalities": ["text"], "language": "en", "responseProcessing": rules},
        )

    def test_silence(self) -> None:
        self.assertEqual(ClientConfig().silence(), "error")
        self.assertEqual(ClientConfig(silenceBehavior="restart").silence(), "restart")

    def test_checkWithRPEngineRules(self) -> None:
        """
        A configuration whose request RPEngine would refuse is refused,
        naming the field under the message it came in.
        """
        defaults = ClientSettings()
        ClientConfig().check(defaults, "configure")
        scene = {"kind": "k", "family": "f", "label": "l", "sceneLine": "s", "priority": 1}
        directive = {
            "protocolVersion": 1,
            "sceneContext": "c",
            "autoEventGuide": "a",
            "directUserGuide": "d",
        }
        whole = ClientConfig(
            interactionMode="direct_user", promptScene=scene, promptDirective=directive
        )
        whole.check(defaults, "configure")
        cases = [
            (
                ClientConfig(promptScene=scene),
                "configure.interactionMode is missing: interactionMode, promptScene and "
                "promptDirective go together",
            ),
            (
                whole.updated({"promptScene": {**scene, "priority": "high"}}),
                "configure.promptScene.priority must be a finite number",
            ),
            (
                whole.updated({"promptScene": {**scene, "label": ""}}),
                "configure.promptScene.label must be a non-empty string",
            ),
            (
                whole.updated({"promptDirective": {**directive, "protocolVersion": 0}}),
                "configure.promptDirective.protocolVersion must be a positive integer",
            ),
        ]
        for config, words in cases:
            with self.assertRaises(InvalidMessage) as caught:
                config.check(defaults, "configure")
            self.assertEqual(str(caught.exception), words)
        with self.assertRaises(InvalidMessage) as caught:
            ClientConfig(promptDirective=directive).check(defaults, "text.options")
        self.assertIn("text.options.interactionMode is missing", str(caught.exception))


class SendGuardTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.queued = 0
        self.events: list[Any] = []
        self.guard = SendGuard(
            self.clock,
            lambda: self.queued,
            soft=1000,
            hard=5000,
            grace=2.0,
            onCongested=lambda: self.events.append("congested"),
            onRelieved=lambda: self.events.append("relieved"),
            onOverflow=lambda why: self.events.append(("overflow", why)),
        )

    def write(self, size: int = 100) -> None:
        self.queued += size
        self.guard.wrote(size)

    def test_underSoft(self) -> None:
        self.queued = 900
        self.write(100)
        self.assertFalse(self.guard.congested)
        self.assertEqual(self.events, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_congestedThenRelieved(self) -> None:
        self.queued = 950
        self.write(100)
        self.write(100)
        self.assertTrue(self.guard.congested)
        self.assertEqual(self.events, ["congested"])
        self.queued = 600  # under soft, not yet under half of it
        self.clock.advance(self.guard.pollInterval)
        self.assertTrue(self.guard.congested)
        self.queued = 500
        self.clock.advance(self.guard.pollInterval)
        self.assertFalse(self.guard.congested)
        self.assertEqual(self.events, ["congested", "relieved"])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_staysOverForGrace(self) -> None:
        self.queued = 1950
        self.write(100)
        self.clock.pump([self.guard.pollInterval] * 7)
        self.assertEqual(self.events, ["congested"])
        self.clock.pump([self.guard.pollInterval] * 2)
        self.assertEqual(self.events[1][0], "overflow")
        self.assertIn("2 s", self.events[1][1])
        self.assertTrue(self.guard.overflowed)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.write(100)
        self.assertEqual(len(self.events), 2)

    def test_overHardAtOnce(self) -> None:
        self.queued = 4950
        self.write(100)
        self.assertEqual(
            self.events, [("overflow", "5050 bytes are waiting for this client (limit 5000)")]
        )
        self.assertEqual(self.guard.peak, 5050)

    def test_largeMessageGetsTimeToDrain(self) -> None:
        """
        One message bigger than the soft bound (a WAV) does not make a
        reading client congested, nor does the small one after it.
        """
        self.write(20000)
        self.write(50)
        self.assertEqual(self.events, [])
        self.queued = 0  # the client read it
        self.clock.advance(self.guard.pollInterval)
        self.assertEqual(self.events, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_largeMessageNotRead(self) -> None:
        self.write(3000)
        self.assertEqual(self.events, [])
        self.clock.advance(self.guard.pollInterval)
        self.assertEqual(self.events, ["congested"])
        self.write(20000)
        self.clock.advance(self.guard.pollInterval)
        self.assertEqual(self.events[1][0], "overflow")

    def test_stop(self) -> None:
        self.queued = 1950
        self.write(100)
        self.guard.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_transportBacklog(self) -> None:
        class Transport:
            dataBuffer = b"x" * 100
            offset = 40
            _tempDataLen = 7

        self.assertEqual(transportBacklog(Transport()), 67)
        self.assertEqual(transportBacklog(object()), 0)

    def warnings(self) -> list[dict[str, Any]]:
        events = EventLoggingObserver()
        globalLogPublisher.addObserver(events)
        self.addCleanup(globalLogPublisher.removeObserver, events)
        self.patch(flow, "_warned", False)
        return events  # type: ignore[return-value]

    def tcpTransport(self) -> FileDescriptor:
        transport = FileDescriptor(MemoryReactor())
        transport.dataBuffer = b"x" * 100
        transport.offset = 40
        return transport

    def test_transportBacklogOfTwistedTcp(self) -> None:
        """
        A Twisted TCP transport's backlog is read in full, silently.
        """
        events = self.warnings()
        transport = self.tcpTransport()
        transport.connected = True
        transport.write(b"y" * 7)
        self.assertEqual(transportBacklog(transport), 67)
        self.assertTrue(checkBacklogReadable(MemoryReactor()))
        self.assertEqual([e for e in events if e["log_level"] >= LogLevel.warn], [])

    def test_transportBacklogUnreadable(self) -> None:
        """
        A Twisted TCP transport without the private C{_tempDataLen} (a
        Twisted that renamed it) counts what it can, and says once, with
        fields, that slow-client protection is reduced.
        """
        events = self.warnings()
        transport = self.tcpTransport()
        del transport._tempDataLen
        self.assertEqual(transportBacklog(transport), 60)
        self.assertEqual(transportBacklog(transport), 60)
        warned = [e for e in events if e["log_level"] == LogLevel.warn]
        self.assertEqual(len(warned), 1)
        [event] = warned
        self.assertEqual(event["missing"], "_tempDataLen")
        self.assertEqual(event["missingAttributes"], ["_tempDataLen"])
        self.assertEqual(event["transportClass"], "FileDescriptor")
        self.assertIn("slow-client protection reduced", event["log_format"])

    def test_unreadableAtStartUp(self) -> None:
        """
        At start-up (the client factory), a Twisted whose transports lack
        what is read is said at once, without waiting for a client.
        """
        events = self.warnings()
        self.patch(flow, "BACKLOG_ATTRIBUTES", ("dataBuffer", "offset", "_renamedLen"))
        self.assertFalse(checkBacklogReadable(MemoryReactor()))
        [event] = [e for e in events if e["log_level"] == LogLevel.warn]
        self.assertEqual(event["missingAttributes"], ["_renamedLen"])


class ClientSettingsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        self.assertEqual(Settings().client, ClientSettings())

    def test_fromFile(self) -> None:
        read = parseSettings({"client": {"barge_in": False, "session_ttl": 5.0}}).client
        self.assertEqual((read.barge_in, read.session_ttl), (False, 5.0))

    def test_checks(self) -> None:
        bad: list[dict[str, Any]] = [
            {"default_voice": "X1"},
            {"default_language": "xx"},
            {"default_sample_rate": 100},
            {"session_ttl": -1.0},
            {"send_buffer_soft": 10, "send_buffer_hard": 5},
            {"ice_servers": [{"username": "x"}]},
        ]
        for values in bad:
            with self.assertRaises(ConfigError) as caught:
                parseSettings({"client": values})
            self.assertIn(f"client.{next(iter(values))}", str(caught.exception))


class DefaultCharacterTests(SynchronousTestCase):
    def write(self, document: Any) -> str:
        path = Path(self.mktemp())
        path.write_text(json.dumps(document) if not isinstance(document, str) else document)
        return str(path)

    def test_unset(self) -> None:
        self.assertIsNone(loadDefaultCharacter(Settings()))

    def test_loaded(self) -> None:
        settings = Settings()
        settings.game.default_character = self.write(exampleCard(name="Bram"))
        settings.game.default_character_id = "bram"
        character = loadDefaultCharacter(settings)
        assert character is not None
        self.assertEqual(character.characterId, "bram")
        self.assertEqual(character.card["data"]["name"], "Bram")
        self.assertEqual(character.integrationId, "rpmiddleware")

    def test_refused(self) -> None:
        card = exampleCard()
        del card["data"]["description"]
        for document, words in [
            (card, "data.description"),
            ("{not json", "not valid JSON"),
        ]:
            settings = Settings()
            settings.game.default_character = self.write(document)
            with self.assertRaises(ConfigError) as caught:
                loadDefaultCharacter(settings)
            self.assertIn(words, str(caught.exception))
        settings = Settings()
        settings.game.default_character = "/nonexistent/card.json"
        with self.assertRaises(ConfigError) as caught:
            loadDefaultCharacter(settings)
        self.assertIn("cannot be read", str(caught.exception))
