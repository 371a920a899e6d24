"""
C{twistd rpmiddleware}: options, the service they make, and start-up errors.
"""

from __future__ import annotations

from pathlib import Path

from twisted.application.service import IServiceMaker
from twisted.internet.testing import MemoryReactorClock
from twisted.plugin import getPlugins
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.tap import Options, makeService


class OptionsTests(SynchronousTestCase):
    def parse(self, *args: str) -> Options:
        options = Options()
        options.parseOptions(list(args))
        return options

    def test_defaults(self) -> None:
        options = self.parse()
        self.assertEqual(options.settings.server.port, 38471)
        self.assertFalse(options.settings.server.dev)
        self.assertFalse(options["demo"])

    def test_flags(self) -> None:
        options = self.parse("--port", "40001", "--dev", "--origin", "http://127.0.0.1:9")
        server = options.settings.server
        self.assertEqual(server.port, 40001)
        self.assertIn("http://127.0.0.1:5173", server.engineOrigins())
        self.assertIn("http://127.0.0.1:9", server.engineOrigins())

    def test_configFileAndOverride(self) -> None:
        path = Path(self.mktemp())
        path.write_text("[server]\nport = 40100\nhello_timeout = 2\n")
        options = self.parse("--config", str(path), "--port", "40200")
        self.assertEqual(options.settings.server.port, 40200)
        self.assertEqual(options.settings.server.hello_timeout, 2.0)

    def test_badConfigIsUsageError(self) -> None:
        path = Path(self.mktemp())
        path.write_text("[server]\nport = 'x'\n")
        with self.assertRaises(usage.UsageError) as caught:
            self.parse("--config", str(path))
        self.assertIn("server.port must be a whole number", str(caught.exception))

    def test_notLoopbackInterface(self) -> None:
        with self.assertRaises(usage.UsageError) as caught:
            self.parse("--interface", "0.0.0.0")
        self.assertIn("loopback", str(caught.exception))

    def test_unknownPluginStopsStartup(self) -> None:
        path = Path(self.mktemp())
        path.write_text("[chain]\nplugins = { nonesuch = 1 }\n")
        options = self.parse("--config", str(path))
        with self.assertRaises(SystemExit) as caught:
            makeService(options, MemoryReactorClock())
        self.assertIn("unknown plugin 'nonesuch'", str(caught.exception))


class ServiceTests(SynchronousTestCase):
    def test_listensOnLoopback(self) -> None:
        options = Options()
        options.parseOptions(["--port", "40002"])
        reactor = MemoryReactorClock()
        service = makeService(options, reactor)
        service.privilegedStartService()
        service.startService()
        [(port, factory, backlog, interface)] = reactor.tcpServers
        self.assertEqual((port, interface), (40002, "127.0.0.1"))

    def test_portInUse(self) -> None:
        """
        A port in use stops start-up with a sentence, not a traceback.
        """
        import socket

        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        self.addCleanup(taken.close)
        from twisted.internet import reactor

        options = Options()
        options.parseOptions(["--port", str(taken.getsockname()[1])])
        service = makeService(options, reactor)
        with self.assertRaises(SystemExit) as caught:
            service.privilegedStartService()
        self.assertIn("already in use", str(caught.exception))
        self.assertIn("--port", str(caught.exception))

    def test_twistdFindsPlugin(self) -> None:
        """
        The drop-in in twisted/plugins makes the service maker discoverable.
        """
        makers = {maker.tapname: maker for maker in getPlugins(IServiceMaker)}
        self.assertIn("rpmiddleware", makers)
        self.assertIsInstance(makers["rpmiddleware"].options(), Options)
