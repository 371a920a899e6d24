"""
What a plugin gives clients without a message type of its own: its C{x-}
fields on the envelopes a turn turns into client messages
(C{docs/client-protocol.md}, I{Unknown and extra fields}); what becomes of
an envelope type no client message is made of; and the status's turn
owner.  No sockets: a client endpoint's connections with fake writers, an
RPEngine session driven by hand, a Clock.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.client.status import attachHub, clientLabel
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.engine.session import EngineSession
from rpmiddleware.plugin.base import ChainPlugin
from rpmiddleware.plugin.clientext import isPluginField, pluginFields
from rpmiddleware.plugin.interfaces import IChainContext, IEnvelopePlugin
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import captureLogEvents, exampleCard, pluginServices
from tests.support.client import clockedEndpoint
from tests.support.connections import FakeClientWriter, OpenConnections
from tests.support.engine import FakeWriter as EngineWriter

TEXT_ONLY = {"modalities": ["text"]}


@implementer(IEnvelopePlugin)
class Tagger(ChainPlugin):
    """Adds C{fields} to every envelope of the types given, toward the game."""

    name = "tagger"

    def __init__(self, **tags: dict[str, Any]) -> None:
        self.tags = tags

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Envelope:
        envelope.fields.update(self.tags.get(envelope.type.replace(".", "_"), {}))
        return envelope


@implementer(IEnvelopePlugin)
class Announcer(ChainPlugin):
    """Sends an envelope of a type of its own toward the game, for every request."""

    name = "announcer"

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Envelope:
        if envelope.type == "reply.request":
            context.sendToGame(Envelope.build("mood.changed", requestId=envelope.requestId))
        return envelope


class Rig:
    def __init__(self, *plugins: Any) -> None:
        self.clock = Clock()
        settings = Settings()
        services = pluginServices(self.clock, settings)
        self.middleware = Middleware(self.clock, settings, list(plugins), services)
        self.endpoint = clockedEndpoint(self.middleware, settings, self.clock)
        self.clients = OpenConnections(self.endpoint, self.clock)
        self.middleware.router.observe(ExtensionBridge(self.clients))
        self.hub = attachHub(self.endpoint, self.clients)
        self.engineWriter = EngineWriter()
        self.engine: EngineSession = self.middleware.newEngineSession(self.engineWriter, "e")
        self.engine.received(Envelope.build("hello").fields)

    def engineSays(self, type: str, **fields: Any) -> None:
        self.engine.received(Envelope.build(type, self.engine.sessionId, **fields).fields)

    def turn(self, text: str = "Hello?") -> tuple[Any, FakeClientWriter, str]:
        """A client with a character says C{text}; RPEngine takes it."""
        connection, writer = self.clients.connect()
        self.clients.say(connection, type="character", characterId="mira", card=exampleCard())
        self.clients.say(connection, type="configure", output=TEXT_ONLY)
        self.clients.say(connection, type="text", text=text)
        request = [m for m in self.engineWriter.sent if m["type"] == "reply.request"][-1]
        requestId = str(request["requestId"])
        self.engineSays("reply.accepted", requestId=requestId)
        return connection, writer, requestId

    def reply(self, requestId: str) -> None:
        self.engineSays("reply.text.delta", requestId=requestId, sequence=0, delta="Well.")
        self.engineSays(
            "reply.text.completed", requestId=requestId, text="Well.", tokenCount=2, elapsedMs=5
        )
        self.engineSays("reply.completed", requestId=requestId, modalities=["text"])


def sent(writer: FakeClientWriter, kind: str) -> list[dict[str, Any]]:
    return [m for m in writer.sent if m["type"] == kind]


class PluginFieldTests(SynchronousTestCase):
    def test_names(self) -> None:
        self.assertTrue(isPluginField("x-mood"))
        self.assertFalse(isPluginField("mood"))
        self.assertEqual(pluginFields({"x-a": 1, "text": "t", "xb": 2}), {"x-a": 1})
        # Names that sort around "x-": only the x- ones count.
        self.assertEqual(pluginFields({"zone": 1, "x-b": 2, "x": 3}), {"x-b": 2})
        self.assertEqual(pluginFields({"x": 1, "w-a": 2, "type": "t"}), {})
        self.assertEqual(pluginFields({}), {})

    def test_onLlmNotInStats(self) -> None:
        """
        A plugin's C{x-} field on reply.text.completed reaches C{llm} (and
        the final C{llm-chunk}), never C{reply-complete.stats}; a field
        without C{x-} counts as RPEngine's, a figure among the statistics.
        """
        rig = Rig(Tagger(reply_text_completed={"x-mood": "calm", "newFigure": 3}))
        _, writer, requestId = rig.turn()
        rig.reply(requestId)
        [llm] = sent(writer, "llm")
        self.assertEqual(
            llm, {"type": "llm", "text": "Well.", "turnId": requestId, "x-mood": "calm"}
        )
        self.assertEqual(sent(writer, "llm-chunk")[-1]["x-mood"], "calm")
        self.assertNotIn("x-mood", sent(writer, "llm-chunk")[0])
        [complete] = sent(writer, "reply-complete")
        self.assertEqual(
            complete["stats"]["text"], {"tokenCount": 2, "elapsedMs": 5, "newFigure": 3}
        )
        self.assertNotIn("x-mood", complete)

    def test_onEveryMessageOfItsEnvelope(self) -> None:
        """
        Fields on reply.completed reach C{reply-complete}; on a delta, its
        C{llm-chunk}; the protocol's own fields are never replaced.
        """
        rig = Rig(
            Tagger(
                reply_completed={"x-scene": "inn"},
                reply_text_delta={"x-beat": 1},
            )
        )
        _, writer, requestId = rig.turn()
        rig.reply(requestId)
        [complete] = sent(writer, "reply-complete")
        self.assertEqual(
            (complete["x-scene"], complete["text"], complete["turnId"]),
            ("inn", "Well.", requestId),
        )
        chunks = sent(writer, "llm-chunk")
        self.assertEqual([c.get("x-beat") for c in chunks], [1, None])
        self.assertNotIn("x-scene", sent(writer, "llm")[0])

    def test_onAnError(self) -> None:
        rig = Rig(Tagger(request_error={"x-why": "a plugin's reason"}))
        _, writer, requestId = rig.turn()
        rig.engineSays(
            "request.error",
            requestId=requestId,
            code="request_failed",
            message="no",
            retryable=False,
        )
        [error] = sent(writer, "error")
        self.assertEqual((error["x-why"], error["turnId"]), ("a plugin's reason", requestId))


class UnknownTypeTests(SynchronousTestCase):
    def test_loggedOnce(self) -> None:
        """
        An envelope of a type no client message is made of (a plugin's own,
        sent toward the game) reaches no WebSocket client: the endpoint logs
        a warning naming the plugin and the type, once, and the turn goes on.
        """
        events = captureLogEvents(self)
        rig = Rig(Announcer())
        _, writer, requestId = rig.turn()
        rig.reply(requestId)
        rig.turn()
        warnings = [e for e in events if e.get("type") == "mood.changed" and "origin" in e]
        self.assertEqual(len(warnings), 1)
        self.assertEqual(warnings[0]["origin"], "announcer")
        self.assertEqual(warnings[0]["log_level"].name, "warn")
        self.assertNotIn("mood.changed", json.dumps(writer.sent))
        self.assertEqual(len(sent(writer, "reply-complete")), 1)

    def test_knownTypesNotReported(self) -> None:
        events = captureLogEvents(self)
        rig = Rig()
        _, _, requestId = rig.turn()
        rig.reply(requestId)
        self.assertEqual([e for e in events if "no client message" in e.get("log_format", "")], [])


class StatusOwnerTests(SynchronousTestCase):
    def test_finishedTurnOfAConnectedClient(self) -> None:
        """
        A turn that began and ended between two snapshots still names the
        client that asked while that client's session lives; the Python
        API's turns name nobody.
        """
        rig = Rig()
        connection, writer, requestId = rig.turn()
        rig.reply(requestId)
        rig.middleware.registerCharacter("mira", exampleCard())
        api = rig.middleware.requestReply("mira", text="From the game.")
        rig.clients.say(connection, type="status")
        turns = sent(writer, "status")[-1]["turns"]
        self.assertEqual(
            [(t["requestId"], t["client"]) for t in turns],
            [(api.requestId, None), (requestId, clientLabel(connection.session.id))],
        )
        self.assertNotIn(connection.session.id, json.dumps(turns))


class HarnessTests(SynchronousTestCase):
    def test_notAPlugin(self) -> None:
        """
        An object that is no plugin is named, with what to do, not "object
        is not iterable"; a ChainPlugin subclass that declares nothing is a
        plugin (ChainPlugin declares IEnvelopePlugin).
        """

        class Undeclared(ChainPlugin):
            name = "undeclared"

        class NotAPlugin:
            name = "not-a-plugin"

        from rpmiddleware.testing.kit import PluginHarness

        for given in (NotAPlugin(), [NotAPlugin()]):
            with self.assertRaises(TypeError) as caught:
                PluginHarness(given)  # type: ignore[arg-type]
            self.assertIn("NotAPlugin", str(caught.exception))
            self.assertIn("subclass rpmiddleware.plugin.ChainPlugin", str(caught.exception))
        self.assertEqual(PluginHarness(Undeclared()).chain.names, ["undeclared"])
