"""
L{Rig}: a middleware with the file mailbox service on a Clock and a
temporary folder, and simulated RPEngines in file mode pointed at it; with
L{ending}, the envelope that ended a reply stream.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.engine.mailbox.files import FROM_ENGINE
from rpmiddleware.engine.mailbox.service import MailboxOptions, MailboxService
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.simengine import SimulatedEngine
from rpmiddleware.testing.simmailbox import MailboxTransport
from rpmiddleware.testing.simoptions import SimulatorOptions

#: Long enough for three sentences (three segments).
QUESTION = "Is the road north safe?"


class Rig:
    """
    A middleware with the mailbox service on a L{Clock}, and simulated
    RPEngines pointed at its folder.
    """

    def __init__(
        self,
        case: SynchronousTestCase,
        root: str | None = None,
        clock: Clock | None = None,
        slots: int = 32,
        adopt: bool = True,
    ) -> None:
        self.case = case
        self.clock = clock if clock is not None else Clock()
        self.root = root if root is not None else os.path.abspath(case.mktemp())
        self.middleware = Middleware(self.clock, Settings())
        self.middleware.registerCharacter("mira", exampleCard())
        options = MailboxOptions(path=self.root, slotCount=slots, watch=False, adopt=adopt)
        self.service = MailboxService(self.clock, self.middleware, options, clock=self.clock)
        self.service.privilegedStartService()
        self.service.startService()
        self.running = True
        case.addCleanup(self.stop)

    @property
    def endpoint(self) -> Any:
        return self.service.endpoint

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.service.stopService()

    def kill(self) -> None:
        """
        The middleware process dies: nothing is cleaned up or ended.
        """
        self.running = False
        # Its timers die with it (they share the test's clock): the sessions
        # end without writing anything more.
        endpoint = self.service.endpoint
        assert endpoint is not None
        for session in {endpoint.session, self.middleware.link.session}:
            if session is not None and not session.closed:
                session.writer.closed = True  # type: ignore[attr-defined]
                session.connectionLost()
        loop = self.service._loop
        if loop is not None and loop.running:
            loop.stop()
        folders = self.service.folders
        assert folders is not None
        for fd in (folders.toEngine, folders.fromEngine, folders.audio):
            os.close(fd)
        self.service.folders = None
        self.service.endpoint = None

    def engine(self, connect: bool = True, **options: Any) -> SimulatedEngine:
        options.setdefault("welcomeTimeout", None)
        transport = MailboxTransport(self.clock, self.root, SimulatorOptions(**options))
        self.case.addCleanup(lambda: transport.disconnect(notify=False))
        if connect:
            transport.connect()
            self.run(0.5)
        return transport.engine

    def run(self, seconds: float, step: float = 0.01) -> None:
        for _ in range(round(seconds / step)):
            self.clock.advance(step)

    def ask(self, text: str = QUESTION, **fields: Any) -> ReplyStream:
        stream = self.middleware.requestReply("mira", text=text, **fields)
        # A turn that fails is looked at with ending(), or not at all.
        self.case.addCleanup(stream.done.addErrback, lambda failure: None)
        return stream

    def files(self, folder: str) -> list[str]:
        return sorted(os.listdir(os.path.join(self.root, folder)))

    def drop(self, name: str, data: bytes) -> None:
        """
        Put a file into RPEngine's folder as someone other than RPEngine.
        """
        with open(os.path.join(self.root, FROM_ENGINE, name), "wb") as f:
            f.write(data)


def ending(stream: ReplyStream) -> Envelope:
    """
    The envelope that ended C{stream}: its completion, cancellation or error.
    """
    box: list[Any] = []
    stream.done.addBoth(box.append)
    assert box, f"request {stream.requestId} has not ended"
    result = box[0]
    if isinstance(result, Failure):
        envelope = getattr(result.value, "envelope", None)
        assert isinstance(envelope, Envelope), result
        return envelope
    assert isinstance(result, Envelope)
    return result


def transportOf(engine: SimulatedEngine) -> MailboxTransport:
    carrier = engine.carrier
    assert isinstance(carrier, MailboxTransport)
    return carrier
