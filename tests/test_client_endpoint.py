"""
The client endpoint over a real loopback socket: the handshake, pings,
refusals (each answered, the session alive), origins, characters,
configuration, attachments, capacity, and sessions across reconnects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import treq
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks

from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import connectClient
from tests.test_client_helpers import (
    LiveClientCase,
    nextMatching,
    requestsOf,
    types,
    wavBase64,
)

PRODUCTION = "https://rpengine.gemtavern.com"
GAME_PAGE = "http://127.0.0.1:8080"


class HandshakeTests(LiveClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        client.ice_servers = [{"urls": "stun:stun.example:3478"}]

    @inlineCallbacks
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

    @inlineCallbacks
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

    @inlineCallbacks
    def test_capacityFollowsEngine(self) -> Any:
        engine = yield self.engine(queueLimit=2)
        client = yield self.client(character=False)
        self.assertTrue(client.capacity["engineConnected"])
        engine.setAccepting(False)
        update = yield client.nextOfType("capacity")
        self.assertFalse(update["acceptingRequests"])
        self.assertNotIn("message", update)

    @inlineCallbacks
    def test_ping(self) -> Any:
        client = yield self.client(character=False)
        for timestamp in (1721000000123, 12.5, 0):
            client.send({"type": "ping", "timestamp": timestamp})
            pong = yield client.next()
            self.assertEqual(pong, {"type": "pong", "timestamp": timestamp})

    @inlineCallbacks
    def test_offer(self) -> Any:
        client = yield self.client(character=False)
        client.send({"type": "offer", "signal": {"type": "offer", "sdp": "v=0"}})
        error = yield client.next()
        self.assertEqual(error["code"], "WEBRTC_UNAVAILABLE")
        self.assertIn("audio messages", error["message"])


class MalformedTests(LiveClientCase):
    @inlineCallbacks
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

    @inlineCallbacks
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

    @inlineCallbacks
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

    @inlineCallbacks
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


class CharacterAndConfigureTests(LiveClientCase):
    @inlineCallbacks
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
        self.assertEqual(request["card"]["card"], card)

    @inlineCallbacks
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

    @inlineCallbacks
    def test_configureRefusedChangesNothing(self) -> Any:
        engine = yield self.engine()
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


class DefaultCharacterTests(LiveClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        path = Path(self.mktemp())
        path.write_text(json.dumps(exampleCard(name="Bram")))
        settings.game.default_character = str(path)
        settings.game.default_character_id = "bram"

    @inlineCallbacks
    def test_defaultCharacter(self) -> Any:
        engine = yield self.engine()
        client = yield self.client(character=False)
        client.send({"type": "text", "text": "Who are you?"})
        messages = yield self.turn(client)
        self.assertEqual(types(messages)[-1], "reply-complete")
        [request] = requestsOf(engine)
        self.assertEqual(request["characterId"], "bram")
        self.assertEqual(request["card"]["card"]["data"]["name"], "Bram")
        # The Python API knows it too.
        self.assertEqual(self.middleware.character("bram")["data"]["name"], "Bram")


class AttachmentTests(LiveClientCase):
    @inlineCallbacks
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

    @inlineCallbacks
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

    @inlineCallbacks
    def test_noAlt(self) -> Any:
        client = yield self.client()
        client.send({"type": "attachments", "attachments": [{"data": "x"}]})
        ack = yield client.next()
        self.assertEqual(ack["altTextKept"], 0)
        self.assertIn("nothing of them reaches the character", ack["message"])


class OriginTests(LiveClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        settings.server.client_origins = [GAME_PAGE]

    @inlineCallbacks
    def test_nativeClientWithoutOrigin(self) -> Any:
        client = yield self.client(origin=None, character=False)
        self.assertEqual(client.ready["type"], "ready")

    @inlineCallbacks
    def test_configuredOrigin(self) -> Any:
        client = yield self.client(origin=GAME_PAGE, character=False)
        self.assertEqual(client.ready["type"], "ready")

    @inlineCallbacks
    def test_foreignOriginRefused(self) -> Any:
        for origin in ("https://evil.example", PRODUCTION):
            client = connectClient(reactor, self.live.url("/client/socket"), origin=origin)
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
            persistent=False,
        )
        self.assertEqual(response.code, 403)
        yield response.content()
        self.assertEqual(self.factory.connections, set())


class ReconnectTests(LiveClientCase):
    @inlineCallbacks
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

    @inlineCallbacks
    def test_withoutHistory(self) -> Any:
        first = yield self.client()
        second = yield self.reconnectAfterDrop(first, historyRecovered=False)
        second.send({"type": "ping", "timestamp": 1})
        self.assertEqual((yield second.next())["type"], "pong")

    @inlineCallbacks
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

    @inlineCallbacks
    def test_ownId(self) -> Any:
        client = yield self.client(character=False)
        client.send({"type": "reconnect", "sessionId": client.ready["id"]})
        ack = yield client.next()
        self.assertTrue(ack["success"])
        self.assertEqual(ack["sessionId"], client.ready["id"])

    @inlineCallbacks
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


class ExpiryTests(LiveClientCase):
    def configure(self, settings: Any, client: Any) -> None:
        client.session_ttl = 0.0

    @inlineCallbacks
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
