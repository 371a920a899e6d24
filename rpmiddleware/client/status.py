"""
The C{status} extension: what the middleware is doing, for any client.

A client sends C{{"type": "status"}} for one snapshot, or
C{{"type": "status", "subscribe": true}} for one now and another whenever
something changes (at most four a second, and at least once a second while
anything moved), until C{{"type": "status", "subscribe": false}} or the end
of the connection.  The console page is such a client; it gets nothing a
game could not ask for.  C{docs/client-protocol.md} documents the message.

One L{StatusHub} per client endpoint watches the core's view
(L{rpmiddleware.core.view.CoreView}: RPEngine comes and goes, every envelope
from RPEngine: timeline marks, errors), the capacity monitor (queue history
for a chart), and reads the rest when it builds a snapshot: connected
clients, the chain's plugin names, the requests' records with what plugins
noted on them (the card cache's transfer mode and bytes).

A snapshot never carries another client's session id: a session id is what
C{reconnect} takes over a session with.  Clients are named by a short hash of
it instead.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from rpmiddleware import __version__
from rpmiddleware.client.capacity import CapacityMonitor, engineLink
from rpmiddleware.client.settings import Character
from rpmiddleware.client.surface import ClientSurface, Handler
from rpmiddleware.core.view import CoreView, EngineSessionView
from rpmiddleware.protocol.clienterrors import InvalidMessage, clientCode
from rpmiddleware.protocol.envelope import Envelope

#: Turns and errors a snapshot carries, newest first.
STATUS_TURNS = 20
#: Tool calls shown per turn, and the fields shown of each.
STATUS_TOOLS = 8
_TOOL_FIELDS = frozenset({"callId", "name", "runBy", "outcome", "durationMs", "error"})
STATUS_ERRORS = 20
#: How much queue history a snapshot carries, in seconds and points.
HISTORY_SECONDS = 600.0
HISTORY_POINTS = 720
#: Seconds a change waits before it is pushed, so a streaming reply costs at
#: most four snapshots a second.
PUSH_DELAY = 0.25
#: Seconds between looks at what no event announces (clients coming and
#: going, turns being asked, the local queue) while anyone is subscribed.
TICK = 1.0
#: Requests whose errors and owners are remembered for the turns table.
REQUEST_MEMORY = 256
#: Envelopes from RPEngine that change what a snapshot shows.
_CHANGES = frozenset(
    {
        "reply.accepted",
        "reply.text.delta",
        "reply.audio.chunk",
        "reply.completed",
        "reply.cancelled",
        "request.error",
        "voice.capture.state",
    }
)
_SCALARS = (str, int, float, bool, type(None))

Connections = Callable[[], Iterable[ClientSurface]]


class HubParts(Protocol):
    """
    What a hub reads of its client endpoint
    (L{rpmiddleware.client.endpoint.ClientEndpoint} provides it).
    """

    middleware: CoreView
    clock: IReactorTime
    capacity: CapacityMonitor
    defaultCharacter: Character | None


def clientLabel(sessionId: str) -> str:
    """
    The name a status snapshot gives a client: not its session id, which
    would let anyone who reads the status take the session over.
    """
    return hashlib.sha256(sessionId.encode("utf-8")).hexdigest()[:8]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def _remember(memory: OrderedDict[str, Any], key: str, value: Any) -> None:
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > REQUEST_MEMORY:
        memory.popitem(last=False)


class StatusHub:
    """
    The C{status} snapshots of one client endpoint and who gets them.

    @param connections: the endpoint's open connections (default: only
        those subscribed, when the hub was made without the factory).
    """

    log = Logger()

    def __init__(self, endpoint: HubParts, connections: Connections | None = None) -> None:
        self.endpoint = endpoint
        self.middleware = endpoint.middleware
        self.clock = endpoint.clock
        self._connections = connections
        self._subscribers: list[ClientSurface] = []
        self._lastKey: str | None = None
        self._errors: deque[dict[str, Any]] = deque(maxlen=STATUS_ERRORS)
        self._requestErrors: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._history: deque[list[float]] = deque(maxlen=HISTORY_POINTS)
        self._push: IDelayedCall | None = None
        self._tick: IDelayedCall | None = None
        self._stopped = False
        self._stops = [
            self.middleware.observeEnvelopes(self._envelope, _CHANGES),
            endpoint.capacity.listen(self._capacityChanged),
            self.middleware.observeEngine(self._engineChanged),
        ]
        self._sample()

    def _now(self) -> float:
        # The endpoint's clock; a reactor without one (a test's
        # MemoryReactor) gets the wall clock, which is what a reactor uses.
        seconds = getattr(self.clock, "seconds", None)
        return float(seconds()) if callable(seconds) else time.time()

    def stop(self) -> None:
        """
        Stop watching and pushing (the listener is going away).
        """
        self._stopped = True
        for stop in self._stops:
            stop()
        self._stops = []
        self._subscribers = []
        self._cancel()

    def _cancel(self) -> None:
        for call in (self._push, self._tick):
            if call is not None and call.active():
                call.cancel()
        self._push = self._tick = None

    # Subscribers.

    def subscribe(self, connection: ClientSurface) -> None:
        if connection not in self._subscribers:
            self._subscribers.append(connection)
        self.sendTo(connection)
        self._scheduleTick()

    def unsubscribe(self, connection: ClientSurface) -> None:
        if connection in self._subscribers:
            self._subscribers.remove(connection)
        if not self._subscribers:
            self._cancel()

    @property
    def subscribers(self) -> list[ClientSurface]:
        return list(self._subscribers)

    def sendTo(self, connection: ClientSurface) -> None:
        """
        Send C{connection} a snapshot now.
        """
        snapshot = self.snapshot(connection.port)
        connection.send(self._personal(snapshot, connection))

    def _personal(self, snapshot: dict[str, Any], connection: ClientSurface) -> dict[str, Any]:
        you = clientLabel(connection.session.id)
        clients = [{**c, "you": c["id"] == you} for c in snapshot["clients"]]
        return {**snapshot, "you": you, "clients": clients}

    def _live(self) -> list[ClientSurface]:
        self._subscribers = [c for c in self._subscribers if not (c.closed or c.closing)]
        if not self._subscribers:
            self._cancel()
        return self._subscribers

    # What changes.

    def _envelope(self, envelope: Envelope) -> None:
        if self._stopped:
            return
        kind = envelope.type
        if kind == "request.error":
            self._failed(envelope)
        if kind in _CHANGES:
            self._changed()

    def _failed(self, envelope: Envelope) -> None:
        code = str(envelope.get("code") or "request_failed")
        message = envelope.get("message")
        error = {
            "time": _ms(self._now()),
            "requestId": envelope.requestId,
            "code": clientCode(code),
            "engineCode": code,
            "message": message if isinstance(message, str) else "",
            "retryable": envelope.get("retryable") is True,
        }
        self._errors.appendleft(error)
        if envelope.requestId is not None:
            _remember(self._requestErrors, envelope.requestId, error)

    def _capacityChanged(self) -> None:
        if self._stopped:
            return
        self._sample()
        self._changed()

    def _engineChanged(self, session: EngineSessionView | None) -> None:
        if self._stopped:
            return
        self._sample()
        self._changed()

    def _changed(self) -> None:
        if self._push is None and self._subscribers:
            self._push = self.clock.callLater(PUSH_DELAY, self._pushNow)

    def _pushNow(self) -> None:
        self._push = None
        self.flush()

    def _scheduleTick(self) -> None:
        if self._tick is None and self._subscribers and not self._stopped:
            self._tick = self.clock.callLater(TICK, self._ticked)

    def _ticked(self) -> None:
        self._tick = None
        self._sample()
        self.flush()
        self._scheduleTick()

    def flush(self, force: bool = False) -> None:
        """
        Send every subscriber a snapshot, if anything changed since the last.
        """
        subscribers = self._live()
        if not subscribers:
            return
        snapshot = self.snapshot(subscribers[0].port)
        key = json.dumps({k: v for k, v in snapshot.items() if k != "time"}, sort_keys=True)
        if key == self._lastKey and not force:
            return
        self._lastKey = key
        for connection in subscribers:
            if connection.congested:
                # It does not read; it gets the next one when it does.
                continue
            connection.send(self._personal(snapshot, connection))

    # The queue chart.

    def _waiting(self) -> tuple[int, int]:
        """
        Requests waiting in the engine link (no RPEngine) and in the
        plugins that hold work (L{rpmiddleware.plugin.interfaces.IHeldWork}: the
        capacity gate's local queue, a third party's).
        """
        waiting = self.middleware.waiting()
        return waiting.forEngine, waiting.heldLocally

    def _sample(self) -> None:
        capacity = self.endpoint.capacity
        link, gate = self._waiting()
        now = self._now()
        point = [capacity.queueDepth, capacity.queueLimit, link + gate]
        if self._history and self._history[-1][1:] == point:
            return
        self._history.append([_ms(now) or 0.0, *point])
        # Keep one point from before the window: the state it starts in.
        cutoff = (now - HISTORY_SECONDS) * 1000.0
        while len(self._history) > 1 and self._history[1][0] <= cutoff:
            self._history.popleft()

    # The snapshot.

    def connections(self) -> list[ClientSurface]:
        if self._connections is not None:
            found = list(self._connections())
        else:
            found = list(self._subscribers)
        return [c for c in found if not c.closed]

    def snapshot(self, port: int) -> dict[str, Any]:
        """
        The C{status} message (without the per-client C{you} parts) for a
        client of the listener on C{port}.
        """
        middleware = self.middleware
        session = middleware.engineSession
        capacity = self.endpoint.capacity
        linkWaiting, gateHeld = self._waiting()
        clients = self._clients()
        engine: dict[str, Any] = {
            "connected": session is not None,
            "sessionId": session.sessionId if session is not None else None,
            "peer": session.peer if session is not None else None,
            "connectedAt": _ms(session.startedAt) if session is not None else None,
            "link": engineLink(port),
            # Why RPEngine is not connected, when known (file mode: its tab
            # stopped reading the folder); null otherwise.
            "problem": middleware.engineProblem,
        }
        mailbox = middleware.engineMailbox
        if mailbox:
            # RPEngine's file mailbox is served too: the folder to select in
            # RPEngine, and which way the live session came.
            engine["mailbox"] = mailbox
            engine["transport"] = (
                None if session is None else "mailbox" if session.fileMode else "websocket"
            )
        return {
            "type": "status",
            "time": _ms(self._now()),
            "server": {"version": __version__, "port": port},
            "engine": engine,
            "capacity": {
                "acceptingRequests": capacity.acceptingRequests,
                "queueDepth": capacity.queueDepth,
                "queueLimit": capacity.queueLimit,
                "waitingForEngine": linkWaiting,
                "heldLocally": gateHeld,
            },
            "queueHistory": [list(p) for p in self._history],
            "clients": clients,
            "plugins": list(middleware.pluginNames),
            "turns": self._turns(),
            "errors": list(self._errors),
        }

    def _clients(self) -> list[dict[str, Any]]:
        clients = []
        subscribed = set(map(id, self._subscribers))
        for connection in self.connections():
            label = clientLabel(connection.session.id)
            character = connection.session.character or self.endpoint.defaultCharacter
            turn = connection.current
            if turn is not None and not turn.ended:
                _remember(self._owners, turn.id, label)
            clients.append(
                {
                    "id": label,
                    "peer": connection.peer,
                    "characterId": character.characterId if character is not None else None,
                    "turn": (
                        {"turnId": turn.id, "kind": turn.kind}
                        if turn is not None and not turn.ended
                        else None
                    ),
                    "subscribed": id(connection) in subscribed,
                }
            )
        return clients

    def _owner(self, requestId: str, client: str | None) -> str | None:
        """
        The label of the client session that asked for C{requestId}, while
        the endpoint keeps that session (and after, once it was seen);
        C{None} for the Python API's requests.
        """
        sessions = getattr(self.endpoint, "sessions", None)
        if client is not None and sessions is not None and client in sessions:
            _remember(self._owners, requestId, clientLabel(client))
        return self._owners.get(requestId)

    def _turns(self) -> list[dict[str, Any]]:
        turns = []
        for entry in reversed(self.middleware.recentTurns()[-STATUS_TURNS:]):
            described = entry.asDict()
            marks = described.pop("marks")
            requestId = described.pop("requestId")
            details: dict[str, Any] = {
                k: v for k, v in described.items() if isinstance(v, _SCALARS)
            }
            tools = described.get("tools")
            if isinstance(tools, list):
                # The playbook's tool calls of this turn, flattened to what the
                # console shows: never their arguments or results.
                details["tools"] = [
                    {k: v for k, v in call.items() if k in _TOOL_FIELDS}
                    for call in tools[-STATUS_TOOLS:]
                    if isinstance(call, dict)
                ]
            memory = described.get("memory")
            if isinstance(memory, dict):
                details["memory"] = promptSummary(memory)
            scene = described.get("scene")
            if isinstance(scene, dict):
                # A scene's turn: its cast and who spoke, by name.
                details["scene"] = {
                    k: scene[k] for k in ("sceneId", "cast", "speakers") if k in scene
                }
            outcome = next(
                (name for name in ("completed", "cancelled", "failed") if name in marks), None
            )
            turns.append(
                {
                    **details,
                    "requestId": requestId,
                    "client": self._owner(requestId, entry.client),
                    "marks": marks,
                    "outcome": outcome,
                    "error": self._requestErrors.get(requestId),
                }
            )
        return turns


def hubFor(endpoint: HubParts) -> StatusHub:
    """
    The endpoint's hub, made now if the listener did not attach one.
    """
    hub = getattr(endpoint, "statusHub", None)
    if not isinstance(hub, StatusHub):
        hub = attachHub(endpoint)
    return hub


def attachHub(endpoint: HubParts, connections: Connections | None = None) -> StatusHub:
    """
    Give C{endpoint} its hub, watching from now on (the queue chart starts
    here).
    """
    hub = StatusHub(endpoint, connections)
    setattr(endpoint, "statusHub", hub)  # noqa: B010 - the dataclass has no such field
    return hub


def statusHandler(endpoint: HubParts) -> Handler:
    """
    The C{status} message's handler for C{endpoint}'s dispatch table: a
    snapshot now, and with C{subscribe: true} one whenever something
    changes; C{subscribe: false} stops them.  The endpoint's hub is made at
    the first C{status} if the listener did not attach one.
    """

    def handleStatus(client: ClientSurface, message: dict[str, Any]) -> None:
        subscribe = message.get("subscribe")
        if subscribe is not None and not isinstance(subscribe, bool):
            raise InvalidMessage("status.subscribe must be true or false")
        hub = hubFor(endpoint)
        if subscribe is False:
            hub.unsubscribe(client)
        elif subscribe:
            hub.subscribe(client)
        else:
            hub.sendTo(client)

    return handleStatus


def promptSummary(report: dict[str, Any]) -> dict[str, Any]:
    """
    What a turn's model was given, as a plugin that plans prompts (the
    memory plugin) noted it: RPEngine's estimate of each part against its
    limit, never the words themselves.
    """

    def number(value: Any) -> float | int | None:
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    def part(name: str) -> dict[str, Any]:
        value = report.get(name)
        return value if isinstance(value, dict) else {}

    def names(entries: Any) -> list[str]:
        found = entries if isinstance(entries, list) else []
        return [str(e.get("name", ""))[:80] for e in found[:50] if isinstance(e, dict)]

    history, summary, lore = part("history"), part("summary"), part("lore")
    levels = part("attitude").get("levels")
    levels = levels if isinstance(levels, dict) else {}
    blocks = report.get("blocks") if isinstance(report.get("blocks"), list) else []
    return {
        "limit": number(report.get("limit")),
        "estimatedTokens": number(report.get("estimatedTokens")),
        "skipped": str(report["skipped"])[:200] if "skipped" in report else None,
        "blocks": [
            {"id": str(b.get("id"))[:40], "estimatedTokens": number(b.get("estimatedTokens"))}
            for b in (blocks or [])[:20]
            if isinstance(b, dict)
        ],
        "history": {
            k: number(history.get(k)) for k in ("kept", "dropped", "summarized", "estimatedTokens")
        },
        "summaryTokens": number(summary.get("estimatedTokens")) if summary.get("included") else 0,
        "lore": names(lore.get("kept")),
        "loreLeft": names(lore.get("left")),
        # The character's attitude levels the model was told (no stance words).
        "attitude": {str(axis)[:20]: str(level)[:20] for axis, level in list(levels.items())[:8]},
    }
