"""
Playbooks end to end: a client over the middleware's WebSocket (in memory,
on a clock: L{rpmiddleware.testing.memorynet}), the chain with the playbook
plugin, and the simulated RPEngine.  Every message the client
sees is checked (stage-change, tool-call-start and tool-call-end exactly as
the voice-client protocol defines them), as are the prompt fields that reach
RPEngine at each stage.  The plugin's timers run on a Clock, so idle nudges
and tool timeouts are driven, not waited for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, inlineCallbacks, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from rpmiddleware.builtin.playbook import PlaybookPlugin
from rpmiddleware.builtin.playbook.parser import loadPlaybookFile
from rpmiddleware.builtin.playbook.tools import FunctionTool
from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.client.settings import ClientSettings
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.plugin import PluginServices
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.live import TestClient
from rpmiddleware.testing.memorynet import runOnNetwork
from rpmiddleware.testing.simoptions import defaultReplyText
from tests.support.client import MemoryClientCase, buildChain, requestsOf, types
from tests.support.demo import startFastDemo

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "quest-giver.toml"
QUEST = loadPlaybookFile(EXAMPLE, {})
STAGES = {stage.id: stage for stage in QUEST.stages.values()}
#: The messages of a turn's reply, as opposed to the playbook's.
TURN_TYPES = {"transcript", "llm-chunk", "llm", "tts-start", "tts-chunk", "tts-complete"}
PLAYBOOK_TYPES = {"stage-change", "tool-call-start", "tool-call-end", "playbook-state", "error"}
STORY = "Once upon a time there was a ferry. "


def context(stage: str, mode: str = "direct_user", scene: str | None = None) -> dict[str, Any]:
    """
    The whole prompt context a request in C{stage} carries: the stage's,
    with the game's scene at the end of sceneContext.
    """
    told = STAGES[stage].promptContext(mode)
    assert told is not None
    if scene:
        told["promptDirective"]["sceneContext"] += f"\n\n{scene}"
    return told


def replies(request: dict[str, Any]) -> str:
    """
    A long reply to a turn that asks for a story (still playing when the
    test sends events), the default otherwise.
    """
    event = request.get("event") or {}
    if "story" in str(event.get("text", "")):
        return STORY * 60
    return defaultReplyText(request)


def prompt(request: dict[str, Any]) -> dict[str, Any]:
    return {
        k: request[k] for k in ("interactionMode", "promptScene", "promptDirective") if k in request
    }


def lookup(arguments: dict[str, Any], call: Any) -> dict[str, Any]:
    return {"found": arguments.get("item"), "stage": call.stage}


class PlaybookCase(MemoryClientCase):
    """
    The live rig of the client tests with the playbook plugin nearest the
    game: the quest-giver for C{mira}, a middleware tool C{lookup}, timers on
    C{self.clock}.
    """

    def setUp(self) -> None:
        self.settings = Settings()
        self.clientSettings = ClientSettings()
        self.settings.client = self.clientSettings
        self.clock = Clock()
        self.reactor = self.makeReactor()
        threads: Any = self.reactor
        services = PluginServices(self.reactor, self.settings, CardHasher(threads), Timeline())
        self.playbook = PlaybookPlugin(
            {"mira": QUEST},
            {"lookup": FunctionTool("lookup", lookup, "Looks an item up.")},
            timeline=services.timeline,
            clock=self.clock,
            turnStartTimeout=5.0,
        )
        self.addCleanup(self.playbook.stop)
        plugins = [self.playbook, *buildChain(services)]
        self.middleware = Middleware(self.reactor, self.settings, plugins, services)
        self.startLive()
        self.engines: list[Any] = []

    @inlineCallbacks
    def messagesThrough(self, client: TestClient, *needed: str) -> Any:
        """
        Every message (but capacity) up to the moment each of C{needed} has
        been seen, in order.
        """
        seen: list[dict[str, Any]] = []
        missing = list(needed)
        while missing:
            message = yield client.next()
            if message.get("type") == "capacity":
                continue
            seen.append(message)
            if message.get("type") in missing:
                missing.remove(message["type"])
        return seen

    def split(self, messages: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
        """
        A turn's reply message types, and the playbook's messages.
        """
        turn = [m["type"] for m in messages if m["type"] not in PLAYBOOK_TYPES]
        return turn, [m for m in messages if m["type"] in PLAYBOOK_TYPES]

    def assertReplied(self, kinds: list[str], typed: bool = True) -> None:
        """
        A whole streamed reply (no playbook message inside what the turn says).
        """
        if typed:
            self.assertEqual(kinds[0], "transcript")
        else:
            self.assertNotIn("transcript", kinds)
        self.assertEqual(kinds[-3:], ["tts-chunk", "tts-complete", "reply-complete"])
        self.assertIn("llm", kinds)
        self.assertEqual(set(kinds) - TURN_TYPES, {"reply-complete"})

    def settle(self) -> Deferred[None]:
        """
        Let everything due now happen (the plugin's sends go one reactor
        turn later): every byte written delivered, every call due run.
        """
        self.network.flush()
        return succeed(None)


class QuestGiverTests(PlaybookCase):
    @runOnNetwork
    def test_theWholeQuest(self) -> Any:
        """
        The example playbook, turn by turn: what the client sees and what
        RPEngine is told.
        """
        engine = yield self.engine()
        client = yield self.client()

        # 1. Greeting: the playbook starts with the client's first turn.
        client.send({"type": "text", "text": "Good evening! Any news from the road?"})
        messages = yield self.turn(client)
        kinds, book = self.split(messages)
        self.assertReplied(kinds)
        self.assertEqual(types(messages)[:2], ["transcript", "playbook-state"])
        self.assertEqual(
            book,
            [
                {
                    "type": "playbook-state",
                    "playbook": "quest-giver",
                    "stage": "greeting",
                    "source": "config",
                }
            ],
        )
        [first] = requestsOf(engine)
        self.assertEqual(
            prompt(first),
            context("greeting", "direct_user"),
        )
        self.assertEqual(first["event"], {"text": "Good evening! Any news from the road?"})

        # 2. The player asks about work: stage-change, then the quest tool,
        # which this client (the game) runs.
        client.send({"type": "text", "text": "Do you have any work for me?"})
        messages = yield self.messagesThrough(client, "tool-call-start")
        self.assertEqual(types(messages), ["transcript", "stage-change", "tool-call-start"])
        turnId = messages[0]["turnId"]
        self.assertEqual(
            messages[1],
            {
                "type": "stage-change",
                "from": "greeting",
                "to": "offer",
                "reason": 'player said "work"',
            },
        )
        start = messages[2]
        self.assertEqual(set(start), {"type", "name", "callId", "arguments", "turnId"})
        self.assertEqual(start["turnId"], turnId)
        self.assertEqual(start["name"], "give_quest")
        self.assertEqual(
            start["arguments"],
            {"questId": "cellar-rats", "title": "Rats in the Cellar", "reward": "20 silver"},
        )
        self.assertIsInstance(start["callId"], str)
        self.clock.advance(1.5)
        client.send(
            {
                "type": "tool-result",
                "callId": start["callId"],
                "result": {"questId": "cellar-rats", "status": "offered"},
            }
        )
        messages = yield self.messagesThrough(client, "tool-call-end", "reply-complete")
        kinds, book = self.split(messages)
        self.assertEqual(
            book,
            [
                {
                    "type": "tool-call-end",
                    "callId": start["callId"],
                    "result": {"questId": "cellar-rats", "status": "offered"},
                    "durationMs": 1500,
                    "turnId": turnId,
                }
            ],
        )
        self.assertEqual(kinds[-1], "reply-complete")
        second = requestsOf(engine)[1]
        self.assertEqual(second["requestId"], turnId)
        self.assertEqual(
            prompt(second),
            context("offer", "direct_user"),
        )

        # 3. Accepted.
        client.send({"type": "text", "text": "Aye, I'll clear your cellar."})
        messages = yield self.turn(client)
        kinds, book = self.split(messages)
        self.assertReplied(kinds)
        self.assertEqual(
            book,
            [
                {
                    "type": "stage-change",
                    "from": "offer",
                    "to": "accepted",
                    "reason": 'player said "aye"',
                }
            ],
        )
        self.assertEqual(prompt(requestsOf(engine)[2]), context("accepted"))

        # 4. The game says the cellar is clear: the stage moves and the
        # character reacts in an auto_event turn.
        client.send(
            {
                "type": "event",
                "text": "The player returns: the cellar cleared of rats at last.",
                "replyPolicy": "auto",
            }
        )
        messages = yield self.turn(client)
        kinds, book = self.split(messages)
        self.assertEqual(
            book,
            [
                {
                    "type": "stage-change",
                    "from": "accepted",
                    "to": "rewarded",
                    "reason": 'game event said "cellar cleared"',
                }
            ],
        )
        self.assertReplied(kinds, typed=False)
        fourth = requestsOf(engine)[3]
        self.assertEqual(
            prompt(fourth),
            context("rewarded", "auto_event"),
        )
        self.assertEqual(
            fourth["event"], {"text": "The player returns: the cellar cleared of rats at last."}
        )
        self.assertEqual(len(requestsOf(engine)), 4)

        # What the console reads.
        state = self.playbook.state(client.ready["id"])
        assert state is not None
        self.assertEqual(state["stage"], "rewarded")
        self.assertEqual(
            [(h["from"], h["to"]) for h in state["stageHistory"]],
            [("greeting", "offer"), ("offer", "accepted"), ("accepted", "rewarded")],
        )
        timeline = self.middleware.timeline.get(turnId)
        assert timeline is not None
        self.assertEqual(timeline.details["stage"], "offer")
        [tool] = timeline.details["tools"]
        self.assertEqual(
            {k: tool[k] for k in ("name", "outcome", "durationMs")},
            {"name": "give_quest", "outcome": "success", "durationMs": 1500},
        )

    @runOnNetwork
    def test_idleNudge(self) -> Any:
        """
        20 s of silence (on the Clock) in the greeting: the character speaks
        up in an auto_event turn, at most twice.
        """
        engine = yield self.engine()
        client = yield self.client()
        client.send({"type": "text", "text": "Hello."})
        yield self.turn(client)
        self.clock.advance(19)
        yield self.settle()
        self.clock.advance(1)
        messages = yield self.turn(client)
        kinds, book = self.split(messages)
        self.assertEqual(book, [], "staying in the stage says no stage-change")
        self.assertReplied(kinds, typed=False)
        nudge = requestsOf(engine)[-1]
        self.assertEqual(
            prompt(nudge),
            context("greeting", "auto_event"),
        )
        self.assertEqual(
            nudge["event"],
            {"text": "The traveller has been quiet for a while, nursing their drink."},
        )
        self.clock.advance(20)
        yield self.turn(client)
        self.clock.advance(60)
        yield self.settle()
        self.assertEqual(len(requestsOf(engine)), 3)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    @runOnNetwork
    def test_toolTimesOut(self) -> Any:
        """
        A client that never answers its tool: tool-call-end with the error and
        the duration, TOOL_ERROR, and the playbook's error transition.
        """
        yield self.engine()
        client = yield self.client()
        client.send({"type": "text", "text": "Got any work?"})
        messages = yield self.messagesThrough(client, "tool-call-start", "reply-complete")
        start = [m for m in messages if m["type"] == "tool-call-start"][0]
        self.clock.advance(15)
        messages = yield self.messagesThrough(client, "stage-change")
        self.assertEqual(
            messages,
            [
                {
                    "type": "tool-call-end",
                    "callId": start["callId"],
                    "error": (
                        "tool give_quest: the client sent no tool-result within 15 s; "
                        "the call was abandoned"
                    ),
                    "durationMs": 15000,
                    "turnId": start["turnId"],
                },
                {
                    "type": "error",
                    "code": "TOOL_ERROR",
                    "message": (
                        "tool give_quest: the client sent no tool-result within 15 s; "
                        "the call was abandoned"
                    ),
                    "retryable": False,
                    "callId": start["callId"],
                },
                {
                    "type": "stage-change",
                    "from": "offer",
                    "to": "greeting",
                    "reason": "the game could not give the quest",
                },
            ],
        )
        client.send({"type": "tool-result", "callId": start["callId"], "result": {}})
        late = yield self.messagesThrough(client, "error")
        self.assertEqual(late[0]["code"], "INVALID_MESSAGE")
        self.assertIn("no tool call", late[0]["message"])


class EventTests(PlaybookCase):
    @runOnNetwork
    def test_eventsWhileAReplyPlays(self) -> Any:
        """
        Events that come while a reply plays wait; when it ends they are told
        in one auto_event turn, highest priority first; a replyPolicy none
        event goes with it as context.
        """
        engine = yield self.engine(replyText=replies)
        client = yield self.client()
        client.send({"type": "text", "text": "Tell me a story."})
        client.send({"type": "event", "text": "A cat knocks a mug over.", "replyPolicy": "auto"})
        client.send(
            {"type": "event", "text": "It starts to rain.", "replyPolicy": "none", "scene": "Rain."}
        )
        client.send(
            {
                "type": "event",
                "text": "A wagon crashes outside!",
                "replyPolicy": "auto",
                "priority": 5,
            }
        )
        story = yield self.turn(client)
        self.assertEqual(story[-1]["type"], "reply-complete", "nothing interrupted the story")
        self.assertEqual(engine.cancelled, [])
        reaction = yield self.turn(client)
        kinds, book = self.split(reaction)
        self.assertEqual(book, [])
        self.assertReplied(kinds, typed=False)
        [_, told] = requestsOf(engine)
        self.assertEqual(
            told["event"],
            {"text": "It starts to rain.\nA wagon crashes outside!\nA cat knocks a mug over."},
        )
        self.assertEqual(prompt(told), context("greeting", "auto_event", "Rain."))
        history = [e for e in reaction if e["type"] == "reply-complete"]
        self.assertEqual(len(history), 1)

    @runOnNetwork
    def test_noneEventIsContext(self) -> Any:
        engine = yield self.engine()
        client = yield self.client()
        client.send({"type": "event", "text": "A bell tolls.", "replyPolicy": "none"})
        client.send({"type": "text", "text": "What was that?"})
        messages = yield self.turn(client)
        self.assertEqual(
            messages[0],
            {
                "type": "transcript",
                "text": "What was that?",
                "isFinal": True,
                "turnId": messages[0]["turnId"],
            },
        )
        [request] = requestsOf(engine)
        self.assertEqual(request["event"], {"text": "[Event: A bell tolls.]\nWhat was that?"})

    @runOnNetwork
    def test_eventWithoutCharacter(self) -> Any:
        """
        An auto event from a client that has no character cannot become a
        turn: it is said, and the event waits for the client's next turn.
        """
        yield self.engine()
        client = yield self.client(character=False)
        client.send({"type": "event", "text": "Thunder.", "replyPolicy": "auto"})
        [error] = yield self.messagesThrough(client, "error")
        self.assertEqual(error["code"], "INVALID_MESSAGE")
        self.assertIn("event: send a character message first", error["message"])
        yield self.settle()
        state = self.playbook.state(client.ready["id"])
        assert state is not None
        self.assertTrue(state["away"])
        self.assertEqual([e["text"] for e in state["pendingEvents"]], ["Thunder."])


class ClientPlaybookTests(PlaybookCase):
    @runOnNetwork
    def test_ownPlaybookWithBothKindsOfTool(self) -> Any:
        engine = yield self.engine()
        client = yield self.client()
        client.send(
            {
                "type": "playbook",
                "playbook": {
                    "name": "shop",
                    "tools": {"sell": {"runBy": "client", "timeout": 3}},
                    "stages": {
                        "browse": {
                            "voice": "M3",
                            "promptDirective": {
                                "sceneContext": "A smithy.",
                                "autoEventGuide": "Look up.",
                                "directUserGuide": "Show the wares.",
                            },
                            "transitions": [
                                {
                                    "on": "player",
                                    "keywords": ["buy"],
                                    "to": "sell",
                                    "tools": [
                                        {"name": "lookup", "arguments": {"item": "sword"}},
                                        {"name": "sell", "arguments": {"item": "sword"}},
                                    ],
                                }
                            ],
                        },
                        "sell": {
                            "voice": "M4",
                            "tools": ["lookup", "sell"],
                            "promptDirective": {
                                "sceneContext": "A smithy.",
                                "autoEventGuide": "Look up.",
                                "directUserGuide": "Haggle.",
                            },
                        },
                    },
                },
            }
        )
        [state] = yield self.messagesThrough(client, "playbook-state")
        self.assertEqual(
            state,
            {"type": "playbook-state", "playbook": "shop", "stage": "browse", "source": "client"},
        )
        client.send({"type": "text", "text": "I want to buy a sword."})
        messages = yield self.messagesThrough(
            client, "tool-call-start", "tool-call-end", "tool-call-start"
        )
        book = [m for m in messages if m["type"] in PLAYBOOK_TYPES]
        turnId = next(m["turnId"] for m in messages if m["type"] == "transcript")
        self.assertEqual([m["type"] for m in book], [
            "stage-change", "tool-call-start", "tool-call-end", "tool-call-start",
        ])  # fmt: skip
        self.assertEqual(
            book[1], {"type": "tool-call-start", "name": "lookup", "callId": book[1]["callId"],
                      "arguments": {"item": "sword"}, "turnId": turnId},
        )  # fmt: skip
        self.assertEqual(
            book[2],
            {
                "type": "tool-call-end",
                "callId": book[1]["callId"],
                "result": {"found": "sword", "stage": "sell"},
                "durationMs": 0,
                "turnId": turnId,
            },
        )
        client.send({"type": "tool-result", "callId": book[3]["callId"], "error": "no coin"})
        messages = yield self.messagesThrough(client, "tool-call-end", "error")
        book = [m for m in messages if m["type"] in PLAYBOOK_TYPES]
        self.assertEqual(book[0]["error"], "tool sell failed: no coin")
        self.assertEqual(book[1]["code"], "TOOL_ERROR")
        request = requestsOf(engine)[0]
        self.assertEqual(request["promptDirective"]["directUserGuide"], "Haggle.")
        self.assertEqual(request["output"]["audio"]["voice"], "M4")

    @runOnNetwork
    def test_malformedPlaybook(self) -> Any:
        yield self.engine()
        client = yield self.client()
        client.send(
            {
                "type": "playbook",
                "toml": '[stages.a]\n[[stages.a.transitions]]\non = "idle"\nafter = -3\n',
            }
        )
        [error] = yield self.messagesThrough(client, "error")
        self.assertEqual(error["code"], "PLAYBOOK_ERROR")
        self.assertIn("stage 'a', field transitions[0].after", error["message"])
        self.assertEqual(error["retryable"], False)

    @runOnNetwork
    def test_invalidMessages(self) -> Any:
        client = yield self.client()
        for message, words in [
            ({"type": "event", "text": "x"}, "event needs replyPolicy"),
            ({"type": "event", "text": "x", "replyPolicy": "later"}, "event.replyPolicy"),
            ({"type": "event", "text": "x", "replyPolicy": "auto", "priority": "hi"}, "priority"),
            ({"type": "event", "text": "", "replyPolicy": "auto"}, "event.text must not be"),
            ({"type": "tool-result", "result": 1}, "tool-result needs callId"),
            ({"type": "tool-result", "callId": "c", "result": 1, "error": "e"}, "both"),
            ({"type": "playbook"}, "playbook needs one of"),
            ({"type": "playbook", "playbook": []}, "must be an object or null"),
        ]:
            client.send(message)
            [error] = yield self.messagesThrough(client, "error")
            self.assertEqual(error["code"], "INVALID_MESSAGE", message)
            self.assertIn(words, error["message"])

    @runOnNetwork
    def test_stateSurvivesReconnect(self) -> Any:
        """
        The playbook state belongs to the session: a client that comes back
        with reconnect is told its stage, and carries on in it.
        """
        engine = yield self.engine()
        first = yield self.client()
        sessionId = first.ready["id"]
        first.send({"type": "text", "text": "Any work?"})
        yield self.messagesThrough(first, "tool-call-start", "reply-complete")
        first.drop()
        yield first.closed
        second = yield self.client(character=False)
        second.send({"type": "reconnect", "sessionId": sessionId})
        resumed = yield self.messagesThrough(second, "reconnect-ack", "stage-change")
        self.assertEqual([m["type"] for m in resumed], ["reconnect-ack", "history", "stage-change"])
        self.assertTrue(resumed[0]["success"])
        self.assertEqual(
            resumed[-1],
            {"type": "stage-change", "from": "offer", "to": "offer", "reason": "session resumed"},
        )
        second.send({"type": "text", "text": "Nay, not today."})
        messages = yield self.turn(second)
        kinds, book = self.split(messages)
        self.assertEqual(
            book,
            [
                {
                    "type": "stage-change",
                    "from": "offer",
                    "to": "refused",
                    "reason": 'player said "nay"',
                }
            ],
        )
        self.assertEqual(prompt(requestsOf(engine)[-1]), context("refused"))


class WithoutThePluginTests(MemoryClientCase):
    @runOnNetwork
    def test_refused(self) -> Any:
        """
        With the playbook plugin out of the chain, its messages are unknown
        (INVALID_MESSAGE, naming the type), not sent on to RPEngine.
        """
        client = yield self.client()
        messages: list[dict[str, Any]] = [
            {"type": "playbook", "playbook": {"stages": {"a": {}}}},
            {"type": "event", "text": "x", "replyPolicy": "auto"},
            {"type": "tool-result", "callId": "c", "result": 1},
        ]
        for message in messages:
            client.send(message)
            error = yield client.nextOfType("error")
            self.assertEqual(error["code"], "INVALID_MESSAGE")
            self.assertIn(f"unknown message type {message['type']!r}", error["message"])


class DefaultChainTests(MemoryClientCase):
    """
    The configured middleware (playbook plugin in the default chain, no
    playbook configured): a client that uses none sees nothing new.
    """

    def setUp(self) -> None:
        self.settings = Settings()
        self.settings.client = ClientSettings()
        self.reactor = self.makeReactor()
        self.middleware = Middleware.fromSettings(self.reactor, self.settings)
        self.startLive()
        self.engines = []

    @runOnNetwork
    def test_plainTurn(self) -> Any:
        engine = yield self.engine()
        client = yield self.client()
        self.assertIn("playbook", self.middleware.chain.names)
        client.send({"type": "text", "text": "Hello."})
        messages = yield self.turn(client)
        self.assertFalse(PLAYBOOK_TYPES & set(types(messages)))
        [request] = requestsOf(engine)
        self.assertFalse({"interactionMode", "promptScene", "promptDirective"} & set(request))
        self.assertEqual(request["event"], {"text": "Hello."})


class DemoTests(TestCase):
    """
    C{twistd rpmiddleware --demo}: Mira plays the example playbook.
    """

    timeout = 30

    @inlineCallbacks
    def test_demoPlaysThePlaybook(self) -> Any:
        demo, events = startFastDemo(self)
        yield demo.ready
        said = [e["log_format"] for e in events if str(e.get("log_format", "")).startswith("demo:")]
        self.assertIn("demo: stage {old} -> {new} ({reason})", said)
        changes = [
            (e["old"], e["new"], e["reason"])
            for e in events
            if e.get("log_format") == "demo: stage {old} -> {new} ({reason})"
        ]
        self.assertEqual(
            changes,
            [
                ("greeting", "offer", 'player said "work"'),
                ("offer", "accepted", 'player said "aye"'),
            ],
        )
        ended = [e for e in events if e.get("log_format", "").startswith("demo: tool call ended")]
        self.assertEqual(ended[0]["outcome"], {"questId": "cellar-rats", "status": "offered"})
        requests = requestsOf(demo.engine)
        self.assertEqual(
            [prompt(r) for r in requests],
            [context(s) for s in ("greeting", "offer", "accepted")],
        )
