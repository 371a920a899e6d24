"""
A plugin's life in the chain: attached once with its context, the client
session hooks, closed when the daemon stops; typed services and settings.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sqlite3
from typing import Annotated, Any, Literal

import msgspec
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rpmiddleware.config.settings import ConfigError, Settings, parseSettings
from rpmiddleware.core.chain import CLOSE_TIMEOUT, PluginChain
from rpmiddleware.core.discovery import buildChain, discoverPlugins
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.daemon.service import makeMiddlewareService
from rpmiddleware.plugin import (
    CardHasher,
    ChainPlugin,
    Envelope,
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IPluginServices,
    PluginFactory,
    PluginServices,
    PluginSettings,
    Timeline,
)
from rpmiddleware.testing.kit import PluginHarness, captureLogEvents, pluginServices


class Life(ChainPlugin):
    """
    Writes down what happens to it in C{trail}, shared between plugins.
    """

    def __init__(self, name: str, trail: list[str], closing: Any = None) -> None:
        self.name = name
        self.trail = trail
        self.closing = closing

    def attached(self, context: IChainContext) -> None:
        super().attached(context)
        self.trail.append(f"attached {self.name}")

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        self.trail.append(f"envelope {self.name}")
        return envelope

    def clientSessionEnded(self, clientId: str, context: IChainContext) -> None:
        self.trail.append(f"ended {self.name} {clientId}")

    def clientSessionResumed(self, clientId: str, context: IChainContext) -> None:
        self.trail.append(f"resumed {self.name} {clientId}")

    def close(self) -> Any:
        self.trail.append(f"close {self.name}")
        if callable(self.closing):
            return self.closing()
        return self.closing


@implementer(IEnvelopePlugin)
class Bare:
    """
    A plugin written against the interface alone: no lifecycle hooks.
    """

    name = "bare"

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        return envelope

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        pass


def chainOf(*plugins: Any, clock: Clock | None = None) -> PluginChain:
    return PluginChain(list(plugins), lambda e: None, lambda e: None, clock or Clock())


class AttachedTests(SynchronousTestCase):
    def test_attachedOnceInOrderBeforeEnvelopes(self) -> None:
        """
        Building the chain gives every plugin its context, in chain order,
        once; it is the context the envelope methods are given.
        """
        trail: list[str] = []
        a, b = Life("a", trail), Life("b", trail)
        harness = PluginHarness([a, b])
        self.assertEqual(trail, ["attached a", "attached b"])
        seen: list[IChainContext] = []

        class Spy(ChainPlugin):
            name = "spy"

            def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
                seen.append(context)
                return envelope

        spy = Spy()
        harness = PluginHarness([a, spy])
        harness.toEngine("request.cancel", requestId="r")
        self.assertIs(seen[0], spy.context)
        self.assertIs(a.context.plugin, a)

    def test_timerSendsThroughItsContext(self) -> None:
        """
        A plugin that has seen no envelope can still send, through the
        context it was given (what the built-ins used to keep by hand).
        """

        class Ticker(ChainPlugin):
            name = "ticker"

            def tick(self) -> None:
                self.context.sendToEngine(Envelope.build("request.cancel", requestId="t"))

        ticker = Ticker()
        harness = PluginHarness(ticker)
        ticker.tick()
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])

    def test_pluginWithoutHooks(self) -> None:
        """
        A plugin without attached, close or client hooks is in the chain as
        before: nothing is called that it lacks.
        """
        bare = Bare()
        chain = chainOf(bare)
        chain.clientSessionEnded("c1")
        self.assertIsNone(self.successResultOf(chain.close()))
        self.assertFalse(hasattr(bare, "context"))

    def test_failingAttachedIsolated(self) -> None:
        """
        A plugin whose attached raises is logged by name; the others are attached.
        """
        trail: list[str] = []

        class Broken(ChainPlugin):
            name = "broken"

            def attached(self, context: IChainContext) -> None:
                raise RuntimeError("no")

        events = captureLogEvents(self)
        chainOf(Broken(), Life("after", trail))
        self.assertEqual(trail, ["attached after"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertIn("broken", [e.get("plugin") for e in events])


class ClientHookTests(SynchronousTestCase):
    def test_plainPluginHearsClientSessions(self) -> None:
        """
        A ChainPlugin subclass that does not declare IClientExtension hears
        a client session end and resume (it was skipped before).
        """
        trail: list[str] = []
        middleware = Middleware(Clock(), Settings(), [Life("plain", trail)])
        middleware.clientSessionEnded("c1")
        middleware.clientSessionResumed("c2")
        self.assertEqual(trail[1:], ["ended plain c1", "resumed plain c2"])


class CloseTests(SynchronousTestCase):
    def test_everyPluginClosesOnStop(self) -> None:
        """
        Stopping the daemon's services closes every plugin (through the
        plugins service of makeMiddlewareService), and the stop waits for a
        plugin that closes later.
        """
        trail: list[str] = []
        later: Deferred[None] = Deferred()
        reactor = MemoryReactorClock()
        plugins = [Life("a", trail), Life("b", trail, later), Life("c", trail)]
        middleware = Middleware(reactor, Settings(), plugins)
        top, _ = makeMiddlewareService(reactor, Settings(), middleware)
        top.privilegedStartService()
        top.startService()
        stopped = top.stopService()
        self.assertEqual(
            [t for t in trail if t.startswith("close")], ["close a", "close b", "close c"]
        )
        self.assertNoResult(stopped)
        later.callback(None)
        self.successResultOf(stopped)

    def test_hangingCloseAbandoned(self) -> None:
        """
        A plugin whose close never ends is logged by name and abandoned after
        CLOSE_TIMEOUT seconds of the reactor's clock; the others closed.
        """
        trail: list[str] = []
        clock = Clock()
        hanging: Deferred[None] = Deferred()
        quick: Deferred[None] = Deferred()
        chain = chainOf(
            Life("hangs", trail, hanging), Life("quick", trail, quick), Life("sync", trail),
            clock=clock,
        )  # fmt: skip
        events = captureLogEvents(self)
        done = chain.close()
        self.assertEqual(trail[-3:], ["close hangs", "close quick", "close sync"])
        quick.callback(None)
        clock.advance(CLOSE_TIMEOUT - 0.1)
        self.assertNoResult(done)
        clock.advance(0.1)
        self.assertIsNone(self.successResultOf(done))
        [abandoned] = [e for e in events if "did not close" in e.get("log_format", "")]
        self.assertEqual(abandoned["plugins"], "hangs")
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_raisingCloseLogged(self) -> None:
        """
        A close that raises, or whose Deferred fails, is logged with the
        plugin's name; the others still close and the stop does not fail.
        """
        trail: list[str] = []
        failing: Deferred[None] = Deferred()

        def boom() -> None:
            raise RuntimeError("disk gone")

        events = captureLogEvents(self)
        chain = chainOf(
            Life("raises", trail, boom), Life("fails", trail, failing), Life("fine", trail)
        )
        done = chain.close()
        self.assertEqual(trail[-3:], ["close raises", "close fails", "close fine"])
        failing.errback(ValueError("no"))
        self.assertIsNone(self.successResultOf(done))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError, ValueError)), 2)
        named = [e.get("plugin") for e in events if "failed to close" in e.get("log_format", "")]
        self.assertEqual(named, ["raises", "fails"])

    def test_closedOnce(self) -> None:
        trail: list[str] = []
        chain = chainOf(Life("a", trail, succeed(None)))
        self.successResultOf(chain.close())
        self.successResultOf(chain.close())
        self.assertEqual(trail.count("close a"), 1)


class ServicesTests(SynchronousTestCase):
    def test_frozenAndTyped(self) -> None:
        """
        What plugins are given is a frozen PluginServices that provides
        IPluginServices, as the core builds it.
        """
        clock = Clock()
        services = PluginServices(clock, Settings(), CardHasher(clock), Timeline())
        self.assertTrue(IPluginServices.providedBy(services))
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, services, "reactor", None)
        middleware = Middleware.fromSettings(clock, Settings(), discoverPlugins())
        self.assertIsInstance(middleware.services, PluginServices)

    def test_buildingTheChainChangesNoSetting(self) -> None:
        """
        The settings plugins are given are the daemon's own, shared: building
        every built-in leaves them as they were.
        """
        settings = parseSettings(
            {"chain": {"plugins": {"logging": 500}}, "plugins": {"memory": {"path": ":memory:"}}}
        )
        before = copy.deepcopy(settings)
        buildChain(settings, discoverPlugins(), pluginServices(Clock(), settings))
        self.assertEqual(settings, before)


class Volume(PluginSettings):
    volume: Annotated[int, msgspec.Meta(ge=1, le=11)] = 3
    style: Literal["shout", "whisper"] = "shout"
    words: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if "" in self.words:
            raise ValueError("words must not hold an empty word")


class Loud(ChainPlugin):
    name = "loud"

    def __init__(self, settings: Volume) -> None:
        self.settings = settings


class SettingsTests(SynchronousTestCase):
    def build(self, table: dict[str, Any]) -> Any:
        return PluginFactory(Loud, "Loud.", settings=Volume).buildPlugin(table, pluginServices())

    def test_typedStructGiven(self) -> None:
        """
        The build function receives the table read into the settings class
        (keys may be written with -), with its defaults.
        """
        seen: list[Any] = []

        def build(settings: Volume, services: IPluginServices) -> Loud:
            seen.append(settings)
            return Loud(settings)

        factory = PluginFactory(Loud, "Loud.", build, settings=Volume)
        factory.buildPlugin({"volume": 11, "words": ["a"]}, pluginServices())
        self.assertEqual(seen, [Volume(volume=11, words=("a",))])
        self.assertEqual(self.build({}).settings, Volume())

    def test_refusedNamingTheKey(self) -> None:
        cases = [
            ({"volume": 12}, "plugins.loud.volume must be a whole number <= 11"),
            ({"volume": "3"}, "plugins.loud.volume must be a whole number, got a string ('3')"),
            ({"style": "sing"}, "plugins.loud.style must be one of shout, whisper, got 'sing'"),
            ({"words": ["", "x"]}, "plugins.loud.words must not hold an empty word"),
            ({"colume": 3}, "unknown setting plugins.loud.colume (known: style, volume, words)"),
        ]
        for table, message in cases:
            e = self.assertRaises(ValueError, self.build, table)
            self.assertEqual(str(e), message)

    def test_startUpNamesTheFile(self) -> None:
        """
        At start-up the message names the file, the plugin and the key.
        """
        settings = parseSettings(
            {"chain": {"plugins": {"loud": 10}}, "plugins": {"loud": {"volume": 0}}},
            "game.toml",
        )
        registry = discoverPlugins()
        registry.add(PluginFactory(Loud, "Loud.", settings=Volume), "test")
        e = self.assertRaises(ConfigError, buildChain, settings, registry, pluginServices())
        self.assertEqual(
            str(e), "game.toml: plugin 'loud': plugins.loud.volume must be a whole number >= 1"
        )

    def test_notASettingsClass(self) -> None:
        self.assertRaises(TypeError, PluginFactory, Loud, "Loud.", settings=dict)


class BuiltinCloseTests(SynchronousTestCase):
    def test_memoryStoreCheckpointedAndClosed(self) -> None:
        """
        The memory plugin's close writes the whole log back into the main
        file and empties it (wal_checkpoint(TRUNCATE)), then closes; a
        change after it is refused.
        """
        from rpmiddleware.builtin.memory import Memory, MemorySettings
        from rpmiddleware.builtin.memory.conversation import Key
        from rpmiddleware.builtin.memory.store import StoreError

        path = os.path.abspath(self.mktemp())
        clock = Clock()
        memory = Memory(MemorySettings(path=path), clock, CardHasher(clock), Timeline())
        chain = chainOf(memory, clock=clock)
        key = Key("game", "mira", "save-1")
        memory.store.pin(memory.conversation(key), "The player is Alex.")
        self.assertGreater(os.path.getsize(path + "-wal"), 0)
        self.successResultOf(chain.close())
        self.assertFalse(os.path.exists(path + "-wal") and os.path.getsize(path + "-wal"))
        db = sqlite3.connect(path)
        self.assertEqual(
            db.execute("SELECT text FROM facts").fetchall(), [("The player is Alex.",)]
        )
        db.close()
        self.assertRaises(StoreError, memory.store.briefs)

    def test_envelopeLogFileClosed(self) -> None:
        """
        Stopping closes the logging plugin's JSON-lines file.
        """
        path = os.path.abspath(self.mktemp())
        settings = parseSettings(
            {
                "chain": {"plugins": {"logging": 500}},
                "plugins": {"logging": {"jsonl_path": path}, "memory": {"path": ":memory:"}},
            }
        )
        clock = Clock()
        middleware = Middleware.fromSettings(clock, settings, discoverPlugins())
        [log] = [p for p in middleware.chain.plugins if p.name == "logging"]
        opened = log._file  # type: ignore[attr-defined]
        self.assertFalse(opened.closed)
        self.successResultOf(middleware.close())
        self.assertTrue(opened.closed)
