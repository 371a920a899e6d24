"""
Configuration: defaults, the TOML file, and clear refusals.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.config.settings import (
    ALTERNATE_PRODUCTION_ORIGIN,
    DEVELOPMENT_ORIGIN,
    PRODUCTION_ORIGIN,
    ConfigError,
    Settings,
    loadSettings,
    parseSettings,
)


class ConfigTests(SynchronousTestCase):
    def write(self, text: str) -> Path:
        path = Path(self.mktemp())
        path.write_text(text)
        return path

    def assertRefused(self, text: str, fragment: str) -> None:
        with self.assertRaises(ConfigError) as caught:
            loadSettings(self.write(text))
        self.assertIn(fragment, str(caught.exception))

    def test_defaults(self) -> None:
        settings = Settings()
        self.assertEqual(settings.server.port, 38471)
        self.assertEqual(settings.server.interface, "127.0.0.1")
        self.assertEqual(settings.server.max_message_bytes, 8 * 1024 * 1024)
        # RPEngine's two production host names (tools/mock-game/server.mjs).
        self.assertEqual(
            settings.server.engineOrigins(), {PRODUCTION_ORIGIN, ALTERNATE_PRODUCTION_ORIGIN}
        )
        self.assertEqual(settings.server.publicLink(), "https://rpengine.gemtavern.com/#port=38471")

    def test_devOrigin(self) -> None:
        settings = parseSettings({"server": {"dev": True, "origins": ["http://localhost:9000"]}})
        self.assertEqual(
            settings.server.engineOrigins(),
            {
                PRODUCTION_ORIGIN,
                ALTERNATE_PRODUCTION_ORIGIN,
                DEVELOPMENT_ORIGIN,
                "http://localhost:9000",
            },
        )

    def test_file(self) -> None:
        settings = loadSettings(
            self.write(
                "[server]\nport = 40000\n[engine]\nack-timeout = 2\n"
                "[chain]\nplugins = { logging = 10, moderation = false }\n"
                "[plugins.logging]\nlevel = 'debug'\n"
            )
        )
        self.assertEqual(settings.server.port, 40000)
        self.assertEqual(settings.engine.ack_timeout, 2.0)
        self.assertEqual(settings.chain, {"logging": 10, "moderation": None})
        self.assertEqual(settings.pluginSettings("logging"), {"level": "debug"})
        self.assertEqual(settings.pluginSettings("other"), {})

    def test_chainOrderList(self) -> None:
        settings = parseSettings({"chain": {"order": ["b", "a"]}})
        self.assertEqual(settings.chain, {"b": 100, "a": 200})

    def test_missingFile(self) -> None:
        with self.assertRaises(ConfigError) as caught:
            loadSettings("/nonexistent/rp.toml")
        self.assertIn("does not exist", str(caught.exception))

    def test_badToml(self) -> None:
        self.assertRefused("[server\nport=1", "not valid TOML")

    def test_unknownSetting(self) -> None:
        self.assertRefused("[server]\nprot = 1\n", "unknown setting server.prot")

    def test_unknownSection(self) -> None:
        self.assertRefused("[sever]\nport = 1\n", "unknown section [sever]")

    def test_wrongType(self) -> None:
        self.assertRefused("[server]\nport = 'high'\n", "server.port must be a whole number")
        self.assertRefused("[server]\ndev = 1\n", "true or false")

    def test_wrongTypeNamesKeyAsWritten(self) -> None:
        """
        A key written with dashes is named as written; a list item is named
        by its index; a whole number is taken for a number, a boolean never.
        """
        self.assertRefused(
            "[server]\nhello-timeout = 'soon'\n",
            "server.hello-timeout must be a number, got a string ('soon')",
        )
        self.assertRefused(
            "[server]\norigins = ['http://a', 3]\n", "server.origins[1] must be a string"
        )
        self.assertRefused("[engine]\nack_timeout = true\n", "engine.ack_timeout must be a number")
        settings = parseSettings({"server": {"hello-timeout": 2}, "client": {"barge-in": False}})
        self.assertEqual(settings.server.hello_timeout, 2.0)
        self.assertIsInstance(settings.server.hello_timeout, float)
        self.assertFalse(settings.client.barge_in)

    def test_unknownSettingListsKnown(self) -> None:
        self.assertRefused(
            "[game]\nintegration-idd = 'x'\n",
            "unknown setting game.integration-idd "
            "(known: default_character, default_character_id, integration_id)",
        )

    def test_notLoopback(self) -> None:
        """
        Listening on anything but loopback is refused at start-up.
        """
        for interface in ("0.0.0.0", "192.168.1.5", "::", "example.com"):
            self.assertRefused(f"[server]\ninterface = '{interface}'\n", "loopback interface only")
        for interface in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
            parseSettings({"server": {"interface": interface}})

    def test_sizeLimitCapped(self) -> None:
        self.assertRefused("[server]\nmax_message_bytes = 9000000000\n", "8 MiB")

    def test_wildcardOrigin(self) -> None:
        self.assertRefused("[server]\norigins = ['*']\n", "no wildcards")

    def test_badPriority(self) -> None:
        self.assertRefused("[chain]\nplugins = { a = 'first' }\n", "whole number or false")

    def test_relativePath(self) -> None:
        path = self.write("[game]\ndefault_character = 'card.json'\n")
        settings = loadSettings(path)
        self.assertEqual(
            settings.relativePath(settings.game.default_character), path.parent / "card.json"
        )
