"""
The C{status} extension of the client protocol: snapshots, subscriptions and
what they show, driven without sockets and with a Clock.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.client.connection import DEPTH_INTERVAL, ClientConnection
from rpmiddleware.client.status import (
    HISTORY_SECONDS,
    PUSH_DELAY,
    TICK,
    StatusHub,
    attachHub,
    clientLabel,
    hubFor,
)
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.engine.session import EngineSession
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import exampleCard
from tests.support.client import clockedEndpoint
from tests.support.connections import PORT, FakeClientWriter
from tests.support.engine import FakeWriter as EngineWriter


class Rig:
    """
    A middleware (capacity gate and card cache) on a Clock, its client
    endpoint with a status hub that knows the open connections, and an
    RPEngine session driven by hand.
    """

    def __init__(self) -> None:
        from rpmiddleware.builtin.capacity_gate import capacityGate
        from rpmiddleware.builtin.card_cache import cardCache

        self.clock = Clock()
        self.settings = Settings()
        services = PluginServices(self.clock, self.settings, CardHasher(None), Timeline())
        plugins = [
            capacityGate.buildPlugin({"assume_after": 0.5}, services),
            cardCache.buildPlugin({}, services),
        ]
        self.middleware = Middleware(self.clock, self.settings, plugins, services)
        self.endpoint = clockedEndpoint(self.middleware, self.settings, self.clock)
        self.connections: list[ClientConnection] = []
        self.hub = attachHub(self.endpoint, lambda: self.connections)
        self.engine: EngineSession | None = None
        self.engineWriter = EngineWriter()

    def connect(self, peer: str = "tcp4:127.0.0.1:5000") -> tuple[ClientConnection, Any]:
        writer = FakeClientWriter()
        connection = ClientConnection(self.endpoint, writer, peer)
        connection.opened()
        self.connections.append(connection)
        return connection, writer

    def say(self, connection: ClientConnection, **message: Any) -> None:
        connection.received(json.dumps(message).encode("utf-8"), False)

    def connectEngine(self) -> EngineSession:
        session = self.middleware.newEngineSession(self.engineWriter, "tcp4:127.0.0.1:6000")
        session.received(Envelope.build("hello").fields)
        self.engine = session
        return session

    def engineSays(self, type: str, **fields: Any) -> None:
        assert self.engine is not None
        self.engine.received(Envelope.build(type, self.engine.sessionId, **fields).fields)

    def sentToEngine(self, type: str) -> list[dict[str, Any]]:
        return [m for m in self.engineWriter.sent if m["type"] == type]


def hubCalls(rig: Rig) -> list[Any]:
    """
    The status hub's pending timers (RPEngine's session has its own).
    """
    return [c for c in rig.clock.getDelayedCalls() if "StatusHub" in repr(c)]


class SnapshotTests(SynchronousTestCase):
    def test_oneSnapshot(self) -> None:
        """
        C{{"type": "status"}} is answered with one snapshot of everything the
        console shows, and nothing follows it.
        """
        rig = Rig()
        connection, writer = rig.connect()
        rig.say(connection, type="status")
        [status] = writer.statuses()
        self.assertEqual(
            sorted(status),
            sorted(
                [
                    "type", "time", "server", "engine", "capacity", "queueHistory", "clients",
                    "plugins", "turns", "errors", "you",
                ]
            ),
        )  # fmt: skip
        self.assertEqual(status["server"]["port"], PORT)
        self.assertEqual(
            status["engine"],
            {
                "connected": False,
                "sessionId": None,
                "peer": None,
                "connectedAt": None,
                "link": f"https://rpengine.gemtavern.com/#port={PORT}",
                "problem": None,
            },
        )
        self.assertEqual(status["plugins"], ["capacity-gate", "card-cache"])
        self.assertEqual(
            status["capacity"],
            {
                "acceptingRequests": False,
                "queueDepth": 0,
                "queueLimit": 0,
                "waitingForEngine": 0,
                "heldLocally": 0,
            },
        )
        self.assertEqual(status["turns"], [])
        self.assertEqual(status["errors"], [])
        rig.clock.advance(10 * TICK)
        self.assertEqual(len(writer.statuses()), 1, "no subscription, no updates")
        self.assertEqual(rig.clock.getDelayedCalls(), [])

    def test_clientsWithoutSessionIds(self) -> None:
        """
        Clients are listed under a hash of their session id, never the id
        itself (it is what reconnect takes a session over with); each
        client learns which one it is.
        """
        rig = Rig()
        first, firstWriter = rig.connect("tcp4:127.0.0.1:5001")
        second, _ = rig.connect("tcp4:127.0.0.1:5002")
        rig.say(second, type="character", characterId="mira", card=exampleCard())
        rig.say(first, type="status")
        [status] = firstWriter.statuses()
        self.assertNotIn(first.session.id.encode(), firstWriter.raw[-1])
        self.assertNotIn(second.session.id.encode(), firstWriter.raw[-1])
        self.assertEqual(status["you"], clientLabel(first.session.id))
        self.assertEqual(
            status["clients"],
            [
                {
                    "id": clientLabel(first.session.id),
                    "peer": "tcp4:127.0.0.1:5001",
                    "characterId": None,
                    "turn": None,
                    "subscribed": False,
                    "you": True,
                },
                {
                    "id": clientLabel(second.session.id),
                    "peer": "tcp4:127.0.0.1:5002",
                    "characterId": "mira",
                    "turn": None,
                    "subscribed": False,
                    "you": False,
                },
            ],
        )

    def test_closedClientsLeave(self) -> None:
        rig = Rig()
        first, firstWriter = rig.connect()
        second, _ = rig.connect()
        second.lost()
        rig.say(first, type="status")
        self.assertEqual(len(firstWriter.statuses()[-1]["clients"]), 1)

    def test_invalidSubscribe(self) -> None:
        rig = Rig()
        connection, writer = rig.connect()
        rig.say(connection, type="status", subscribe="yes")
        self.assertEqual(writer.sent[-1]["type"], "error")
        self.assertEqual(writer.sent[-1]["code"], "INVALID_MESSAGE")
        self.assertIn("status.subscribe", writer.sent[-1]["message"])
        self.assertEqual(writer.statuses(), [])

    def test_hubMadeOnDemand(self) -> None:
        """
        An endpoint the console did not set up still answers C{status},
        with a hub made at the first request.
        """
        rig = Rig()
        delattr(rig.endpoint, "statusHub")
        connection, writer = rig.connect()
        rig.say(connection, type="status")
        self.assertIsInstance(hubFor(rig.endpoint), StatusHub)
        self.assertIsNot(hubFor(rig.endpoint), rig.hub)
        self.assertEqual(len(writer.statuses()), 1)


class SubscriptionTests(SynchronousTestCase):
    def test_updates(self) -> None:
        """
        A subscriber gets a snapshot now and another shortly after each
        change (RPEngine connecting, capacity), never two alike.
        """
        rig = Rig()
        connection, writer = rig.connect()
        rig.say(connection, type="status", subscribe=True)
        self.assertEqual(len(writer.statuses()), 1)
        self.assertTrue(writer.statuses()[0]["clients"][0]["subscribed"])
        session = rig.connectEngine()
        self.assertEqual(len(writer.statuses()), 1, "changes are pushed after a short delay")
        rig.clock.advance(PUSH_DELAY)
        status = writer.statuses()[-1]
        self.assertTrue(status["engine"]["connected"])
        self.assertEqual(status["engine"]["sessionId"], session.sessionId)
        self.assertEqual(status["engine"]["peer"], "tcp4:127.0.0.1:6000")
        count = len(writer.statuses())
        rig.clock.advance(5 * TICK)
        self.assertEqual(len(writer.statuses()), count, "nothing changed, nothing sent")
        rig.engineSays("capacity.update", acceptingRequests=True, queueDepth=1, queueLimit=4)
        rig.clock.advance(PUSH_DELAY)
        capacity = writer.statuses()[-1]["capacity"]
        self.assertEqual(
            (capacity["acceptingRequests"], capacity["queueDepth"], capacity["queueLimit"]),
            (True, 1, 4),
        )

    def test_burstsAreCoalesced(self) -> None:
        """
        A streaming reply's envelopes cost at most one snapshot per push delay.
        """
        rig = Rig()
        connection, writer = rig.connect()
        rig.connectEngine()
        rig.say(connection, type="status", subscribe=True)
        before = len(writer.statuses())
        for n in range(20):
            rig.engineSays("reply.accepted", requestId=f"r{n}")
        rig.clock.advance(PUSH_DELAY)
        self.assertLessEqual(len(writer.statuses()) - before, 1)

    def test_unsubscribe(self) -> None:
        rig = Rig()
        connection, writer = rig.connect()
        rig.say(connection, type="status", subscribe=True)
        rig.say(connection, type="status", subscribe=False)
        self.assertEqual(len(writer.statuses()), 1, "unsubscribing sends nothing")
        rig.connectEngine()
        rig.clock.advance(5 * TICK)
        self.assertEqual(len(writer.statuses()), 1)
        self.assertEqual(rig.hub.subscribers, [])
        self.assertEqual(hubCalls(rig), [])

    def test_disconnectedSubscriberForgotten(self) -> None:
        """
        A subscriber whose connection went is dropped at the next look, and
        the hub's timers stop with the last one.
        """
        rig = Rig()
        connection, writer = rig.connect()
        rig.say(connection, type="status", subscribe=True)
        connection.lost()
        rig.clock.advance(TICK)
        self.assertEqual(rig.hub.subscribers, [])
        self.assertEqual(rig.clock.getDelayedCalls(), [])
        self.assertEqual(len(writer.statuses()), 1)

    def test_stop(self) -> None:
        rig = Rig()
        connection, writer = rig.connect()
        rig.say(connection, type="status", subscribe=True)
        rig.hub.stop()
        self.assertEqual(hubCalls(rig), [])
        rig.connectEngine()
        rig.clock.advance(5 * TICK)
        self.assertEqual(len(writer.statuses()), 1)


class TurnTests(SynchronousTestCase):
    def test_turnRow(self) -> None:
        """
        A client's turn shows with its timeline marks, its owner, its card
        transfer (from the card cache's note) and, when it fails, the error
        with the client's code and RPEngine's.
        """
        rig = Rig()
        rig.connectEngine()
        rig.engineSays("capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=4)
        connection, writer = rig.connect()
        rig.say(connection, type="character", characterId="mira", card=exampleCard())
        rig.say(connection, type="text", text="Hello?")
        [request] = rig.sentToEngine("reply.request")
        requestId = request["requestId"]
        rig.say(connection, type="status")
        [turn] = writer.statuses()[-1]["turns"]
        self.assertEqual(turn["requestId"], requestId)
        self.assertEqual(turn["client"], clientLabel(connection.session.id))
        self.assertEqual(turn["characterId"], "mira")
        self.assertEqual(turn["kind"], "reply.request")
        self.assertEqual(turn["cardMode"], "snapshot")
        self.assertGreater(turn["cardBytes"], 500)
        self.assertEqual((turn["outcome"], turn["error"], turn["marks"]), (None, None, {}))
        self.assertEqual(
            writer.statuses()[-1]["clients"][0]["turn"], {"turnId": requestId, "kind": "text"}
        )
        rig.engineSays("reply.accepted", requestId=requestId)
        rig.engineSays("reply.text.delta", requestId=requestId, sequence=0, delta="Well")
        rig.engineSays(
            "request.error",
            requestId=requestId,
            code="request_failed",
            message="the model fell over",
            retryable=True,
        )
        rig.say(connection, type="status")
        status = writer.statuses()[-1]
        [turn] = status["turns"]
        self.assertEqual(sorted(turn["marks"]), ["accepted", "failed", "firstText"])
        self.assertEqual(turn["outcome"], "failed")
        error = {
            "requestId": requestId,
            "code": "LLM_ERROR",
            "engineCode": "request_failed",
            "message": "the model fell over",
            "retryable": True,
        }
        self.assertEqual({k: v for k, v in turn["error"].items() if k != "time"}, error)
        self.assertEqual(
            [{k: v for k, v in e.items() if k != "time"} for e in status["errors"]], [error]
        )
        self.assertIsNone(status["clients"][0]["turn"])

    def test_stageAndTools(self) -> None:
        """
        The playbook's stage and the tool calls of a turn, as the playbook
        notes them on the timeline, reach the status (no arguments or results).
        """
        rig = Rig()
        rig.middleware.registerCharacter("mira", exampleCard())
        stream = rig.middleware.requestReply("mira", text="work?")
        call = {
            "callId": "c1",
            "name": "give_quest",
            "runBy": "client",
            "outcome": "success",
            "durationMs": 12.5,
            "arguments": {"secret": "x"},
            "result": {"quest": "rats"},
        }
        rig.middleware.timeline.note(stream.requestId, stage="offer", tools=[call])
        connection, writer = rig.connect()
        rig.say(connection, type="status")
        [turn] = writer.statuses()[-1]["turns"]
        self.assertEqual(turn["stage"], "offer")
        self.assertEqual(
            turn["tools"],
            [{"callId": "c1", "name": "give_quest", "runBy": "client", "outcome": "success",
              "durationMs": 12.5}],
        )  # fmt: skip

    def test_newestFirst(self) -> None:
        rig = Rig()
        rig.middleware.registerCharacter("mira", exampleCard())
        first = rig.middleware.requestReply("mira", text="one")
        second = rig.middleware.requestReply("mira", text="two")
        connection, writer = rig.connect()
        rig.say(connection, type="status")
        turns = writer.statuses()[-1]["turns"]
        self.assertEqual([t["requestId"] for t in turns], [second.requestId, first.requestId])
        self.assertEqual([t["client"] for t in turns], [None, None])
        capacity = writer.statuses()[-1]["capacity"]
        self.assertEqual(capacity["waitingForEngine"] + capacity["heldLocally"], 2)


class QueueHistoryTests(SynchronousTestCase):
    def test_pointsOnChange(self) -> None:
        """
        The queue history has a point per change of RPEngine's queue (or the
        local waiting line), in server milliseconds, none for repeats.
        """
        rig = Rig()
        rig.clock.advance(100)
        rig.connectEngine()
        rig.clock.advance(1)
        rig.engineSays("capacity.update", acceptingRequests=True, queueDepth=1, queueLimit=4)
        rig.clock.advance(1)
        rig.engineSays("capacity.update", acceptingRequests=True, queueDepth=1, queueLimit=4)
        rig.engineSays("capacity.update", acceptingRequests=True, queueDepth=3, queueLimit=4)
        connection, writer = rig.connect()
        rig.say(connection, type="status")
        self.assertEqual(
            writer.statuses()[-1]["queueHistory"],
            [[0.0, 0.0, 0.0, 0.0], [101000.0, 1.0, 4.0, 0.0], [102000.0, 3.0, 4.0, 0.0]],
        )

    def test_window(self) -> None:
        """
        Points older than the window go, except the last of them: the state
        the window starts in.
        """
        rig = Rig()
        rig.connectEngine()
        for depth in range(1, 4):
            rig.clock.advance(60)
            rig.engineSays(
                "capacity.update", acceptingRequests=True, queueDepth=depth, queueLimit=4
            )
        rig.clock.advance(HISTORY_SECONDS + 90)
        rig.engineSays("capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=4)
        connection, writer = rig.connect()
        rig.say(connection, type="status")
        history = writer.statuses()[-1]["queueHistory"]
        self.assertEqual([p[1] for p in history], [3.0, 0.0])


class CapacityMessageTests(SynchronousTestCase):
    def test_depthAloneCoalesced(self) -> None:
        """
        Moves of RPEngine's queue depth alone reach a client at most every
        DEPTH_INTERVAL, with the latest value; a change of whether RPEngine
        accepts work goes at once.
        """
        rig = Rig()
        rig.connectEngine()
        connection, writer = rig.connect()

        def capacities() -> list[tuple[bool, int]]:
            return [
                (m["acceptingRequests"], m["queueDepth"])
                for m in writer.sent
                if m["type"] == "capacity"
            ]

        rig.engineSays("capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=4)
        self.assertEqual(capacities()[-1], (True, 0))
        before = len(capacities())
        for depth in (1, 2, 3):
            rig.engineSays(
                "capacity.update", acceptingRequests=True, queueDepth=depth, queueLimit=4
            )
        self.assertEqual(len(capacities()), before, "depth moves wait for the interval")
        rig.clock.advance(DEPTH_INTERVAL)
        self.assertEqual(capacities()[before:], [(True, 3)])
        rig.engineSays("capacity.update", acceptingRequests=False, queueDepth=3, queueLimit=4)
        self.assertEqual(capacities()[-1], (False, 3), "not accepting is told at once")
        rig.engineSays("capacity.update", acceptingRequests=False, queueDepth=2, queueLimit=4)
        count = len(capacities())
        connection.lost()
        rig.clock.advance(DEPTH_INTERVAL)
        self.assertEqual(len(capacities()), count, "nothing is sent after the client left")
