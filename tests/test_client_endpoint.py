"""
The client endpoint over its WebSocket, in memory on a clock (the real site,
upgrade, origin checks and framing; L{rpmiddleware.testing.memorynet}): the
handshake, pings,
refusals (each answered, the session alive), origins, characters,
configuration, attachments, capacity, and sessions across reconnects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import treq
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rpmiddleware.plugin.interfaces import IEnvelopePlugin
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import connectClient
from rpmiddleware.testing.memorynet import runOnNetwork
from tests.support.client import MemoryClientCase, nextMatching, requestsOf, types, wavBase64

PRODUCTION = "https://rpengine.gemtavern.com"
GAME_PAGE = "http://127.0.0.1:8080"


class HandshakeTests(MemoryClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        client.ice_servers = [{"urls": "stun:stun.example:3478"}]

    @runOnNetwork
    def test_ready(self) -> Any:
        client = yield self.client(character=False)
        ready = client.ready
        self.assertEqual(set(ready), {"type", "id", "protocolVersion", "iceServers"})
        self.assertEqual(ready["protocolVersion"], 1)
        self.assertEqual(ready["iceServers"], [{"urls": "stun:stun.example:3478"}])
        [server] = self.factory.connections
        self.assertEqual(server.connection.session.id, ready["id"])
        other = yield self.client(character=False)
        self.assertNotEqual(other.ready["id"], ready["id"])

    @runOnNetwork
    def test_capacityWithoutEngine(self) -> Any:
        """
        The first capacity message after ready says RPEngine is missing and
        how to open it; when it connects, clients are told.
        """
        client = yield self.client(character=False)
        capacity = client.capacity
        self.assertEqual(
            {k: capacity[k] for k in ("engineConnected", "acceptingRequests", "queueDepth")},
            {"engineConnected": False, "acceptingRequests": False, "queueDepth": 0},
        )
        link = f"https://rpengine.gemtavern.com/#port={self.live.port}"
        self.assertEqual(capacity["engineLink"], link)
        self.assertIn(link, capacity["message"])
        yield self.engine(queueLimit=3)
        update = yield nextMatching(
            client, lambda m: m["type"] == "capacity" and m["acceptingRequests"]
        )
        self.assertEqual(
            update,
            {
                "type": "capacity",
                "engineConnected": True,
                "acceptingRequests": True,
                "queueDepth": 0,
                "queueLimit": 3,
            },
        )

    @runOnNetwork
    def test_capacityFollowsEngine(self) -> Any:
        engine = yield self.engine(queueLimit=2)
        client = yield self.client(character=False)
        self.assertTrue(client.capacity["engineConnected"])
        engine.setAccepting(False)
        update = yield client.nextOfType("capacity")
        self.assertFalse(update["acceptingRequests"])
        self.assertNotIn("message", update)

    @runOnNetwork
    def test_ping(self) -> Any:
        client = yield self.client(character=False)
        for timestamp in (1721000000123, 12.5, 0):
            client.send({"type": "ping", "timestamp": timestamp})
            pong = yield client.next()
            self.assertEqual(pong, {"type": "pong", "timestamp": timestamp})

    @runOnNetwork
    def test_offer(self) -> Any:
        client = yield self.client(character=False)
        client.send({"type": "offer", "signal": {"type": "offer", "sdp": "v=0"}})
        error = yield client.next()
        self.assertEqual(error["code"], "WEBRTC_UNAVAILABLE")
        self.assertIn("audio messages", error["message"])


class MalformedTests(MemoryClientCase):
    @runOnNetwork
    def test_eachAnsweredSessionAlive(self) -> Any:
        """
        Every malformed message gets INVALID_MESSAGE saying what is wrong,
        and the connection and session go on.
        """
        yield self.engine()
        client = yield self.client(character=False)
        cases: list[tuple[Any, str]] = [
            (b"this is not json", "not valid JSON"),
            (b"[1, 2, 3]", "must be a JSON object"),
            (b'"hello"', "must be a JSON object"),
            ({"kind": "text"}, "string type"),
            ({"type": 3}, "string type"),
            ({"type": "dance"}, "unknown message type 'dance'"),
            ({"type": "text"}, "text needs text"),
            ({"type": "text", "text": ["hi"]}, "text.text must be a string, got an array"),
            ({"type": "ping"}, "ping needs timestamp"),
            ({"type": "ping", "timestamp": "now"}, "ping.timestamp must be a number"),
            ({"type": "audio"}, "audio needs data"),
            ({"type": "audio", "data": 12}, "audio.data must be a string"),
            ({"type": "reconnect"}, "reconnect needs sessionId"),
            ({"type": "attachments", "attachments": "x"}, "must be an array"),
            ({"type": "character", "card": {}}, "character needs characterId"),
            ({"type": "character", "characterId": "x", "card": []}, "character.card must be"),
            ({"type": "configure", "output": {"voice": "Q7"}}, "is not a voice"),
            ({"type": "voice-capture"}, "voice-capture needs action"),
            ({"type": "voice-capture", "action": "sing"}, "voice-capture.action must be one of"),
        ]
        for message, words in cases:
            client.send(message)
            error = yield client.next()
            self.assertEqual(error["type"], "error", message)
            self.assertEqual(error["code"], "INVALID_MESSAGE", message)
            self.assertIn(words, error["message"], message)
            self.assertFalse(error["retryable"])
        client.factory.peer.sendMessage(b'{"type": "ping", "timestamp": 1}', isBinary=True)
        error = yield client.next()
        self.assertEqual(error["code"], "INVALID_MESSAGE")
        self.assertIn("binary frames", error["message"])
        client.send({"type": "ping", "timestamp": 5})
        self.assertEqual((yield client.next()), {"type": "pong", "timestamp": 5})
        [server] = self.factory.connections
        self.assertEqual(server.connection.session.id, client.ready["id"])
        self.assertEqual(requestsOf(self.engines[0]), [])

    @runOnNetwork
    def test_noCharacter(self) -> Any:
        engine = yield self.engine()
        client = yield self.client(character=False)
        for message in (
            {"type": "text", "text": "Hello"},
            {"type": "audio", "data": wavBase64(16000, 0.1)},
            {"type": "voice-capture", "action": "start"},
        ):
            client.send(message)
            error = yield client.next()
            self.assertEqual(error["code"], "INVALID_MESSAGE")
            self.assertIn("send a character message first", error["message"])
        self.assertEqual(requestsOf(engine), [])

    @runOnNetwork
    def test_invalidCard(self) -> Any:
        yield self.engine()
        client = yield self.client(character=False)
        card = exampleCard()
        del card["data"]["first_mes"]
        client.send({"type": "character", "characterId": "mira", "card": card})
        error = yield client.next()
        self.assertEqual(error["code"], "INVALID_MESSAGE")
        self.assertIn("data.first_mes is missing", error["message"])
        card = exampleCard()
        card["spec_version"] = "3.0"
        client.send({"type": "character", "characterId": "mira", "card": card})
        error = yield client.next()
        self.assertIn("spec_version", error["message"])

    @runOnNetwork
    def test_badAudio(self) -> Any:
        """
        Audio that cannot be used is refused here with the reason; nothing
        goes upstream.
        """
        engine = yield self.engine()
        client = yield self.client()
        cases = [
            ("@@not base64@@", "INVALID_AUDIO_FORMAT", "not valid base64"),
            ("SUQzAwAAAAAA", "INVALID_AUDIO_FORMAT", "not WAV, WebM or Ogg"),
            (wavBase64(8000, 31.0), "AUDIO_PROCESSING_ERROR", "longer than RPEngine accepts"),
        ]
        for data, code, words in cases:
            client.send({"type": "audio", "data": data})
            error = yield client.next()
            self.assertEqual(error["code"], code)
            self.assertIn(words, error["message"])
        self.assertEqual(requestsOf(engine), [])
        client.send({"type": "ping", "timestamp": 1})
        self.assertEqual((yield client.next())["type"], "pong")


class CharacterAndConfigureTests(MemoryClientCase):
    @runOnNetwork
    def test_characterKeptWithExtensions(self) -> Any:
        """
        The client's card reaches RPEngine whole, unknown fields and
        extensions included.
        """
        engine = yield self.engine()
        client = yield self.client(character=False)
        card = exampleCard(extensions={"mygame": {"mood": "wry"}})
        card["x_custom"] = [1, 2]
        client.send(
            {"type": "character", "characterId": "bram", "integrationId": "tavern", "card": card}
        )
        client.send({"type": "text", "text": "Hello"})
        messages = yield self.turn(client)
        self.assertEqual(types(messages)[-1], "reply-complete")
        [request] = requestsOf(engine)
        self.assertEqual((request["characterId"], request["integrationId"]), ("bram", "tavern"))
        self.assertEqual(request["card"]["mode"], "snapshot")
        self.assertEqual(request["card"]["snapshot"], card)

    @runOnNetwork
    def test_characterCardHashedOnce(self) -> Any:
        """
        The card a client sends is the connection's own: its hash is
        computed for the first turn and found by identity afterwards.
        """
        engine = yield self.engine()
        client = yield self.client(character=False)
        card = exampleCard(name="Bram")
        client.send({"type": "character", "characterId": "bram", "card": card})
        hasher = self.middleware.cards
        before = hasher.computed
        for text in ("Hello", "Again"):
            client.send({"type": "text", "text": text})
            yield self.turn(client)
        self.assertEqual(hasher.computed, before + 1)
        first, second = (request["card"] for request in requestsOf(engine))
        self.assertEqual(first["targetHash"], second["targetHash"])
        self.assertEqual(second["mode"], "reference")

    @runOnNetwork
    def test_configureRefusedChangesNothing(self) -> Any:
        engine = yield self.engine(installedSttLanguages=("en", "ja"))
        client = yield self.client()
        client.send({"type": "configure", "output": {"voice": "M2", "language": "xx"}})
        error = yield client.next()
        self.assertIn("configure.output.language 'xx'", error["message"])
        client.send({"type": "configure", "inputLanguage": "fr"})
        error = yield client.next()
        self.assertIn("inputLanguage 'fr'", error["message"])
        self.assertEqual(requestsOf(engine), [])
        client.send({"type": "configure", "output": {"voice": "M2"}, "inputLanguage": "ja"})
        client.send({"type": "audio", "data": wavBase64(16000, 0.2)})
        messages = yield self.turn(client)
        self.assertEqual(types(messages)[-1], "reply-complete")
        [request] = requestsOf(engine)
        self.assertEqual(request["output"]["audio"]["voice"], "M2")
        self.assertEqual(request["output"]["language"], "en")
        self.assertEqual(request["event"]["audio"]["language"], "ja")


class DefaultCharacterTests(MemoryClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        path = Path(self.mktemp())
        path.write_text(json.dumps(exampleCard(name="Bram")))
        settings.game.default_character = str(path)
        settings.game.default_character_id = "bram"

    @runOnNetwork
    def test_defaultCharacter(self) -> Any:
        engine = yield self.engine()
        client = yield self.client(character=False)
        client.send({"type": "text", "text": "Who are you?"})
        messages = yield self.turn(client)
        self.assertEqual(types(messages)[-1], "reply-complete")
        [request] = requestsOf(engine)
        self.assertEqual(request["characterId"], "bram")
        self.assertEqual(request["card"]["snapshot"]["data"]["name"], "Bram")
        # The Python API knows it too.
        self.assertEqual(self.middleware.character("bram")["data"]["name"], "Bram")


class AttachmentTests(MemoryClientCase):
    @runOnNetwork
    def test_altTextBecomesContext(self) -> Any:
        """
        RPEngine takes no images: the alt text goes with the next turn as
        context, and the client is told what was dropped.
        """
        engine = yield self.engine()
        client = yield self.client()
        client.send(
            {
                "type": "attachments",
                "attachments": [
                    {"data": "data:image/png;base64,iVBORw0KGgo=", "alt": "a map of the coast"},
                    {"data": "https://example.com/x.jpg", "mimeType": "image/jpeg"},
                ],
            }
        )
        ack = yield client.next()
        self.assertEqual(
            {k: ack[k] for k in ("type", "received", "altTextKept", "imagesDropped")},
            {"type": "attachments-ack", "received": 2, "altTextKept": 1, "imagesDropped": 2},
        )
        self.assertIn("RPEngine takes no images", ack["message"])
        client.send({"type": "text", "text": "Where are we?"})
        messages = yield self.turn(client)
        self.assertEqual(messages[0]["text"], "Where are we?")
        client.send({"type": "text", "text": "And now?"})
        yield self.turn(client)
        first, second = requestsOf(engine)
        self.assertEqual(
            first["event"]["text"], "[The player shows an image: a map of the coast]\nWhere are we?"
        )
        # Used once, then gone.
        self.assertEqual(second["event"]["text"], "And now?")

    @runOnNetwork
    def test_withAudio(self) -> Any:
        engine = yield self.engine()
        client = yield self.client()
        client.send(
            {
                "type": "audio",
                "data": wavBase64(16000, 0.2),
                "attachments": [{"data": "x", "alt": "a sword"}],
            }
        )
        ack = yield client.next()
        self.assertEqual(ack["type"], "attachments-ack")
        self.assertIn("goes with this turn", ack["message"])
        messages = yield self.turn(client)
        self.assertEqual(types(messages)[-1], "reply-complete")
        [request] = requestsOf(engine)
        self.assertEqual(request["event"]["text"], "[The player shows an image: a sword]")
        self.assertIn("audio", request["event"])

    @runOnNetwork
    def test_noAlt(self) -> Any:
        client = yield self.client()
        client.send({"type": "attachments", "attachments": [{"data": "x"}]})
        ack = yield client.next()
        self.assertEqual(ack["altTextKept"], 0)
        self.assertIn("nothing of them reaches the character", ack["message"])


class OriginTests(MemoryClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        settings.server.client_origins = [GAME_PAGE]

    @runOnNetwork
    def test_nativeClientWithoutOrigin(self) -> Any:
        client = yield self.client(origin=None, character=False)
        self.assertEqual(client.ready["type"], "ready")

    @runOnNetwork
    def test_configuredOrigin(self) -> Any:
        client = yield self.client(origin=GAME_PAGE, character=False)
        self.assertEqual(client.ready["type"], "ready")

    @runOnNetwork
    def test_foreignOriginRefused(self) -> Any:
        for origin in ("https://evil.example", PRODUCTION):
            client = connectClient(self.reactor, self.live.url("/client/socket"), origin=origin)
            self.addCleanup(client.drop)
            yield self.assertFailure(client.opened, ConnectionError, Exception)
        headers: Any = {
            "Origin": "https://evil.example",
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        }
        response = yield treq.get(
            self.live.url("/client/socket").replace("ws:", "http:"),
            headers=headers,
            agent=self.agent(),
        )
        self.assertEqual(response.code, 403)
        yield response.content()
        self.assertEqual(self.factory.connections, set())


class ReconnectTests(MemoryClientCase):
    @runOnNetwork
    def test_withHistory(self) -> Any:
        """
        A client that comes back finds its session: character, history and
        all.
        """
        engine = yield self.engine()
        first = yield self.client()
        first.send({"type": "text", "text": "Remember the blue door."})
        messages = yield self.turn(first)
        reply = messages[-1]["text"]
        second = yield self.reconnectAfterDrop(first, historyRecovered=True)
        history = yield second.next()
        self.assertEqual(history["type"], "history")
        turnId = messages[0]["turnId"]
        self.assertEqual(
            history["entries"],
            [
                {
                    "role": "player",
                    "text": "Remember the blue door.",
                    "turnId": turnId,
                    "source": "text",
                },
                {
                    "role": "character",
                    "text": reply,
                    "outcome": "completed",
                    "turnId": turnId,
                    "source": "text",
                },
            ],
        )
        # The session's character came back with it.
        second.send({"type": "text", "text": "Which door?"})
        again = yield self.turn(second)
        self.assertEqual(types(again)[-1], "reply-complete")
        self.assertEqual(requestsOf(engine)[-1]["characterId"], "mira")

    @inlineCallbacks
    def reconnectAfterDrop(self, first: Any, historyRecovered: bool) -> Any:
        """
        Drop C{first}, reconnect its session from a new client, check the
        C{reconnect-ack}, and return the new client.
        """
        sessionId = first.ready["id"]
        first.drop()
        yield first.closed
        second = yield self.client(character=False)
        second.send({"type": "reconnect", "sessionId": sessionId})
        ack = yield second.next()
        self.assertEqual(
            ack,
            {
                "type": "reconnect-ack",
                "success": True,
                "sessionId": sessionId,
                "historyRecovered": historyRecovered,
            },
        )
        return second

    @runOnNetwork
    def test_withoutHistory(self) -> Any:
        first = yield self.client()
        second = yield self.reconnectAfterDrop(first, historyRecovered=False)
        second.send({"type": "ping", "timestamp": 1})
        self.assertEqual((yield second.next())["type"], "pong")

    @runOnNetwork
    def test_unknown(self) -> Any:
        client = yield self.client(character=False)
        client.send({"type": "reconnect", "sessionId": "no-such-session"})
        error = yield client.next()
        self.assertEqual(error["code"], "SESSION_NOT_FOUND")
        ack = yield client.next()
        self.assertEqual(
            ack,
            {
                "type": "reconnect-ack",
                "success": False,
                "sessionId": client.ready["id"],
                "historyRecovered": False,
            },
        )

    @runOnNetwork
    def test_ownId(self) -> Any:
        client = yield self.client(character=False)
        client.send({"type": "reconnect", "sessionId": client.ready["id"]})
        ack = yield client.next()
        self.assertTrue(ack["success"])
        self.assertEqual(ack["sessionId"], client.ready["id"])

    @runOnNetwork
    def test_takeOver(self) -> Any:
        """
        Resuming a session whose connection is still open closes that one.
        """
        first = yield self.client()
        second = yield self.client(character=False)
        second.send({"type": "reconnect", "sessionId": first.ready["id"]})
        ack = yield second.next()
        self.assertTrue(ack["success"])
        code, reason = yield first.closed
        self.assertEqual(code, 4001)
        self.assertIn("resumed by another connection", reason)
        [server] = self.factory.connections
        self.assertEqual(server.connection.session.id, first.ready["id"])
        self.assertIs(server.connection.session.owner, server.connection)


class ExpiryTests(MemoryClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        client.session_ttl = 0.0

    @runOnNetwork
    def test_expired(self) -> Any:
        first = yield self.client()
        sessionId = first.ready["id"]
        first.drop()
        yield first.closed
        second = yield self.client(character=False)
        second.send({"type": "reconnect", "sessionId": sessionId})
        error = yield second.next()
        self.assertEqual(error["code"], "SESSION_EXPIRED")
        ack = yield second.next()
        self.assertEqual(
            ack,
            {
                "type": "reconnect-ack",
                "success": False,
                "sessionId": second.ready["id"],
                "historyRecovered": False,
            },
        )


# Without sockets: one connection driven by hand on a Clock, RPEngine's
# answers delivered at the game end of the chain in RPEngine's shapes.

SCENE = {
    "kind": "location",
    "family": "tavern",
    "label": "The Drowned Rat",
    "sceneLine": "A smoky tavern at dusk.",
    "priority": 2,
}
DIRECTIVE = {
    "protocolVersion": 1,
    "sceneContext": "Stay in the tavern.",
    "autoEventGuide": "React briefly.",
    "directUserGuide": "Answer the player.",
}
RULES = {
    "mode": "buffered",
    "rules": [
        {
            "id": "mood",
            "matcher": {"type": "regex", "pattern": r"\[mood:(\w+)\]"},
            "captureGroup": 1,
            "occurrence": "last",
            "remove": "match",
            "removeFrom": ["text", "audio"],
        }
    ],
}


@implementer(IEnvelopePlugin)
class Upstream:
    """
    The engine end of the chain, standing in for a connected RPEngine: it
    keeps every envelope that would go to RPEngine, checks each with
    RPEngine's own rules (the test fails on one RPEngine would refuse), and
    sends nothing further.
    """

    name = "upstream"

    def __init__(self) -> None:
        self.envelopes: list[Any] = []

    def envelopeToEngine(self, envelope: Any, context: Any) -> None:
        from rpmiddleware.protocol.rules import checkEnvelope

        checkEnvelope({**envelope.fields, "messageId": "m", "timestamp": "t"})
        self.envelopes.append(envelope)
        return None

    def envelopeToGame(self, envelope: Any, context: Any) -> Any:
        return envelope

    def engineSessionStarted(self, session: Any, context: Any) -> None:
        pass

    def engineSessionEnded(self, session: Any, context: Any) -> None:
        pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [dict(e.fields) for e in self.envelopes if e.type == kind]


class ConnectionRig:
    """
    A middleware on a Clock whose chain ends in L{Upstream} (what would go
    to RPEngine is kept there), and connections of its client endpoint with
    fake writers.  RPEngine's answers are delivered at the game end.
    """

    def __init__(self, configure: Any = None) -> None:
        from twisted.internet.task import Clock

        from rpmiddleware.cards.validation import CardHasher
        from rpmiddleware.config.settings import Settings
        from rpmiddleware.core.middleware import Middleware
        from rpmiddleware.plugin import PluginServices
        from rpmiddleware.protocol.timeline import Timeline
        from tests.support.client import clockedEndpoint

        self.clock = Clock()
        self.settings = Settings()
        if configure is not None:
            configure(self.settings)
        services = PluginServices(self.clock, self.settings, CardHasher(None), Timeline())
        self.upstream = Upstream()
        self.middleware = Middleware(self.clock, self.settings, [self.upstream], services)
        self.endpoint = clockedEndpoint(self.middleware, self.settings, self.clock)

    def connect(self, character: bool = True) -> tuple[Any, Any]:
        from rpmiddleware.client.connection import ClientConnection
        from tests.support.connections import FakeClientWriter

        writer = FakeClientWriter()
        connection = ClientConnection(self.endpoint, writer, "tcp4:127.0.0.1:5000")
        connection.opened()
        if character:
            self.say(connection, type="character", characterId="mira", card=exampleCard())
        return connection, writer

    def say(self, connection: Any, reply: Any = None, **message: Any) -> None:
        connection.received(json.dumps(message).encode("utf-8"), False, reply)
        self.clock.advance(0)

    def answer(self, requestId: str, type: str, **fields: Any) -> None:
        from rpmiddleware.protocol.envelope import Envelope

        self.middleware.router.deliver(Envelope.build(type, "s", requestId=requestId, **fields))
        self.clock.advance(0)


def payload(writer: Any) -> list[dict[str, Any]]:
    """
    What a client was sent, less ready and capacity.
    """
    return [m for m in writer.sent if m["type"] not in ("ready", "capacity")]


def lastError(writer: Any) -> dict[str, Any]:
    errors = [m for m in writer.sent if m["type"] == "error"]
    assert errors, "no error was sent"
    return errors[-1]


class ConfigureReachesRPEngineTests(SynchronousTestCase):
    def test_everyOptionInRPEngineShape(self) -> None:
        """
        What configure sets reaches reply.request in RPEngine's shapes:
        output.language, output.audio.processing.profile,
        output.responseProcessing, player.displayName and the three prompt
        fields.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        rig.say(
            connection,
            type="configure",
            output={
                "language": "de",
                "voice": "M2",
                "audioProcessing": "narrowband_voice",
                "responseProcessing": RULES,
            },
            player={"displayName": "Ada"},
            interactionMode="direct_user",
            promptScene=SCENE,
            promptDirective=DIRECTIVE,
        )
        self.assertEqual(payload(writer), [])
        rig.say(connection, type="text", text="Hello")
        [request] = rig.upstream.of("reply.request")
        self.assertEqual(
            request["output"],
            {
                "modalities": ["text", "audio"],
                "language": "de",
                "audio": {
                    "model": "gemtavern-supertonic-3",
                    "voice": "M2",
                    "format": "pcm_s16le",
                    "processing": {"profile": "narrowband_voice"},
                },
                "responseProcessing": RULES,
            },
        )
        self.assertEqual(request["player"], {"displayName": "Ada"})
        self.assertEqual(
            (request["interactionMode"], request["promptScene"], request["promptDirective"]),
            ("direct_user", SCENE, DIRECTIVE),
        )
        self.assertEqual(request["event"], {"text": "Hello"})

    def test_refusedWithTheField(self) -> None:
        """
        A configure RPEngine's rules would refuse is refused at once with
        INVALID_MESSAGE naming the field, and changes nothing.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        cases: list[tuple[dict[str, Any], str]] = [
            (
                {"promptScene": SCENE},
                "configure.interactionMode is missing: interactionMode, promptScene and "
                "promptDirective go together",
            ),
            (
                {
                    "interactionMode": "direct_user",
                    "promptScene": {**SCENE, "priority": None},
                    "promptDirective": DIRECTIVE,
                    "output": {"voice": "F3"},
                },
                "configure.promptScene.priority must be a finite number",
            ),
            (
                {"output": {"responseProcessing": {**RULES, "rules": []}}},
                "configure.output.responseProcessing.rules must hold 1 to 8 rules",
            ),
        ]
        for fields, words in cases:
            rig.say(connection, type="configure", **fields)
            error = lastError(writer)
            self.assertEqual(
                error,
                {"type": "error", "code": "INVALID_MESSAGE", "message": words, "retryable": False},
            )
        self.assertEqual(connection.session.config, type(connection.session.config)())

    def test_turnOptionsForOneTurn(self) -> None:
        """
        A text turn's options apply to it alone, over the session's
        configuration; the next turn plays with the configuration again.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        rig.say(connection, type="configure", output={"language": "fr"})
        rig.say(
            connection,
            type="text",
            text="Hello",
            options={
                "output": {"modalities": ["text"], "responseProcessing": RULES},
                "player": {"displayName": "Kai"},
            },
        )
        rig.say(connection, type="text", text="Again")
        first, second = rig.upstream.of("reply.request")
        self.assertEqual(
            first["output"],
            {"modalities": ["text"], "language": "fr", "responseProcessing": RULES},
        )
        self.assertEqual(first["player"], {"displayName": "Kai"})
        self.assertEqual(second["output"]["modalities"], ["text", "audio"])
        self.assertEqual(second["output"]["language"], "fr")
        self.assertNotIn("responseProcessing", second["output"])
        self.assertEqual(second["player"], {"displayName": "Player"})

    def test_badTurnOptionsRefused(self) -> None:
        rig = ConnectionRig()
        connection, writer = rig.connect()
        rig.say(connection, type="text", text="Hello", options={"promptDirective": DIRECTIVE})
        self.assertIn("text.options.interactionMode is missing", lastError(writer)["message"])
        rig.say(connection, type="text", text="Hello", options={"bargeIn": False})
        self.assertIn("text.options has unknown field 'bargeIn'", lastError(writer)["message"])
        self.assertEqual(rig.upstream.of("reply.request"), [])
        self.assertIsNone(connection.current)

    def test_queuedTurnKeepsItsConfiguration(self) -> None:
        """
        A turn waiting behind another (barge-in off) plays with the
        configuration in force when it was sent.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        rig.say(connection, type="configure", bargeIn=False, output={"voice": "M1"})
        rig.say(connection, type="text", text="One")
        rig.say(connection, type="text", text="Two")
        rig.say(connection, type="configure", output={"voice": "M5"})
        [first] = rig.upstream.of("reply.request")
        rig.answer(first["requestId"], "reply.completed", modalities=["text", "audio"])
        second = rig.upstream.of("reply.request")[1]
        self.assertEqual(second["output"]["audio"]["voice"], "M1")


class VoiceCaptureConnectionTests(SynchronousTestCase):
    def start(self, rig: ConnectionRig, connection: Any, **fields: Any) -> dict[str, Any]:
        rig.say(connection, type="voice-capture", action="start", **fields)
        return rig.upstream.of("voice.capture.start")[-1]

    def test_startAsksForTheTranscript(self) -> None:
        """
        voice.capture.start always asks for the transcript, and carries the
        silenceBehavior of the turn, else of configure, else "error".
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        request = self.start(rig, connection)
        self.assertIs(request["returnTranscript"], True)
        self.assertEqual(request["silenceBehavior"], "error")
        rig.say(connection, type="voice-capture", action="cancel")
        rig.say(connection, type="configure", silenceBehavior="restart")
        self.assertEqual(self.start(rig, connection)["silenceBehavior"], "restart")
        rig.say(connection, type="voice-capture", action="cancel")
        request = self.start(rig, connection, silenceBehavior="error")
        self.assertEqual(request["silenceBehavior"], "error")
        rig.say(connection, type="voice-capture", action="cancel")
        request = self.start(rig, connection, options={"output": {"language": "ja"}})
        self.assertEqual(request["output"]["language"], "ja")
        self.assertEqual(request["silenceBehavior"], "restart")

    def test_secondCaptureRefusedHere(self) -> None:
        """
        A second voice-capture start while this client's capture runs is
        refused at once, naming the turn; the capture goes on.  Once the
        words are in (the reply is being made), a new capture barges in.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        first = self.start(rig, connection)["requestId"]
        rig.answer(first, "reply.accepted", eventId="e", resolvedCardHash="h", queueDepth=0)
        rig.answer(first, "voice.capture.state", state="speech_started", seconds=0.5)
        rig.say(connection, type="voice-capture", action="start")
        error = lastError(writer)
        self.assertEqual(error["code"], "INVALID_MESSAGE")
        self.assertEqual(
            error["message"],
            f"voice-capture start: a voice capture is already in progress (turn {first}); "
            "send voice-capture stop or cancel first",
        )
        self.assertEqual(len(rig.upstream.of("voice.capture.start")), 1)
        self.assertEqual(rig.upstream.of("voice.capture.cancel"), [])
        self.assertIs(connection.current.id, first)
        rig.answer(first, "voice.capture.state", state="speech_ended", seconds=1.5)
        rig.say(connection, type="voice-capture", action="start")
        self.assertEqual(len(rig.upstream.of("voice.capture.start")), 1, "still transcribing")
        rig.answer(first, "voice.capture.transcript", text="Hi", language="en", elapsedMs=9.0)
        second = self.start(rig, connection)["requestId"]
        self.assertNotEqual(second, first)
        self.assertEqual([c["requestId"] for c in rig.upstream.of("voice.capture.cancel")], [first])

    def test_stopWhileThePlayerSpeaks(self) -> None:
        """
        stop goes upstream while the microphone is open (also while the
        player speaks); once RPEngine ended the speech itself it has
        nothing to do, and is not an error; with no capture it is refused.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        rig.say(connection, type="voice-capture", action="stop")
        self.assertIn("no voice capture is in progress", lastError(writer)["message"])
        turnId = self.start(rig, connection)["requestId"]
        rig.answer(turnId, "voice.capture.state", state="speech_started", seconds=0.5)
        rig.say(connection, type="voice-capture", action="stop")
        [stop] = rig.upstream.of("voice.capture.stop")
        self.assertEqual(stop["requestId"], turnId)
        # RPEngine reports no speech_ended for a stopped capture: the
        # client is told its speech ended now.
        self.assertEqual(payload(writer)[-1], {"type": "speech-end", "turnId": turnId})
        errors = len([m for m in writer.sent if m["type"] == "error"])
        rig.answer(turnId, "voice.capture.state", state="speech_ended", seconds=1.0)
        self.assertEqual([m["type"] for m in payload(writer)].count("speech-end"), 1)
        rig.say(connection, type="voice-capture", action="stop")
        self.assertEqual(len(rig.upstream.of("voice.capture.stop")), 1)
        self.assertEqual(len([m for m in writer.sent if m["type"] == "error"]), errors)
        # Silence with silenceBehavior "restart": listening again, stop works again.
        rig.answer(turnId, "voice.capture.transcript", text="", language="en", elapsedMs=5.0)
        rig.answer(turnId, "voice.capture.state", state="listening", seconds=0)
        rig.say(connection, type="voice-capture", action="stop")
        self.assertEqual(len(rig.upstream.of("voice.capture.stop")), 2)
        # Cancelled, the capture is over for the client at once.
        rig.say(connection, type="voice-capture", action="cancel")
        self.assertEqual(payload(writer)[-1], {"type": "tts-cancelled", "turnId": turnId})
        rig.say(connection, type="voice-capture", action="stop")
        self.assertIn("no voice capture is in progress", lastError(writer)["message"])
        self.assertEqual(len(rig.upstream.of("voice.capture.stop")), 2)

    def test_captureToTheClient(self) -> None:
        """
        The whole capture as the client sees it, transcript included, then
        the reply.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        turnId = self.start(rig, connection)["requestId"]
        rig.answer(turnId, "reply.accepted", eventId="e", resolvedCardHash="h", queueDepth=0)
        rig.answer(turnId, "voice.capture.state", state="listening", seconds=0, autoEndEnabled=True)
        rig.answer(turnId, "voice.capture.level", seconds=0.1, peak=0.4, rms=0.1)
        rig.answer(turnId, "voice.capture.state", state="speech_started", seconds=0.3)
        rig.answer(turnId, "voice.capture.state", state="speech_ended", seconds=1.3)
        rig.answer(turnId, "voice.capture.transcript", text="Hello", language="en", elapsedMs=5.0)
        rig.answer(turnId, "reply.text.delta", sequence=0, delta="Hi.")
        rig.answer(turnId, "reply.text.completed", text="Hi.", tokenCount=2, elapsedMs=40.0)
        rig.answer(turnId, "reply.completed", modalities=["text"])
        kinds = [m["type"] for m in payload(writer)]
        self.assertEqual(
            kinds,
            [
                "voice-state",
                "voice-level",
                "voice-state",
                "speech-start",
                "voice-state",
                "speech-end",
                "transcript",
                "llm-chunk",
                "llm-chunk",
                "llm",
                "reply-complete",
            ],
        )
        self.assertEqual(payload(writer)[6]["text"], "Hello")
        history = list(connection.session.history)
        self.assertEqual(history[0]["text"], "Hello")
        self.assertEqual(history[1]["text"], "Hi.")


class TurnEndsTests(SynchronousTestCase):
    def test_unknownCodeEndsTheTurn(self) -> None:
        """
        A turn RPEngine answers with a code this middleware does not know
        is over for the client: the error, then the turn waiting behind it
        starts (barge-in off).
        """
        rig = ConnectionRig()
        connection, writer = rig.connect()
        rig.say(connection, type="configure", bargeIn=False)
        rig.say(connection, type="text", text="One")
        rig.say(connection, type="text", text="Two")
        [first] = rig.upstream.of("reply.request")
        rig.answer(first["requestId"], "reply.accepted", eventId="e", queueDepth=1)
        rig.answer(
            first["requestId"],
            "request.error",
            sourceMessageId="m",
            code="brand_new_code",
            message="something new went wrong",
            retryable=False,
        )
        error = lastError(writer)
        self.assertEqual(
            (error["code"], error["engineCode"], error["turnId"]),
            ("INTERNAL_ERROR", "brand_new_code", first["requestId"]),
        )
        self.assertEqual(payload(writer)[-2]["type"], "tts-cancelled")
        requests = rig.upstream.of("reply.request")
        self.assertEqual(len(requests), 2)
        self.assertEqual(requests[1]["event"], {"text": "Two"})
        self.assertEqual(connection.current.id, requests[1]["requestId"])


class DataChannelPingTests(SynchronousTestCase):
    def test_pongOnTheChannelThePingCameBy(self) -> None:
        """
        A ping that came on the WebRTC data channel is answered there, and
        not on the WebSocket; one on the WebSocket is answered there.
        """
        rig = ConnectionRig()
        connection, writer = rig.connect(character=False)
        channel: list[dict[str, Any]] = []
        rig.say(connection, channel.append, type="ping", timestamp=17)
        self.assertEqual(channel, [{"type": "pong", "timestamp": 17}])
        self.assertEqual(payload(writer), [])
        rig.say(connection, type="ping", timestamp=18)
        self.assertEqual(payload(writer), [{"type": "pong", "timestamp": 18}])
        self.assertEqual(len(channel), 1)
        # Other answers to data-channel messages go the usual way.
        rig.say(connection, channel.append, type="dance")
        self.assertEqual(payload(writer)[-1]["code"], "INVALID_MESSAGE")
