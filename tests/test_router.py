"""
The game end's observers: every envelope, or only the types they name, in
the order they came.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.core.router import GameRouter
from rpmiddleware.protocol.envelope import Envelope


def chunk() -> Envelope:
    return Envelope.build("reply.audio.chunk", "s", requestId="r", sequence=0, data="")


def update() -> Envelope:
    return Envelope.build("capacity.update", "s", acceptingRequests=True)


class ObserverTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.router = GameRouter()
        self.heard: list[tuple[str, str]] = []

    def watcher(self, name: str) -> Callable[[Envelope], None]:
        return lambda envelope: self.heard.append((name, envelope.type))

    def test_types(self) -> None:
        """
        An observer that names types hears those only; one that names none
        hears everything; each type's observers are called in the order
        they came.
        """
        self.router.observe(self.watcher("capacity"), {"capacity.update"})
        self.router.observe(self.watcher("all"))
        self.router.deliver(chunk())
        self.router.deliver(update())
        self.assertEqual(
            self.heard,
            [
                ("all", "reply.audio.chunk"),
                ("capacity", "capacity.update"),
                ("all", "capacity.update"),
            ],
        )

    def test_changes(self) -> None:
        """
        An observer that comes later is called for a type already seen, and
        one that stops is not called again.
        """
        stop = self.router.observe(self.watcher("first"))
        self.router.deliver(chunk())
        self.router.observe(self.watcher("later"), ["reply.audio.chunk"])
        self.router.deliver(chunk())
        stop()
        self.router.deliver(chunk())
        self.assertEqual([name for name, _ in self.heard], ["first", "first", "later", "later"])

    def test_stopWhileCalled(self) -> None:
        """
        An observer may stop observing while it is being called: the others
        of that envelope are still called, and it is not called again.
        """
        stops: list[Callable[[], None]] = []

        def once(envelope: Envelope) -> None:
            self.heard.append(("once", envelope.type))
            stops[0]()

        stops.append(self.router.observe(once))
        self.router.observe(self.watcher("after"))
        self.router.deliver(chunk())
        self.router.deliver(chunk())
        self.assertEqual([name for name, _ in self.heard], ["once", "after", "after"])
