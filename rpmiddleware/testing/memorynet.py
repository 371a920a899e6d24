"""
A loopback network in memory, on a clock: the whole middleware (its HTTP
site, the WebSocket upgrade and framing, the client and RPEngine endpoints)
with real Autobahn peers, and no socket and no real time.

L{MemoryNetwork} is a L{MemoryReactorClock} whose TCP connections are
completed in memory (L{twisted.test.iosim}): everything given its
C{reactor} listens and connects as on the real reactor, and
L{MemoryNetwork.run} runs the simulated event loop (deliver the bytes
written, run the calls due, advance the clock to the next scheduled call)
until a L{Deferred} has its result, as C{asyncio}'s C{run_until_complete}
does.  A test is then deterministic: what happens depends on the order of
events and on simulated time only.

    network = MemoryNetwork()
    live = startMiddleware(network.reactor, Settings())
    engine = network.run(connectSimulator(network.reactor, live.port))
    client = connectClient(network.reactor, live.url("/client/socket"))
    network.run(client.opened)
    client.send({"type": "text", "text": "Hello"})
    reply = network.result(client.nextOfType("reply-complete"))

A test case written with C{inlineCallbacks} runs on the network unchanged
with L{runOnNetwork}: the case says how to run a Deferred (its C{runDeferred}
method), and a live case (real reactor) just returns it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, inlineCallbacks, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IListeningPort
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test.iosim import FakeTransport, IOPump, connect
from twisted.web.client import Agent
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

T = TypeVar("T")

#: Simulated seconds L{MemoryNetwork.run} waits for a result by default.
DEFAULT_LIMIT = 300.0
#: The most bytes one C{dataReceived} gets (a socket read's size).
READ_SIZE = 65536
#: Rounds of delivery at one instant before the network is deemed stuck in
#: a loop that never lets time pass.
MAX_ROUNDS = 100_000


@implementer(IAgentEndpointFactory)
class _TCPEndpoints:
    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor

    def endpointForURI(self, uri: Any) -> TCP4ClientEndpoint:
        return TCP4ClientEndpoint(self.reactor, uri.host.decode("ascii"), uri.port)


class NetworkStuck(AssertionError):
    """
    What a test waited for never happened: nothing was left to run, or the
    simulated time limit passed.
    """


@implementer(IListeningPort)
class _Port:
    """
    A listener of L{NetworkReactor}: stopping it stops accepting.
    """

    def __init__(self, reactor: NetworkReactor, entry: tuple[Any, ...], address: IPv4Address):
        self.reactor = reactor
        self.entry = entry
        self.address = address

    def startListening(self) -> None:
        pass

    def stopListening(self) -> Deferred[None]:
        if self.entry in self.reactor.tcpServers:
            self.reactor.tcpServers.remove(self.entry)
            self.entry[1].doStop()
        return succeed(None)

    def getHost(self) -> IPv4Address:
        return self.address


class NetworkReactor(MemoryReactorClock):
    """
    A L{MemoryReactorClock} that, like the kernel, gives a listener on port
    0 a port of its own (so that clients can name it in a URL), and whose
    listeners start and stop their factories and stop accepting when
    stopped.
    """

    def __init__(self) -> None:
        super().__init__()
        self._nextPort = 40000

    def freePort(self) -> int:
        port, self._nextPort = self._nextPort, self._nextPort + 1
        return port

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        if port == 0:
            port = self.freePort()
        entry = (port, factory, backlog, interface)
        self.tcpServers.append(entry)
        factory.doStart()
        return _Port(self, entry, IPv4Address("TCP", interface or "0.0.0.0", port))


class MemoryNetwork:
    """
    A reactor (L{MemoryReactorClock}) whose TCP connections are joined in
    memory, and the loop that runs it.

    @ivar reactor: give it to whatever would listen, connect or schedule.
    @ivar pumps: the open connections' L{IOPump}s.
    """

    def __init__(self) -> None:
        self.reactor = NetworkReactor()
        self.pumps: list[IOPump] = []

    def agent(self) -> Agent:
        """
        An HTTP client agent (for C{treq}'s C{agent=}) whose connections go
        over this network.
        """
        return Agent.usingEndpointFactory(self.reactor, _TCPEndpoints(self.reactor))

    def seconds(self) -> float:
        return self.reactor.seconds()

    def flush(self) -> None:
        """
        Run everything due now: pending connections are accepted, bytes
        written are delivered (one round trip per round, as the reactor
        would in successive iterations), disconnections are reported, and
        the calls due at the current time run, until nothing moves.
        """
        for _ in range(MAX_ROUNDS):
            moved = False
            while self.reactor.tcpClients:
                self._accept()
                moved = True
            for pump in list(self.pumps):
                if deliver(pump):
                    moved = True
                elif pump.clientIO.disconnected and pump.serverIO.disconnected:
                    self.pumps.remove(pump)
            now = self.reactor.seconds()
            if any(c.getTime() <= now for c in self.reactor.getDelayedCalls()):
                self.reactor.advance(0)
                moved = True
            if not moved:
                return
        raise NetworkStuck(f"still busy after {MAX_ROUNDS} rounds at t={self.seconds():.3f}")

    def _accept(self) -> None:
        """
        The first pending C{connectTCP}: joined to the listener on its port,
        with loopback addresses on both ends, or refused if there is none.
        """
        host, port, clientFactory = self.reactor.tcpClients.pop(0)[:3]
        connector = self.reactor.connectors.pop(0)
        listeners = [entry for entry in self.reactor.tcpServers if entry[0] == port]
        if not listeners:
            clientFactory.clientConnectionFailed(connector, Failure(ConnectionRefusedError()))
            return
        serverFactory = listeners[0][1]
        serverAddress = IPv4Address("TCP", "127.0.0.1", port)
        clientAddress = IPv4Address("TCP", "127.0.0.1", self.reactor.freePort())
        clientProtocol = clientFactory.buildProtocol(serverAddress)
        serverProtocol = serverFactory.buildProtocol(clientAddress)
        self.pumps.append(
            connect(
                serverProtocol,
                FakeTransport(serverProtocol, True, serverAddress, clientAddress),
                clientProtocol,
                FakeTransport(clientProtocol, False, clientAddress, serverAddress),
                greet=False,
                clock=self.reactor,
            )
        )

    def advance(self, seconds: float) -> None:
        """
        Let C{seconds} of simulated time pass, running every call in order
        at its time and delivering what each one writes before the next.
        """
        end = self.reactor.seconds() + seconds
        while True:
            self.flush()
            due = [c.getTime() for c in self.reactor.getDelayedCalls() if c.getTime() <= end]
            if not due:
                break
            self.reactor.advance(max(0.0, min(due) - self.reactor.seconds()))
        self.reactor.advance(max(0.0, end - self.reactor.seconds()))
        self.flush()

    def run(self, d: Deferred[T], limit: float = DEFAULT_LIMIT) -> Deferred[T]:
        """
        Run the network until C{d} has a result (at most C{limit} simulated
        seconds), and return C{d}, which has it.

        @raise NetworkStuck: when nothing is left to run, or C{limit}
            simulated seconds passed, before C{d} fired.
        """
        start = self.reactor.seconds()
        # Not d.called: a Deferred waiting on another one is called, paused.
        done: list[bool] = []

        def finished(result: object) -> object:
            done.append(True)
            return result

        d.addBoth(finished)
        while True:
            self.flush()
            if done:
                return d
            calls = [c.getTime() for c in self.reactor.getDelayedCalls()]
            if not calls:
                raise NetworkStuck(
                    f"waited for {d!r}, and nothing is left to happen (t={self.seconds():.3f})"
                )
            nextCall = min(calls)
            if nextCall - start > limit:
                raise NetworkStuck(f"waited {limit} simulated seconds for {d!r}")
            self.reactor.advance(max(0.0, nextCall - self.reactor.seconds()))

    def result(self, d: Deferred[T], limit: float = DEFAULT_LIMIT) -> T:
        """
        L{run} C{d} and return its result, or raise its failure.
        """
        box: list[Any] = []
        self.run(d, limit).addBoth(box.append)
        outcome = box[0]
        if isinstance(outcome, Failure):
            outcome.raiseException()
        return outcome  # type: ignore[no-any-return]


def deliver(pump: IOPump) -> bool:
    """
    One round of L{IOPump.pump}, as sockets would do it: each side's bytes
    delivered in reads of at most L{READ_SIZE} (Autobahn's frame parser is
    quadratic in the bytes of one read), nothing delivered to a side whose
    connection is lost, and a side that closes learns it at once (its own
    C{connectionLost}), its peer one round later (it reads the end of the
    stream).  Returns whether anything moved.
    """
    server, client = pump.serverIO, pump.clientIO
    toServer = client.getOutBuffer() or b""
    toClient = server.getOutBuffer() or b""
    client._checkProducer()
    server._checkProducer()
    for data, side in ((toServer, server), (toClient, client)):
        if side.disconnected:
            continue
        for start in range(0, len(data), READ_SIZE):
            side.bufferReceived(data[start : start + READ_SIZE])
    if toServer or toClient:
        return True
    for side, peer in ((server, client), (client, server)):
        if side.disconnecting and not side.disconnected:
            side.disconnected = True
            side.reportDisconnect()
            if not peer.disconnected:
                peer.disconnecting = True
            return True
    return False


def runOnNetwork(
    method: Callable[..., Generator[Any, Any, T]],
) -> Callable[..., Deferred[T]]:
    """
    A test method written with C{inlineCallbacks}, whose Deferred the case
    runs with its C{runDeferred(d)} method: a case on a L{MemoryNetwork} runs
    the network until it fires (see L{MemoryNetwork.run}), a live case
    returns it for trial to wait on.  The same test body then runs either
    way.
    """
    inline = inlineCallbacks(method)

    @functools.wraps(method)
    def test(self: Any, *args: Any, **kwargs: Any) -> Deferred[T]:
        d: Deferred[T] = self.runDeferred(inline(self, *args, **kwargs))
        return d

    return test
