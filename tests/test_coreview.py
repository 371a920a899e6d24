"""
The core's view (L{rpmiddleware.core.view.CoreView}) as the middleware
provides it, the one reader of C{capacity.update}, and an outer layer (the
capacity monitor) driven by a fake view of a test's own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import Interface, implementer

from rpmiddleware.client.capacity import CapacityMonitor
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.view import CoreView, EngineSessionView, WaitingWork
from rpmiddleware.plugin.base import ChainPlugin
from rpmiddleware.plugin.interfaces import IChainContext, IHeldWork
from rpmiddleware.protocol.envelope import Direction, Envelope
from rpmiddleware.protocol.messages import Capacity
from rpmiddleware.testing.kit import exampleCard
from tests.support.engine import FakeWriter


def capacityUpdate(**fields: Any) -> Envelope:
    return Envelope.build("capacity.update", "s1", **fields)


class CapacityReaderTests(SynchronousTestCase):
    def test_otherTypes(self) -> None:
        """
        Only a C{capacity.update} is read.
        """
        self.assertIsNone(Capacity.fromEnvelope(Envelope.build("reply.accepted", requestId="r")))

    def test_whole(self) -> None:
        said = Capacity.fromEnvelope(
            capacityUpdate(acceptingRequests=True, queueDepth=3, queueLimit=20)
        )
        self.assertEqual(said, Capacity(True, 3, 20))

    def test_partialKeepsPrevious(self) -> None:
        """
        A field missing or not of its type keeps its previous value (a bool
        is not a count); a negative count reads as 0.
        """
        previous = Capacity(True, 4, 20)
        said = Capacity.fromEnvelope(capacityUpdate(queueDepth=-2, queueLimit=True), previous)
        self.assertEqual(said, Capacity(True, 0, 20))
        self.assertEqual(Capacity.fromEnvelope(capacityUpdate()), Capacity())


@implementer(IHeldWork)
class Holder(ChainPlugin):
    """
    Holds every request it sees (an L{IHeldWork} provider).
    """

    name = "holder"

    def __init__(self) -> None:
        self.holding: list[str] = []

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        if envelope.type == "reply.request":
            self.holding.append(str(envelope.requestId))
            return None
        return envelope

    def held(self) -> list[str]:
        return list(self.holding)


class IMarker(Interface):
    pass


@implementer(IMarker)
class Marked(ChainPlugin):
    name = "marked"


class MiddlewareViewTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.settings = Settings()
        self.holder = Holder()
        self.marked = Marked()
        self.middleware = Middleware(self.clock, self.settings, [self.holder, self.marked])
        self.middleware.registerCharacter("mira", exampleCard())
        self.view: CoreView = self.middleware

    def connect(self) -> Any:
        session = self.middleware.newEngineSession(FakeWriter(), "peer")
        session.received(Envelope.build("hello").fields)
        return session

    def test_engine(self) -> None:
        """
        Whether RPEngine is connected and its session, told to observers
        until they stop.
        """
        seen: list[EngineSessionView | None] = []
        stop = self.view.observeEngine(seen.append)
        self.assertFalse(self.view.engineConnected)
        self.assertIsNone(self.view.engineSession)
        session = self.connect()
        self.assertTrue(self.view.engineConnected)
        self.assertIs(self.view.engineSession, session)
        self.assertEqual(seen, [session])
        stop()
        session.connectionLost()
        self.assertFalse(self.view.engineConnected)
        self.assertEqual(seen, [session])

    def test_capacity(self) -> None:
        """
        The view's capacity is RPEngine's last capacity.update, current when
        observers of the game end hear it; a new session starts with no room
        (the limit last said is kept).
        """
        heard: list[Capacity] = []
        self.view.observeEnvelopes(lambda e: heard.append(self.view.capacity))
        session = self.connect()
        session.received(
            capacityUpdate(acceptingRequests=True, queueDepth=2, queueLimit=20).fields
            | {"sessionId": session.sessionId}
        )
        self.assertEqual(self.view.capacity, Capacity(True, 2, 20))
        self.assertEqual(heard[-1], Capacity(True, 2, 20))
        self.connect()
        self.assertEqual(self.view.capacity, Capacity(False, 0, 20))

    def test_waiting(self) -> None:
        """
        Requests waiting for RPEngine and those plugins hold, by plugin name.
        """
        self.assertEqual(self.view.waiting(), WaitingWork(0, (("holder", 0),)))
        self.middleware.requestReply("mira", text="Hi")
        self.middleware.captureVoice("mira")
        self.clock.advance(0)
        waiting = self.view.waiting()
        self.assertEqual(waiting, WaitingWork(1, (("holder", 1),)))
        self.assertEqual(waiting.heldLocally, 1)

    def test_chain(self) -> None:
        """
        The chain's names, and its plugins found by what they provide.
        """
        self.assertEqual(self.view.pluginNames, ["holder", "marked"])
        self.assertEqual(self.view.providers(IHeldWork), [self.holder])
        self.assertIs(self.view.plugin(IMarker), self.marked)
        self.assertEqual(self.view.providers(IChainContext), [])

    def test_observeChain(self) -> None:
        """
        A chain watcher hears every envelope that leaves the chain, until it
        stops.
        """
        left: list[tuple[str, Direction, str]] = []

        class Watcher:
            name = "watcher"

            def envelopeLeft(self, envelope: Envelope, direction: Direction, outcome: str) -> None:
                left.append((envelope.type, direction, outcome))

        stop = self.view.observeChain(Watcher())
        self.middleware.submit(Envelope.build("reply.request", requestId="r1"))
        self.assertEqual(left, [("reply.request", Direction.TO_ENGINE, "dropped")])
        stop()
        self.middleware.submit(Envelope.build("reply.request", requestId="r2"))
        self.assertEqual(len(left), 1)

    def test_turnRecords(self) -> None:
        stream = self.middleware.requestReply("mira", text="Hi")
        record = self.view.turnRecord(stream.requestId)
        assert record is not None
        self.assertEqual(record.requestId, stream.requestId)
        self.assertEqual([r.requestId for r in self.view.recentTurns()], [stream.requestId])
        self.assertIsNone(self.view.turnRecord("nobody"))

    def test_mailbox(self) -> None:
        """
        The file mailbox's absolute path, when one is served.
        """
        self.assertIsNone(self.view.engineMailbox)
        folder = self.mktemp()
        self.settings.engine.mailbox = folder
        mailbox = self.view.engineMailbox
        assert mailbox is not None
        self.assertTrue(mailbox.endswith(folder.lstrip(".")))
        self.assertTrue(mailbox.startswith("/"))


class FakeCore:
    """
    Just enough of a L{CoreView} for the capacity monitor.
    """

    def __init__(self) -> None:
        self.engineConnected = False
        self.capacity = Capacity()
        self.envelopes: list[tuple[Callable[[Envelope], None], Collection[str] | None]] = []
        self.engine: list[Callable[[Any], None]] = []

    def observeEnvelopes(
        self, observer: Callable[[Envelope], None], types: Collection[str] | None = None
    ) -> Callable[[], None]:
        self.envelopes.append((observer, types))
        return lambda: None

    def observeEngine(self, observer: Callable[[Any], None]) -> Callable[[], None]:
        self.engine.append(observer)
        return lambda: None

    def say(self, envelope: Envelope) -> None:
        said = Capacity.fromEnvelope(envelope, self.capacity)
        if said is not None:
            self.capacity = said
        for observer, types in self.envelopes:
            if types is None or envelope.type in types:
                observer(envelope)


class CapacityMonitorTests(SynchronousTestCase):
    """
    The monitor reads the view and tells its listeners only of changes.
    """

    def test_changes(self) -> None:
        core = FakeCore()
        monitor = CapacityMonitor(core)  # type: ignore[arg-type]
        told: list[tuple[bool, bool, int, int]] = []
        monitor.listen(lambda: told.append(monitor.state()))
        core.say(capacityUpdate(acceptingRequests=True, queueDepth=1, queueLimit=5))
        core.say(capacityUpdate(acceptingRequests=True, queueDepth=1, queueLimit=5))
        core.say(Envelope.build("reply.accepted", requestId="r"))
        core.engineConnected = True
        for observer in core.engine:
            observer(object())
        self.assertEqual(told, [(False, True, 1, 5), (True, True, 1, 5)])
        self.assertEqual(monitor.message(1)["queueLimit"], 5)
        # It hears of capacity updates only, not of every speech chunk.
        self.assertEqual([types for _, types in core.envelopes], [{"capacity.update"}])
