"""
A bare relay between RPEngine and game clients, written the way a new user
would write one with Autobahn on Twisted: default Autobahn options, stdlib
json, no validation, no resampling.

    python relay.py [--port N]

- /rp-engine/socket: the one RPEngine connection (the newest one wins);
- /client/socket: any number of clients.

A client's {"type": "text", "text": ...} becomes a reply.request envelope to
RPEngine with a fresh requestId; RPEngine's reply.text.delta,
reply.audio.chunk and reply.completed for that requestId go back to that
client as llm-chunk, tts-chunk and reply-complete.  Everything else is
ignored.  Prints "PORT n" once listening.

This file shares no code with bench/ or rpmiddleware/.
"""

import argparse
import json
import sys
import uuid
from datetime import UTC, datetime
from typing import cast

from autobahn.twisted.websocket import (
    ConnectionDeny,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from twisted.internet import reactor
from twisted.internet.address import IPv4Address


def now():
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RelayProtocol(WebSocketServerProtocol):
    def onConnect(self, request):
        if request.path == "/rp-engine/socket":
            self.role = "engine"
        elif request.path == "/client/socket":
            self.role = "client"
        else:
            raise ConnectionDeny(404, "not found")

    def onOpen(self):
        relay = self.factory
        if self.role == "engine":
            relay.engine = self
        else:
            relay.clients.add(self)
            self.requests = set()

    def onMessage(self, payload, isBinary):
        if isBinary:
            return
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if self.role == "engine":
            self.factory.fromEngine(message)
        else:
            self.factory.fromClient(self, message)

    def onClose(self, wasClean, code, reason):
        relay = self.factory
        if getattr(self, "role", None) == "engine":
            if relay.engine is self:
                relay.engine = None
        elif getattr(self, "role", None) == "client":
            relay.clients.discard(self)
            for requestId in getattr(self, "requests", ()):
                relay.routes.pop(requestId, None)


class Relay(WebSocketServerFactory):
    protocol = RelayProtocol

    def __init__(self):
        super().__init__()
        self.engine = None
        self.clients = set()
        #: requestId -> the client whose text asked for it.
        self.routes = {}

    def send(self, peer, message):
        # A peer that is closing is not sent to (Autobahn would raise).
        if peer.state == WebSocketServerProtocol.STATE_OPEN:
            peer.sendMessage(json.dumps(message).encode("utf-8"))

    def fromClient(self, client, message):
        if message.get("type") != "text" or self.engine is None:
            return
        requestId = uuid.uuid4().hex
        self.routes[requestId] = client
        client.requests.add(requestId)
        self.send(
            self.engine,
            {
                "protocol": "gemtavern.rp_engine",
                "protocolVersion": 3,
                "type": "reply.request",
                "messageId": uuid.uuid4().hex,
                "sessionId": None,
                "timestamp": now(),
                "requestId": requestId,
                "eventId": uuid.uuid4().hex,
                "integrationId": "relay",
                "characterId": "mira",
                "event": {"text": message.get("text", "")},
                "output": {"modalities": ["text", "audio"], "language": "en"},
            },
        )

    def fromEngine(self, message):
        kind = message.get("type")
        requestId = message.get("requestId")
        client = self.routes.get(requestId)
        if client is None:
            return
        if kind == "reply.text.delta":
            self.send(
                client,
                {
                    "type": "llm-chunk",
                    "content": message.get("delta", ""),
                    "done": False,
                    "turnId": requestId,
                },
            )
        elif kind == "reply.audio.chunk":
            self.send(
                client,
                {
                    "type": "tts-chunk",
                    "format": "pcm",
                    "sampleRate": 44100,
                    "data": message.get("data", ""),
                    "turnId": requestId,
                },
            )
        elif kind == "reply.completed":
            del self.routes[requestId]
            client.requests.discard(requestId)
            self.send(client, {"type": "reply-complete", "turnId": requestId})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    args = parser.parse_args()
    listening = reactor.listenTCP(args.port, Relay(), interface="127.0.0.1")
    # A TCP port listening on 127.0.0.1 has an IPv4 address.
    address = cast(IPv4Address, listening.getHost())
    print(f"PORT {address.port}", flush=True)
    reactor.run()


if __name__ == "__main__":
    sys.exit(main())
