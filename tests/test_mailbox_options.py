"""
Choosing RPEngine's file mailbox: C{--mailbox}, the C{[engine]} settings,
the service they make, what the console's status says, and the demo played
through a folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.testing import EventLoggingObserver, MemoryReactorClock
from twisted.logger import globalLogPublisher
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase, TestCase

from rpmiddleware.config.settings import ConfigError, parseSettings
from rpmiddleware.engine.mailbox.service import MailboxService
from rpmiddleware.tap import Options, makeService
from rpmiddleware.testing.demo import DemoService
from rpmiddleware.testing.live import connectClient


class OptionTests(SynchronousTestCase):
    def test_commandLine(self) -> None:
        options = Options()
        options.parseOptions(["--mailbox", "some/box"])
        self.assertEqual(options.settings.engine.mailbox, os.path.abspath("some/box"))
        top = makeService(options, MemoryReactorClock())
        service = top.getServiceNamed("mailbox")  # type: ignore[attr-defined]
        self.assertIsInstance(service, MailboxService)
        self.assertEqual(service.root, os.path.abspath("some/box"))
        self.assertEqual(service.layout.slotCount, 2048)
        self.assertTrue(service.options.watch)

    def test_noMailboxByDefault(self) -> None:
        options = Options()
        options.parseOptions([])
        top = makeService(options, MemoryReactorClock())
        self.assertNotIn("mailbox", [s.name for s in top])  # type: ignore[attr-defined]

    def test_configFile(self) -> None:
        """
        A relative folder in the configuration is taken from the file's own
        folder; the slots and the watch are settings too.
        """
        folder = Path(self.mktemp())
        folder.mkdir()
        path = folder / "rpm.toml"
        path.write_text(
            '[engine]\nmailbox = "box"\nmailbox_audio_slots = 64\nmailbox_watch = false\n'
            '[game]\nintegration_id = "my-game"\n'
        )
        options = Options()
        options.parseOptions(["--config", str(path)])
        top = makeService(options, MemoryReactorClock())
        service: Any = top.getServiceNamed("mailbox")  # type: ignore[attr-defined]
        self.assertEqual(service.root, str((folder / "box").absolute()))
        self.assertEqual(
            (service.layout.slotCount, service.options.watch, service.options.integrationId),
            (64, False, "my-game"),
        )

    def test_slotsBounded(self) -> None:
        for slots in (0, 65537):
            with self.assertRaises(ConfigError) as caught:
                parseSettings({"engine": {"mailbox_audio_slots": slots}})
            self.assertIn("engine.mailbox_audio_slots", str(caught.exception))
        with self.assertRaises(usage.UsageError):
            options = Options()
            path = Path(self.mktemp())
            path.write_text("[engine]\nmailbox = 3\n")
            options.parseOptions(["--config", str(path)])

    def test_refusedFolderStopsStartup(self) -> None:
        folder = os.path.abspath(self.mktemp())
        os.mkdir(folder)
        os.chmod(folder, 0o777)
        options = Options()
        options.parseOptions(["--mailbox", folder, "--port", "0"])
        top = makeService(options, MemoryReactorClock())
        with self.assertRaises(SystemExit) as caught:
            top.privilegedStartService()
        self.assertIn("writable by every user", str(caught.exception))


class DemoThroughTheMailbox(TestCase):
    timeout = 30

    @inlineCallbacks
    def test_demo(self) -> Any:
        """
        C{--demo --mailbox DIR}: the simulated RPEngine connects through the
        folder and the scripted conversation plays; the console's status
        names the folder and the transport.
        """
        events = EventLoggingObserver.createWithCleanup(self, globalLogPublisher)
        self.patch(DemoService, "pacing", {"tokensPerSecond": None, "audioRealtime": False})
        folder = os.path.abspath(self.mktemp())
        options = Options()
        options.parseOptions(["--demo", "--port", "0", "--mailbox", folder])
        top = makeService(options, reactor)
        top.privilegedStartService()
        top.startService()
        self.addCleanup(top.stopService)
        demo: Any = top.getServiceNamed("demo")  # type: ignore[attr-defined]
        completed = yield demo.ready
        self.assertEqual(completed.type, "reply.completed")
        types = [e.type for e in demo.turn.envelopes]
        self.assertIn("reply.audio.chunk", types)
        session = demo.middleware.link.session
        self.assertTrue(session.fileMode)
        self.assertTrue([e for e in events if e.get("folder") == folder and "slots" in e])
        self.assertTrue(os.path.exists(os.path.join(folder, "manifest.json")))
        client = connectClient(reactor, f"ws://127.0.0.1:{demo.port}/client/socket")
        self.addCleanup(lambda: client.drop() if not client.closed.called else None)
        yield client.opened
        client.send({"type": "status"})
        status = yield client.nextOfType("status")
        engine = status["engine"]
        self.assertEqual((engine["mailbox"], engine["transport"]), (folder, "mailbox"))
        yield client.close()
