"""
The playbook plugin in a chain of its own (PluginHarness, Clock): every
trigger, the idle timer, tools of both kinds with their timeouts, game events
queued and coalesced by priority, state per client session, and what the
console reads.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.playbook import PlaybookPlugin, playbook
from rpmiddleware.builtin.playbook import wire as pw
from rpmiddleware.builtin.playbook.clientmessages import OWN
from rpmiddleware.builtin.playbook.parser import parsePlaybook, parseText
from rpmiddleware.builtin.playbook.tools import FunctionTool, ToolCall, ToolSet, discoverTools
from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.plugin import ChainPlugin, PluginServices, addSceneText
from rpmiddleware.plugin.clientext import turnFailed
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.rules import checkEnvelope, checkPromptContext
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import REFERENCE_CARD, PluginHarness

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "quest-giver.toml"
_HEAD = {"protocol", "protocolVersion", "messageId", "timestamp", "sessionId"}

OUTPUT = {
    "modalities": ["text", "audio"],
    "language": "en",
    "audio": {"model": "gemtavern-supertonic-3", "voice": "F1", "format": "pcm_s16le"},
}

PLAYBOOK: dict[str, Any] = {
    "name": "test",
    "defaults": {
        "promptDirective": {
            "sceneContext": "An inn.",
            "autoEventGuide": "React.",
            "directUserGuide": "Chat.",
        }
    },
    "tools": {"give": {"runBy": "client", "timeout": 5}},
    "stages": {
        "start": {
            "promptDirective": {"directUserGuide": "Chat.", "autoEventGuide": "React."},
            "voice": "F2",
            "transitions": [
                {
                    "on": "player",
                    "keywords": ["work"],
                    "to": "offer",
                    "tools": [{"name": "give", "arguments": {"quest": "rats"}}],
                },
                {"on": "player", "regex": "^hurry", "to": "fast"},
                {"on": "reply", "keywords": ["farewell"], "to": "end"},
                {"on": "event", "keywords": ["dragon"], "to": "alarm"},
                {"on": "idle", "after": 20, "say": "Silence.", "limit": 2},
                {"on": "turns", "count": 3, "to": "end"},
            ],
        },
        "offer": {
            "tools": ["give"],
            "promptDirective": {"directUserGuide": "Offer."},
            "transitions": [
                {
                    "on": "tool",
                    "tool": "give",
                    "outcome": "error",
                    "to": "start",
                    "reason": "could not give",
                },
                {"on": "tool", "tool": "give", "result": {"ok": True}, "to": "given"},
            ],
        },
        "given": {"promptDirective": {"directUserGuide": "Thank."}},
        "fast": {},
        "end": {"transitions": [{"on": "idle", "after": 5, "to": "start", "say": ""}]},
        "alarm": {"promptDirective": {"autoEventGuide": "Panic."}},
    },
}


class Rig:
    """
    The plugin between two lists, with helpers to play turns.
    """

    def __init__(
        self,
        document: dict[str, Any] | None = PLAYBOOK,
        tools: dict[str, Any] | None = None,
        engineRules: bool = True,
        **options: Any,
    ) -> None:
        self.timeline = Timeline()
        self.tools = tools or {}
        playbooks = {}
        if document is not None:
            playbooks["mira"] = parsePlaybook(copy.deepcopy(document), self.tools)
        self.plugin = PlaybookPlugin(playbooks, self.tools, timeline=self.timeline, **options)
        self.harness = PluginHarness(self.plugin, engineRules=engineRules)
        self.harness.startSession()
        self.clock: Clock = self.harness.clock
        self._count = 0

    def request(
        self,
        text: str | None = "Hello.",
        client: str = "c1",
        characterId: str = "mira",
        *,
        kind: str = "reply.request",
        audio: bool = False,
        meta: dict[str, Any] | None = None,
        check: bool = True,
        **fields: Any,
    ) -> Envelope:
        """
        Send a request into the chain; returns what left it toward RPEngine.

        @param check: fail unless its prompt context is one RPEngine takes.
        """
        self._count += 1
        requestId = fields.pop("requestId", f"r{self._count}")
        body: dict[str, Any] = {
            "requestId": requestId,
            "integrationId": "game",
            "characterId": characterId,
            "card": dict(REFERENCE_CARD),
            "output": copy.deepcopy(OUTPUT),
            **fields,
        }
        if kind == "reply.request":
            event: dict[str, Any] = {}
            if text is not None:
                event["text"] = text
            if audio:
                event["audio"] = {"format": "pcm_s16le", "sampleRate": 16000, "data": ""}
            body["event"] = event
        envelope = self.harness.envelope(kind, **body)
        envelope.meta.update({"client": client, **(meta or {})})
        self.harness.toEngine(envelope)
        sent = self.harness.sentToEngine[-1]
        if check:
            # What the plugin sends, RPEngine takes: a whole prompt context or none.
            checkPromptContext(sent.fields)
        return sent

    def event(self, text: str, policy: str = "auto", client: str = "c1", **fields: Any) -> None:
        self.toPlugin(pw.EVENT, client, text=text, replyPolicy=policy, **fields)

    def toPlugin(self, kind: str, client: str = "c1", **fields: Any) -> None:
        self.harness.toEngine(pw.toPlugin(kind, client, **fields))

    def reply(
        self,
        requestId: str,
        text: str = "Well met.",
        transcript: str | None = None,
        end: str = "reply.completed",
    ) -> None:
        self.harness.toGame("reply.accepted", requestId=requestId)
        if transcript is not None:
            # What RPEngine heard, told for a capture that asked (app.rs stt_completed).
            self.harness.toGame(
                "voice.capture.transcript", requestId=requestId, text=transcript, language="en"
            )
        self.harness.toGame("reply.text.delta", requestId=requestId, sequence=0, delta=text)
        self.harness.toGame("reply.text.completed", requestId=requestId, text=text)
        self.end(requestId, end)

    def end(self, requestId: str, kind: str = "reply.completed") -> None:
        extra = {"code": "request_failed"} if kind == "request.error" else {}
        self.harness.toGame(kind, requestId=requestId, **extra)

    def turn(self, text: str = "Hello.", client: str = "c1", reply: str = "Well met.") -> Envelope:
        request = self.request(text, client)
        self.reply(request["requestId"], reply)
        return request

    def out(self) -> list[dict[str, Any]]:
        """
        The playbook envelopes sent toward the game since the last call
        (after their reactor turn), as short dicts.
        """
        self.clock.advance(0)
        found = []
        for sent in self.harness.sentToGame:
            # What left as a client's message carries the plugin's own envelope.
            envelope = sent.meta.get(OWN, sent)
            if envelope.type.startswith(pw.PREFIX):
                fields = {k: v for k, v in envelope.fields.items() if k not in _HEAD}
                fields["type"] = fields["type"][len(pw.PREFIX) :]
                found.append(fields)
        self.harness.sentToGame.clear()
        return found

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.out()]

    def startAuto(self, message: dict[str, Any], client: str = "c1") -> Envelope:
        """
        Do what the client endpoint does for a turn message.
        """
        assert message["type"] == "turn", message
        return self.request(
            message["text"],
            client,
            interactionMode="auto_event",
            meta={pw.TURN_TOKEN: message["token"]},
        )


def prompt(request: Envelope) -> dict[str, Any]:
    return {
        k: request.get(k)
        for k in ("interactionMode", "promptScene", "promptDirective")
        if k in request
    }


def guide(request: Envelope) -> str:
    """
    The guide RPEngine puts in the prompt: the one of the request's mode
    (crates/rp-engine-core/src/prompt.rs, prompt_context).
    """
    auto = request["interactionMode"] == "auto_event"
    return str(request["promptDirective"]["autoEventGuide" if auto else "directUserGuide"])


def told(request: Envelope) -> tuple[str, str, str]:
    """
    What RPEngine makes of a request's prompt context: its mode, the scene
    (sceneContext) and the guide of that mode.
    """
    return (request["interactionMode"], request["promptDirective"]["sceneContext"], guide(request))


def gamesContext(sceneContext: str = "Mine.", mode: str = "direct_user") -> dict[str, Any]:
    """
    A complete prompt context of the game's own.
    """
    return {
        "interactionMode": mode,
        "promptScene": {
            "kind": "camp",
            "family": "outdoors",
            "label": "At camp",
            "sceneLine": "A camp.",
            "priority": 3,
            "extra": 1,
        },
        "promptDirective": {
            "protocolVersion": 2,
            "sceneContext": sceneContext,
            "autoEventGuide": "Mine, auto.",
            "directUserGuide": "Mine, direct.",
            "promptVersion": "game-7",
        },
    }


class LoadingTests(SynchronousTestCase):
    def test_configuredByCharacter(self) -> None:
        """
        A character's configured playbook starts at its first request: the
        client is told which, and the request carries the stage's fields.
        """
        rig = Rig()
        request = rig.request("Hello.")
        self.assertEqual(
            rig.out(),
            [
                {
                    "type": "state",
                    "clientId": "c1",
                    "playbook": "test",
                    "stage": "start",
                    "source": "config",
                }
            ],
        )
        self.assertEqual(
            prompt(request),
            {
                "interactionMode": "direct_user",
                "promptScene": {
                    "kind": "start",
                    "family": "test",
                    "label": "start",
                    "sceneLine": "An inn.",
                    "priority": 0,
                },
                "promptDirective": {
                    "protocolVersion": 1,
                    "sceneContext": "An inn.",
                    "autoEventGuide": "React.",
                    "directUserGuide": "Chat.",
                },
            },
        )
        self.assertEqual(request["output"]["audio"]["voice"], "F2")
        self.assertEqual(request["event"], {"text": "Hello."})

    def test_noPlaybookChangesNothing(self) -> None:
        # Sends what RPEngine would refuse, on purpose: the plugin's part is tested.
        rig = Rig(engineRules=False)
        envelope = rig.harness.envelope(
            "reply.request",
            requestId="x",
            integrationId="game",
            characterId="someone-else",
            card={},
            event={"text": "work"},
            output=copy.deepcopy(OUTPUT),
            promptDirective={"directUserGuide": "Mine."},
        )
        before = copy.deepcopy(envelope.fields)
        rig.harness.toEngine(envelope)
        self.assertEqual(rig.harness.sentToEngine[-1].fields, before)
        self.assertEqual(rig.out(), [])
        rig.reply("x")
        self.assertEqual(rig.out(), [])
        self.assertEqual(rig.clock.getDelayedCalls(), [])

    def test_stageReplacesTheGamesContext(self) -> None:
        """
        A stage's prompt context replaces the game's own whole (no key of
        the game's is mixed into it), and so does it a partial one of the
        game's, which RPEngine would refuse.
        """
        rig = Rig()
        playbook = rig.plugin.playbooks["mira"]
        stage = playbook.stage("start")
        request = rig.request("Hi", **gamesContext())
        self.assertEqual(prompt(request), stage.promptContext("direct_user"))
        partial = rig.request("Hi", promptScene={"sceneContext": "Old shape."})
        self.assertEqual(prompt(partial), stage.promptContext("direct_user"))

    def test_clientPlaybook(self) -> None:
        rig = Rig()
        directive = {"sceneContext": "Here.", "autoEventGuide": "0", "directUserGuide": "1"}
        document = {"name": "own", "stages": {"one": {"promptDirective": directive}}}
        rig.toPlugin(pw.LOAD, playbook=document)
        self.assertEqual(
            rig.out(),
            [
                {
                    "type": "state",
                    "clientId": "c1",
                    "playbook": "own",
                    "stage": "one",
                    "source": "client",
                }
            ],
        )
        request = rig.request("work")
        self.assertEqual(told(request), ("direct_user", "Here.", "1"))
        self.assertEqual(rig.out(), [], "the configured playbook does not replace the client's")
        rig.toPlugin(pw.LOAD, playbook=None)
        self.assertEqual(rig.out()[0]["playbook"], "test")

    def test_clientPlaybookAsToml(self) -> None:
        rig = Rig(None)
        rig.toPlugin(pw.LOAD, toml='name = "t"\n[stages.a]\nvoice = "M1"\n')
        self.assertEqual(rig.out()[0]["stage"], "a")
        request = rig.request("hi")
        self.assertEqual(request["output"]["audio"]["voice"], "M1")
        self.assertEqual(prompt(request), {}, "a playbook that writes no prompt context")

    def test_badPlaybookRefusedWhole(self) -> None:
        """
        A malformed playbook is refused at load time, naming the stage and
        field; the session keeps what it had.
        """
        rig = Rig()
        rig.request("Hello.")
        rig.out()
        broken = copy.deepcopy(PLAYBOOK)
        broken["stages"]["offer"]["transitions"][1]["to"] = "giv"
        rig.toPlugin(pw.LOAD, playbook=broken)
        [error] = rig.out()
        self.assertEqual(error["type"], "error")
        self.assertEqual(error["code"], "PLAYBOOK_ERROR")
        self.assertIn("stage 'offer'", error["message"])
        self.assertIn("field transitions[1].to", error["message"])
        self.assertIn("unknown stage 'giv'", error["message"])
        self.assertEqual(rig.plugin.state("c1")["source"], "config")  # type: ignore[index]
        rig.toPlugin(pw.LOAD, toml="stages = [")
        self.assertIn("not valid TOML", rig.out()[0]["message"])

    def test_clientPlaybooksOff(self) -> None:
        rig = Rig(clientPlaybooks=False)
        rig.toPlugin(pw.LOAD, playbook={"stages": {"a": {}}})
        [error] = rig.out()
        self.assertEqual(error["code"], "PLAYBOOK_ERROR")
        self.assertIn("client_playbooks", error["message"])

    def test_otherCharacterLeavesThePlaybook(self) -> None:
        rig = Rig()
        rig.turn()
        rig.out()
        rig.request("Hi", characterId="bob")
        self.assertEqual(
            rig.out(),
            [
                {
                    "type": "state",
                    "clientId": "c1",
                    "playbook": None,
                    "stage": None,
                    "source": None,
                }
            ],
        )


class TriggerTests(SynchronousTestCase):
    def test_playerKeyword(self) -> None:
        """
        Typed words move the stage before the request leaves, so the reply
        to them is already in the new stage; the transition's tool runs.
        """
        rig = Rig()
        rig.turn("Hello.")
        rig.out()
        request = rig.request("Any WORK for me?")
        self.assertEqual(guide(request), "Offer.")
        messages = rig.out()
        self.assertEqual(
            messages[0],
            {
                "type": "stage-change",
                "clientId": "c1",
                "turnId": request["requestId"],
                "from": "start",
                "to": "offer",
                "reason": 'player said "work"',
            },
        )
        self.assertEqual(messages[1]["type"], "tool-call-start")
        self.assertEqual(
            {k: messages[1][k] for k in ("name", "arguments", "runBy")},
            {"name": "give", "arguments": {"quest": "rats"}, "runBy": "client"},
        )
        self.assertEqual(len(messages), 2)

    def test_playerRegex(self) -> None:
        rig = Rig()
        rig.request("Hurry up!")
        [_, change] = rig.out()
        self.assertEqual((change["to"], change["reason"]), ("fast", "player matched /^hurry/"))

    def test_transcript(self) -> None:
        """
        Spoken words are known when RPEngine reports its transcript: the
        stage moves then, for the next turn.
        """
        # Sends what RPEngine would refuse, on purpose: the plugin's part is tested.
        rig = Rig(engineRules=False)
        request = rig.request(None, audio=True)
        rig.out()
        self.assertEqual(guide(request), "Chat.")
        rig.harness.toGame("reply.accepted", requestId=request["requestId"])
        self.assertEqual(rig.out(), [], "reply.accepted does not tell the words")
        rig.harness.toGame("voice.capture.transcript", requestId=request["requestId"], text="work?")
        messages = rig.out()
        self.assertEqual(messages[0]["to"], "offer")
        self.assertEqual(messages[0]["turnId"], request["requestId"])
        rig.reply(request["requestId"])
        self.assertEqual(guide(rig.request("Hm")), "Offer.")

    def test_voiceCapture(self) -> None:
        rig = Rig()
        request = rig.request(None, kind="voice.capture.start")
        self.assertEqual(guide(request), "Chat.")
        rig.out()
        rig.harness.toGame("voice.capture.transcript", requestId=request["requestId"], text="hurry")
        self.assertEqual(rig.out()[0]["to"], "fast")

    def test_reply(self) -> None:
        rig = Rig()
        rig.out()
        request = rig.request("Bye")
        rig.reply(request["requestId"], "Farewell, friend.")
        [state, change] = rig.out()
        self.assertEqual((change["to"], change["reason"]), ("end", 'reply said "farewell"'))

    def test_replyFromDeltas(self) -> None:
        """
        A reply.text.completed without text: the deltas are the reply.
        """
        rig = Rig()
        requestId = rig.request("Bye")["requestId"]
        rig.harness.toGame("reply.text.delta", requestId=requestId, sequence=0, delta="Fare")
        rig.harness.toGame("reply.text.delta", requestId=requestId, sequence=1, delta="well.")
        rig.harness.toGame("reply.text.completed", requestId=requestId)
        self.assertEqual(rig.out()[-1]["to"], "end")

    def test_event(self) -> None:
        """
        A game event moves the stage before its turn, which uses the new
        stage's autoEventGuide.
        """
        rig = Rig()
        rig.turn()
        rig.out()
        rig.event("A dragon lands on the roof.")
        [change, turn] = rig.out()
        self.assertEqual(
            (change["from"], change["to"], change["reason"]),
            ("start", "alarm", 'game event said "dragon"'),
        )
        self.assertIsNone(change["turnId"])
        request = rig.startAuto(turn)
        self.assertEqual(told(request), ("auto_event", "An inn.", "Panic."))
        self.assertEqual(request["event"], {"text": "A dragon lands on the roof."})

    def test_turns(self) -> None:
        """
        The third completed player turn in a stage fires; cancelled ones and
        auto turns do not count.
        """
        rig = Rig()
        rig.turn("one")
        cancelled = rig.request("two")
        rig.end(cancelled["requestId"], "reply.cancelled")
        rig.turn("three")
        rig.out()
        rig.turn("four")
        [change] = rig.out()
        self.assertEqual((change["to"], change["reason"]), ("end", "3 turns in stage start"))

    def test_firstMatchingRuleWins(self) -> None:
        rig = Rig()
        rig.request("hurry, any work?")
        changes = [m for m in rig.out() if m["type"] == "stage-change"]
        self.assertEqual([c["to"] for c in changes], ["offer"])


class IdleTests(SynchronousTestCase):
    def test_nudge(self) -> None:
        """
        20 s after the last reply ended, the stage asks for an auto_event turn
        with its say text; no stage-change (the rule has no C{to}).
        """
        rig = Rig()
        rig.turn()
        rig.out()
        rig.clock.advance(19.9)
        self.assertEqual(rig.out(), [])
        rig.clock.advance(0.1)
        [turn] = rig.out()
        self.assertEqual((turn["type"], turn["text"]), ("turn", "Silence."))
        request = rig.startAuto(turn)
        self.assertEqual(told(request), ("auto_event", "An inn.", "React."))
        self.assertEqual(request["event"], {"text": "Silence."})
        self.assertEqual(rig.plugin.state("c1")["stage"], "start")  # type: ignore[index]

    def test_pausedWhilePlaying(self) -> None:
        rig = Rig()
        request = rig.request()
        rig.clock.advance(100)
        rig.out()
        rig.reply(request["requestId"])
        rig.clock.advance(19)
        self.assertEqual(rig.out(), [])
        second = rig.request("again")
        rig.clock.advance(30)
        self.assertEqual(rig.out(), [])
        rig.reply(second["requestId"])
        rig.clock.advance(20)
        self.assertEqual(rig.kinds(), ["turn"])

    def test_limit(self) -> None:
        rig = Rig()
        rig.turn()
        rig.out()
        for _ in range(2):
            rig.clock.advance(20)
            [turn] = rig.out()
            rig.reply(rig.startAuto(turn)["requestId"])
        rig.clock.advance(100)
        self.assertEqual(rig.out(), [])
        self.assertEqual(rig.clock.getDelayedCalls(), [])

    def test_idleTransition(self) -> None:
        """
        An idle rule with C{to} changes the stage; C{say = ""} asks for no turn.
        """
        rig = Rig()
        rig.request("Bye")["requestId"]
        rig.reply("r1", "Farewell.")
        rig.out()
        rig.clock.advance(5)
        [change] = rig.out()
        self.assertEqual(
            (change["from"], change["to"], change["reason"]), ("end", "start", "idle for 5 s")
        )

    def test_stopCancelsTimers(self) -> None:
        rig = Rig()
        rig.turn()
        rig.request("work")
        rig.plugin.stop()
        self.assertEqual(rig.clock.getDelayedCalls(), [])


class ToolTests(SynchronousTestCase):
    def offer(self, rig: Rig) -> tuple[str, dict[str, Any]]:
        request = rig.request("work")
        messages = rig.out()
        start = [m for m in messages if m["type"] == "tool-call-start"][0]
        return request["requestId"], start

    def test_clientTool(self) -> None:
        """
        The client answers tool-call-start with tool-result; tool-call-end
        follows with the duration, and the result can fire a transition.
        """
        rig = Rig()
        requestId, start = self.offer(rig)
        rig.clock.advance(1.25)
        rig.toPlugin(pw.TOOL_RESULT, callId=start["callId"], result={"ok": True, "id": 7})
        [end, change] = rig.out()
        self.assertEqual(
            end,
            {
                "type": "tool-call-end",
                "clientId": "c1",
                "callId": start["callId"],
                "result": {"ok": True, "id": 7},
                "durationMs": 1250,
                "turnId": requestId,
            },
        )
        self.assertEqual(start["turnId"], requestId)
        self.assertEqual(
            (change["from"], change["to"], change["reason"]),
            ("offer", "given", "tool give succeeded"),
        )
        self.assertEqual(change["turnId"], requestId)
        self.assertEqual(rig.clock.getDelayedCalls(), [], "the timeout is cancelled")

    def test_resultThatDoesNotMatch(self) -> None:
        rig = Rig()
        _, start = self.offer(rig)
        rig.toPlugin(pw.TOOL_RESULT, callId=start["callId"], result={"ok": False})
        self.assertEqual(rig.kinds(), ["tool-call-end"])

    def test_clientToolTimeout(self) -> None:
        rig = Rig()
        _, start = self.offer(rig)
        rig.clock.advance(4.9)
        self.assertEqual(rig.out(), [])
        rig.clock.advance(0.1)
        [end, error, change] = rig.out()
        self.assertEqual(end["callId"], start["callId"])
        self.assertEqual(end["durationMs"], 5000)
        self.assertNotIn("result", end)
        self.assertIn("no tool-result within 5 s", end["error"])
        self.assertEqual(
            error,
            {
                "type": "error",
                "clientId": "c1",
                "code": "TOOL_ERROR",
                "message": end["error"],
                "callId": start["callId"],
            },
        )
        self.assertEqual((change["to"], change["reason"]), ("start", "could not give"))
        # A result after the timeout is refused, clearly.
        rig.toPlugin(pw.TOOL_RESULT, callId=start["callId"], result={"ok": True})
        [late] = rig.out()
        self.assertEqual(late["code"], "INVALID_MESSAGE")
        self.assertIn("no tool call", late["message"])

    def test_clientReportsError(self) -> None:
        rig = Rig()
        _, start = self.offer(rig)
        rig.toPlugin(pw.TOOL_RESULT, callId=start["callId"], error="the journal is full")
        [end, error, change] = rig.out()
        self.assertEqual(end["error"], "tool give failed: the journal is full")
        self.assertEqual(error["code"], "TOOL_ERROR")
        self.assertEqual(change["to"], "start")

    def test_otherSessionCannotAnswer(self) -> None:
        rig = Rig()
        _, start = self.offer(rig)
        rig.toPlugin(pw.TOOL_RESULT, client="c2", callId=start["callId"], result={"ok": True})
        [error] = rig.out()
        self.assertEqual((error["clientId"], error["code"]), ("c2", "INVALID_MESSAGE"))

    def middlewareRig(self, function: Any, timeout: float | None = None) -> Rig:
        document = copy.deepcopy(PLAYBOOK)
        document["stages"]["offer"]["tools"] = ["lookup", "give"]
        document["stages"]["start"]["transitions"][0]["tools"] = [
            {"name": "lookup", "arguments": {"q": 1}},
            "give",
        ]
        document["stages"]["offer"]["transitions"].append(
            {"on": "tool", "tool": "lookup", "outcome": "any", "keywords": ["beer"], "to": "fast"}
        )
        tool = FunctionTool("lookup", function, "Looks things up.", timeout)
        return Rig(document, {"lookup": tool}, toolTimeout=2.0)

    def test_middlewareTool(self) -> None:
        """
        A plugin's Python tool: its call context, its Deferred result, and
        the transition's next tool only after it ended.
        """
        calls: list[tuple[dict[str, Any], ToolCall]] = []
        answer: Deferred[Any] = Deferred()

        def lookup(arguments: dict[str, Any], call: ToolCall) -> Deferred[Any]:
            calls.append((arguments, call))
            return answer

        rig = self.middlewareRig(lookup)
        request = rig.request("work")
        messages = rig.out()
        self.assertEqual(
            [m["type"] for m in messages], ["state", "stage-change", "tool-call-start"]
        )
        [(arguments, call)] = calls
        self.assertEqual(arguments, {"q": 1})
        self.assertEqual(
            (call.name, call.clientId, call.characterId, call.playbook, call.stage, call.requestId),
            ("lookup", "c1", "mira", "test", "offer", request["requestId"]),
        )
        self.assertIs(call.reactor, rig.clock)
        rig.clock.advance(0.5)
        answer.callback("beer and bread")
        [end, change, give] = rig.out()
        self.assertEqual((end["result"], end["durationMs"]), ("beer and bread", 500))
        self.assertEqual(change["reason"], 'tool lookup succeeded and its result said "beer"')
        self.assertEqual((give["type"], give["name"]), ("tool-call-start", "give"))

    def test_middlewareToolTimeout(self) -> None:
        cancelled: list[bool] = []
        rig = self.middlewareRig(
            lambda arguments, call: Deferred(lambda d: cancelled.append(True)), timeout=None
        )
        rig.request("work")
        rig.out()
        rig.clock.advance(2)
        end, error = rig.out()[:2]
        self.assertEqual(
            end["error"], "tool lookup did not finish within 2 s; the call was abandoned"
        )
        self.assertEqual(error["code"], "TOOL_ERROR")
        self.assertEqual(cancelled, [True], "the tool's Deferred is cancelled")

    def test_ownTimeout(self) -> None:
        rig = self.middlewareRig(lambda arguments, call: Deferred(), timeout=0.5)
        rig.request("work")
        rig.out()
        rig.clock.advance(0.5)
        self.assertIn("within 0.5 s", rig.out()[0]["error"])

    def test_middlewareToolRaises(self) -> None:
        def broken(arguments: dict[str, Any], call: ToolCall) -> Any:
            raise KeyError("stock")

        rig = self.middlewareRig(broken)
        rig.request("work")
        messages = rig.out()
        end = [m for m in messages if m["type"] == "tool-call-end"][0]
        self.assertEqual(end["error"], "tool lookup failed: KeyError: 'stock'")
        self.assertEqual(end["durationMs"], 0)
        self.assertEqual(len(self.flushLoggedErrors(KeyError)), 1)
        # The next tool of the transition still runs.
        self.assertEqual(messages[-1]["name"], "give")

    def test_resultNotJson(self) -> None:
        rig = self.middlewareRig(lambda arguments, call: succeed({1, 2}))
        rig.request("work")
        end = [m for m in rig.out() if m["type"] == "tool-call-end"][0]
        self.assertIn("its result is not JSON", end["error"])

    def test_discoverTools(self) -> None:
        a = FunctionTool("a", lambda arguments, call: 1)
        b = FunctionTool("a", lambda arguments, call: 2)
        found = discoverTools([ToolSet(a), ToolSet(b)], dropins=False)
        self.assertIs(found["a"], a)


class EventTests(SynchronousTestCase):
    def test_autoWhenIdle(self) -> None:
        """
        An auto event with nothing playing is a turn at once: auto_event,
        the stage's autoEventGuide, and the scene it brings.
        """
        rig = Rig()
        rig.turn()
        rig.out()
        rig.event("The door bangs open.", scene="Night; a storm outside.")
        [turn] = rig.out()
        self.assertEqual(turn["text"], "The door bangs open.")
        request = rig.startAuto(turn)
        self.assertEqual(
            told(request), ("auto_event", "An inn.\n\nNight; a storm outside.", "React.")
        )
        self.assertEqual(request["event"], {"text": "The door bangs open."})
        # The scene stays for later turns.
        rig.reply(request["requestId"])
        later = rig.request("Hi")
        self.assertEqual(
            told(later), ("direct_user", "An inn.\n\nNight; a storm outside.", "Chat.")
        )

    def test_queuedWhilePlayingThenCoalescedByPriority(self) -> None:
        rig = Rig()
        playing = rig.request("Tell me a story.")
        rig.out()
        rig.event("A cat sneezes.", priority=0)
        rig.event("A fire starts!", priority=5)
        rig.event("A dog barks.", priority=0)
        self.assertEqual(rig.out(), [], "nothing interrupts the reply")
        rig.reply(playing["requestId"])
        [turn] = rig.out()
        self.assertEqual(turn["text"], "A fire starts!\nA cat sneezes.\nA dog barks.")
        request = rig.startAuto(turn)
        self.assertEqual(request["event"]["text"], "A fire starts!\nA cat sneezes.\nA dog barks.")
        rig.reply(request["requestId"])
        self.assertEqual(rig.plugin.state("c1")["pendingEvents"], [])  # type: ignore[index]

    def test_lateEventsJoinTheTurn(self) -> None:
        """
        Events that arrive between the ask and the request are told too.
        """
        rig = Rig()
        rig.turn()
        rig.out()
        rig.event("First.")
        rig.clock.advance(0)
        [turn] = [m for m in rig.out() if m["type"] == "turn"]
        rig.event("Second.", priority=1)
        request = rig.startAuto(turn)
        self.assertEqual(request["event"]["text"], "Second.\nFirst.")

    def test_boundDemotesToContext(self) -> None:
        rig = Rig(maxPendingEvents=2)
        playing = rig.request("Hi")
        rig.event("Old and dull.", priority=0)
        rig.event("Urgent.", priority=3)
        rig.event("Newer.", priority=1)
        state = rig.plugin.state("c1")
        assert state is not None
        self.assertEqual([e["text"] for e in state["pendingEvents"]], ["Urgent.", "Newer."])
        self.assertEqual(state["context"], ["Old and dull."])
        rig.reply(playing["requestId"])
        [turn] = [m for m in rig.out() if m["type"] == "turn"]
        request = rig.startAuto(turn)
        self.assertEqual(request["event"]["text"], "Old and dull.\nUrgent.\nNewer.")

    def test_noneIsContextForTheNextTurn(self) -> None:
        rig = Rig()
        rig.turn()
        rig.out()
        rig.event("It starts to rain.", policy="none")
        rig.event("A bell tolls.", policy="none")
        rig.clock.advance(5)
        self.assertEqual(rig.out(), [], "no turn of its own")
        request = rig.request("Nice weather?")
        self.assertEqual(
            request["event"]["text"],
            "[Event: It starts to rain.]\n[Event: A bell tolls.]\nNice weather?",
        )
        self.assertEqual(rig.plugin.state("c1")["context"], [])  # type: ignore[index]

    def test_contextOverflowIsSaid(self) -> None:
        rig = Rig(maxContextEvents=2)
        for text in ("one", "two", "three"):
            rig.event(text, policy="none")
        [error] = rig.out()
        self.assertEqual(error["code"], "RATE_LIMITED")
        self.assertIn('the oldest was dropped: "one"', error["message"])

    def test_playerTurnTakesWaitingEvents(self) -> None:
        """
        A player's turn while events wait (a barge-in) carries them; no
        auto_event turn follows for them.
        """
        # Sends what RPEngine would refuse, on purpose: the plugin's part is tested.
        rig = Rig(engineRules=False)
        playing = rig.request("Tell me a story.")
        rig.event("A bell tolls.")
        rig.toPlugin("x", requestId="nothing")  # unrelated envelopes pass
        rig.harness.toEngine("request.cancel", requestId=playing["requestId"])
        envelope = rig.request("Wait, what was that?")
        self.assertEqual(envelope["event"]["text"], "[Event: A bell tolls.]\nWait, what was that?")
        self.assertNotIn("turn", rig.kinds())
        rig.reply(envelope["requestId"])
        self.assertNotIn("turn", rig.kinds())

    def test_withdrawnTurnFreesTheClient(self) -> None:
        rig = Rig()
        playing = rig.request("Story?")
        rig.event("Thunder.")
        rig.harness.toEngine("request.cancel", requestId=playing["requestId"])
        self.assertEqual([m["type"] for m in rig.out()], ["state", "turn"])

    def test_interruptPriority(self) -> None:
        rig = Rig(interruptPriority=5)
        rig.request("Story?")
        rig.out()
        rig.event("Small noise.", priority=1)
        self.assertEqual(rig.out(), [])
        rig.event("The roof collapses!", priority=9)
        [turn] = rig.out()
        self.assertEqual(turn["text"], "The roof collapses!\nSmall noise.")

    def test_turnFailedPausesUntilHeardFrom(self) -> None:
        rig = Rig()
        rig.turn()
        rig.out()
        rig.event("Thunder.")
        [turn] = rig.out()
        rig.harness.toEngine(turnFailed("c1", turn["token"], "no character"))
        rig.clock.advance(60)
        self.assertEqual(rig.out(), [], "no idle nudge, no new ask")
        self.assertTrue(rig.plugin.state("c1")["away"])  # type: ignore[index]
        request = rig.request("Hello again.")
        self.assertEqual(request["event"]["text"], "[Event: Thunder.]\nHello again.")

    def test_turnThatNeverCame(self) -> None:
        rig = Rig(turnStartTimeout=3)
        rig.turn()
        rig.event("Thunder.")
        rig.out()
        rig.clock.advance(3)
        state = rig.plugin.state("c1")
        assert state is not None
        self.assertTrue(state["away"])
        self.assertFalse(state["turnAsked"])
        self.assertEqual(rig.clock.getDelayedCalls(), [])
        # An event from the client means it is back.
        rig.event("Lightning.")
        self.assertEqual([m["type"] for m in rig.out()], ["turn"])

    def test_lateTurnAfterGivingUp(self) -> None:
        """
        A turn asked for that starts after the plugin gave up on it still
        tells the events once.
        """
        rig = Rig(turnStartTimeout=3)
        rig.turn()
        rig.event("Thunder.")
        [turn] = [m for m in rig.out() if m["type"] == "turn"]
        rig.clock.advance(3)
        request = rig.startAuto(turn)
        self.assertEqual(request["event"]["text"], "Thunder.")
        self.assertFalse(rig.plugin.state("c1")["away"])  # type: ignore[index]

    def test_eventsWithoutPlaybook(self) -> None:
        """
        With no playbook and no prompt context of the game's, the turn goes
        without one (the endpoint's lone auto_event mark is taken off: alone
        RPEngine would refuse it), and the scene is told with the events.
        """
        rig = Rig(None)
        rig.event("A wolf howls.", scene="The forest.")
        [turn] = rig.out()
        request = rig.startAuto(turn)
        self.assertEqual(prompt(request), {})
        self.assertEqual(request["event"], {"text": "[Scene: The forest.]\nA wolf howls."})

    def test_eventsWithTheGamesOwnContext(self) -> None:
        """
        With no playbook, a complete prompt context of the game's is kept:
        the scene goes at the end of its sceneContext, and the turn's mode is
        set on it.
        """
        rig = Rig(None)
        rig.event("A wolf howls.", scene="The forest.")
        [turn] = rig.out()
        request = rig.request(turn["text"], meta={pw.TURN_TOKEN: turn["token"]}, **gamesContext())
        expected = gamesContext("Mine.\n\nThe forest.", "auto_event")
        self.assertEqual(prompt(request), expected)
        self.assertEqual(told(request), ("auto_event", "Mine.\n\nThe forest.", "Mine, auto."))
        self.assertEqual(request["event"], {"text": "A wolf howls."})
        rig.reply(request["requestId"])
        later = rig.request("Hi", **gamesContext())
        self.assertEqual(told(later), ("direct_user", "Mine.\n\nThe forest.", "Mine, direct."))


class PromptContextTests(SynchronousTestCase):
    """
    Every request carries RPEngine's whole prompt context, or none.
    """

    def test_everyStageOfTheExample(self) -> None:
        """
        Each stage of the example playbook, in either mode, on either kind
        of request, gives an envelope RPEngine takes whole, with the guide
        of the turn's mode.
        """
        document = parseText(EXAMPLE.read_text(), "toml", "example")
        rig = Rig(document)
        playbook = rig.plugin.playbooks["mira"]
        rig.request("Hello.")
        state = rig.plugin.sessions.get("c1")
        assert state is not None
        for stage in playbook.stages.values():
            for auto in (False, True):
                for kind in ("reply.request", "voice.capture.start"):
                    state.enter(stage.id, rig.clock.seconds())
                    sent = self.send(rig, kind, auto)
                    checkEnvelope(sent.fields)
                    mode = "auto_event" if auto else "direct_user"
                    self.assertEqual(prompt(sent), stage.promptContext(mode), (stage.id, kind))
                    key = "autoEventGuide" if auto else "directUserGuide"
                    self.assertEqual(guide(sent), stage.promptDirective[key])
                    rig.end(sent["requestId"])

    def send(self, rig: Rig, kind: str, auto: bool) -> Envelope:
        rig._count += 1
        fields: dict[str, Any] = {"characterId": "mira", "output": copy.deepcopy(OUTPUT)}
        if kind == "reply.request":
            envelope = rig.harness.replyRequest(
                f"x{rig._count}", text="Hm.", eventId=f"e{rig._count}", **fields
            )
        else:
            envelope = rig.harness.envelope(
                kind,
                requestId=f"x{rig._count}",
                eventId=f"e{rig._count}",
                integrationId="game",
                card=dict(REFERENCE_CARD),
                **fields,
            )
        if auto:
            envelope["interactionMode"] = "auto_event"
        envelope.meta["client"] = "c1"
        rig.harness.toEngine(envelope)
        return rig.harness.sentToEngine[-1]

    def test_autoAndDirect(self) -> None:
        """
        The player's turns are direct_user, the turns the plugin asks for
        auto_event (whatever mode they came with), and the guide RPEngine
        uses follows the mode; the scene and the other fields do not.
        """
        rig = Rig()
        direct = rig.turn("Hello.")
        rig.out()
        rig.clock.advance(20)
        [turn] = rig.out()
        auto = rig.request(turn["text"], meta={pw.TURN_TOKEN: turn["token"]})
        self.assertEqual(told(direct), ("direct_user", "An inn.", "Chat."))
        self.assertEqual(told(auto), ("auto_event", "An inn.", "React."))
        self.assertEqual(direct["promptScene"], auto["promptScene"])
        self.assertEqual(direct["promptDirective"], auto["promptDirective"])

    def test_gamesPartialContextWithoutStageIsLeft(self) -> None:
        """
        With nothing to complete it, a partial context the game sent itself
        passes as it is, for the refusal that names its field; the plugin
        makes none of its own.
        """
        # Sends what RPEngine would refuse, on purpose: the plugin's part is tested.
        rig = Rig(None, engineRules=False)
        partial: dict[str, Any] = {"promptDirective": {"directUserGuide": "be brief"}}
        request = rig.request("Hi", check=False, **partial)
        self.assertEqual(prompt(request), partial)
        lone = rig.request("Hi", check=False, interactionMode="direct_user")
        self.assertEqual(prompt(lone), {"interactionMode": "direct_user"})


class SessionTests(SynchronousTestCase):
    def test_perClient(self) -> None:
        rig = Rig()
        rig.request("work", client="c1")
        other = rig.request("hello", client="c2")
        self.assertEqual(guide(other), "Chat.")
        self.assertEqual(rig.plugin.state("c1")["stage"], "offer")  # type: ignore[index]
        self.assertEqual(rig.plugin.state("c2")["stage"], "start")  # type: ignore[index]

    def test_survivesEngineSessionsAndReconnects(self) -> None:
        """
        State belongs to the client session id (which reconnect keeps), not
        to the connection or the RPEngine session.
        """
        rig = Rig()
        request = rig.request("work")
        rig.harness.startSession()
        rig.end(request["requestId"], "request.error")
        later = rig.request("so?")
        self.assertEqual(guide(later), "Offer.")

    def test_sentAgainIsNotANewTurn(self) -> None:
        """
        A request entering the chain again (a new RPEngine session) is not
        decorated twice, nor does it fire transitions again.
        """
        rig = Rig()
        first = rig.request("Hurry!")
        again = Envelope({k: v for k, v in first.fields.items()}, {"client": "c1"})
        again["event"] = {"text": "work"}
        rig.harness.toEngine(again)
        self.assertEqual(rig.harness.sentToEngine[-1]["event"], {"text": "work"})
        self.assertEqual([m.get("to") for m in rig.out() if m["type"] == "stage-change"], ["fast"])

    def test_resumedIsToldItsStage(self) -> None:
        """
        A session taken back with reconnect is told the stage it is in now,
        in the shape of a stage change, including one made while no
        connection had it (here an idle rule's); nothing else changes.
        """
        rig = Rig()
        rig.turn("Hello.", reply="Farewell!")
        self.assertEqual([m["to"] for m in rig.out() if m["type"] == "stage-change"], ["end"])
        rig.toPlugin(pw.RESUMED)
        told = {
            "type": "stage-change",
            "clientId": "c1",
            "turnId": None,
            "from": "end",
            "to": "end",
            "reason": "session resumed",
        }
        self.assertEqual(rig.out(), [told])
        rig.clock.advance(5)
        self.assertEqual([m["to"] for m in rig.out()], ["start"])
        before = rig.plugin.state("c1")
        rig.toPlugin(pw.RESUMED)
        self.assertEqual(rig.out(), [{**told, "from": "start", "to": "start"}])
        self.assertEqual(rig.plugin.state("c1"), before)

    def test_resumedWithoutPlaybookIsToldNothing(self) -> None:
        """
        Nothing is sent for a session with no playbook, or one the plugin
        has never seen (and that one is not created).
        """
        rig = Rig()
        rig.turn(client="c1", reply="Hi.")
        rig.request("Hi", client="c1", characterId="bob")
        rig.out()
        rig.toPlugin(pw.RESUMED, client="c1")
        rig.toPlugin(pw.RESUMED, client="stranger")
        self.assertEqual(rig.out(), [])
        self.assertIsNone(rig.plugin.state("stranger"))
        self.assertNotIn(pw.RESUMED, rig.harness.typesToEngine())

    def test_endedSessionIsForgotten(self) -> None:
        """
        A client session that is over takes its playbook state with it,
        timers included: the idle nudge due later never comes.
        """
        rig = Rig()
        rig.turn(client="a", reply="Hi.")
        rig.turn(client="b", reply="Hi.")
        rig.out()
        rig.harness.endClientSession("a")
        self.assertIsNone(rig.plugin.state("a"))
        self.assertEqual([s["clientId"] for s in rig.plugin.states()], ["b"])
        rig.clock.advance(60)
        self.assertEqual({m["clientId"] for m in rig.out()}, {"b"}, "only b is nudged")

    def test_boundedSessions(self) -> None:
        rig = Rig(maxSessions=2)
        for client in ("a", "b", "c"):
            rig.turn(client=client)
        self.assertIsNone(rig.plugin.state("a"))
        self.assertEqual([s["clientId"] for s in rig.plugin.states()], ["b", "c"])


class ConsoleTests(SynchronousTestCase):
    def test_stateAndTimeline(self) -> None:
        rig = Rig()
        first = rig.turn("Hello.")
        request = rig.request("work")
        rig.clock.advance(2)
        rig.out()
        state = rig.plugin.state("c1")
        assert state is not None
        self.assertEqual(
            {k: state[k] for k in ("playbook", "source", "stage", "turnsInStage", "openRequests")},
            {
                "playbook": "test",
                "source": "config",
                "stage": "offer",
                "turnsInStage": 0,
                "openRequests": [request["requestId"]],
            },
        )
        [running] = state["runningTools"]
        self.assertEqual((running["name"], running["outcome"]), ("give", "running"))
        self.assertEqual(state["stageHistory"][-1]["to"], "offer")
        self.assertEqual(state["secondsInStage"], 2.0)
        timeline = rig.timeline.get(request["requestId"])
        assert timeline is not None
        self.assertEqual(timeline.details["stage"], "offer")
        self.assertEqual(timeline.details["interactionMode"], "direct_user")
        self.assertEqual(timeline.details["tools"][0]["outcome"], "running")
        rig.toPlugin(pw.TOOL_RESULT, callId=running["callId"], result={"ok": True})
        rig.out()
        [tool] = timeline.details["tools"]
        self.assertEqual(
            {k: tool[k] for k in ("name", "runBy", "outcome", "durationMs")},
            {"name": "give", "runBy": "client", "outcome": "success", "durationMs": 2000},
        )
        self.assertEqual(rig.timeline.get(first["requestId"]).details["stage"], "start")  # type: ignore[union-attr]
        self.assertEqual(rig.plugin.state("c1")["recentTools"][0]["outcome"], "success")  # type: ignore[index]

    def test_idleToolsBelongToTheNextTurn(self) -> None:
        document = copy.deepcopy(PLAYBOOK)
        document["stages"]["start"]["tools"] = ["give"]
        document["stages"]["start"]["transitions"][4]["tools"] = ["give"]
        rig = Rig(document)
        rig.turn()
        rig.clock.advance(20)
        turn = [m for m in rig.out() if m["type"] == "turn"][0]
        request = rig.startAuto(turn)
        timeline = rig.timeline.get(request["requestId"])
        assert timeline is not None
        self.assertEqual(timeline.details["tools"][0]["name"], "give")


class FactoryTests(SynchronousTestCase):
    def services(self, source: str = "<defaults>") -> PluginServices:
        clock = Clock()
        return PluginServices(clock, Settings(source=source), CardHasher(None), Timeline())

    def test_buildWithConfiguredFile(self) -> None:
        folder = Path(self.mktemp())
        folder.mkdir()
        (folder / "quest.toml").write_text(EXAMPLE.read_text())
        config = folder / "rpmiddleware.toml"
        plugin = playbook.buildPlugin(
            {"characters": {"mira": "quest.toml", "ada": "quest.toml"}, "tool_timeout": 3},
            self.services(str(config)),
        )
        assert isinstance(plugin, PlaybookPlugin)
        self.assertEqual(plugin.playbooks["mira"].name, "quest-giver")
        self.assertIs(plugin.playbooks["mira"], plugin.playbooks["ada"])
        self.assertEqual(plugin.toolTimeout, 3.0)

    def test_badFileStopsStartUp(self) -> None:
        path = Path(self.mktemp() + ".toml")
        path.write_text('[stages.a]\nvoice = "Z1"\n')
        with self.assertRaises(ValueError) as caught:
            playbook.buildPlugin({"characters": {"mira": str(path)}}, self.services())
        message = str(caught.exception)
        self.assertIn("plugins.playbook.characters.mira", message)
        self.assertIn("stage 'a', field voice", message)

    def test_settings(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"nonsense": 1}, "unknown setting plugins.playbook.nonsense"),
            ({"characters": {"mira": 3}}, "plugins.playbook.characters[...] must be a string"),
            ({"tool_timeout": 0}, "plugins.playbook.tool_timeout must be"),
            ({"max_pending_events": 0}, "plugins.playbook.max_pending_events must be"),
            ({"client_playbooks": "yes"}, "plugins.playbook.client_playbooks must be"),
        ]
        for settings, words in cases:
            with self.assertRaises(ValueError) as caught:
                playbook.buildPlugin(settings, self.services())
            self.assertIn(words, str(caught.exception))
        plugin = playbook.buildPlugin({"interrupt_priority": 5}, self.services())
        assert isinstance(plugin, PlaybookPlugin)
        self.assertEqual(plugin.interruptPriority, 5.0)


class MemoryTests(SynchronousTestCase):
    def test_requestsForgottenAtTheirEnd(self) -> None:
        """
        Whatever happened to its session, a request is forgotten when it ends.
        """
        rig = Rig(maxSessions=1)
        first = rig.request("Hi", client="a")
        rig.request("Hi", client="b")
        self.assertIsNone(rig.plugin.state("a"))
        rig.end(first["requestId"])
        withdrawn = rig.request("Hi", client="b")
        rig.harness.toEngine("request.cancel", requestId=withdrawn["requestId"])
        rig.end(withdrawn["requestId"], "reply.cancelled")
        self.assertEqual(list(rig.plugin._requests), ["r2"])


TOOL_DROPIN = """
from rpmiddleware.builtin.playbook.tools import FunctionTool, ToolSet


def weather(arguments, call):
    return {"sky": "grey", "where": arguments.get("where")}


tools = ToolSet(FunctionTool("weather", weather, "Says the weather.", timeout=2.0))
"""


class DropinToolTests(SynchronousTestCase):
    def setUp(self) -> None:
        """
        A third party's tools, announced in a twisted/plugins drop-in.
        """
        import sys

        import twisted.plugins

        folder = Path(self.mktemp()) / "twisted" / "plugins"
        folder.mkdir(parents=True)
        (folder / "weather_tools.py").write_text(TOOL_DROPIN)
        twisted.plugins.__path__.append(str(folder))
        self.addCleanup(twisted.plugins.__path__.remove, str(folder))
        self.addCleanup(sys.modules.pop, "twisted.plugins.weather_tools", None)

    def test_foundAtStartUp(self) -> None:
        """
        The factory finds drop-in tools, so a configured playbook may name
        them (and one naming a tool nobody provides is refused then).
        """
        path = Path(self.mktemp() + ".toml")
        path.write_text(
            '[stages.a]\ntools = ["weather"]\n'
            '[[stages.a.transitions]]\non = "player"\nkeywords = ["rain"]\n'
            'tools = [{ name = "weather", arguments = { where = "here" } }]\n'
        )
        services = PluginServices(Clock(), Settings(), CardHasher(None), Timeline())
        plugin = playbook.buildPlugin({"characters": {"mira": str(path)}}, services)
        assert isinstance(plugin, PlaybookPlugin)
        self.assertEqual(plugin.tools["weather"].timeout, 2.0)
        spec = plugin.playbooks["mira"].tools["weather"]
        self.assertEqual((spec.runBy, spec.timeout), ("middleware", 2.0))
        harness = PluginHarness(plugin)
        envelope = harness.envelope(
            "reply.request",
            requestId="r",
            integrationId="g",
            characterId="mira",
            card=dict(REFERENCE_CARD),
            event={"text": "Will it rain?"},
        )
        envelope.meta["client"] = "c"
        harness.toEngine(envelope)
        harness.clock.advance(0)
        [end] = [e.meta[OWN] for e in harness.sentToGame if e.meta[OWN].type == pw.TOOL_CALL_END]
        self.assertEqual(end["result"], {"sky": "grey", "where": "here"})


class Whisperer(ChainPlugin):
    """
    A plugin nearer the game than the playbook that adds to what the model
    is told, the sanctioned way (addSceneText, given the envelope), or by
    the request's fields alone (C{noted=False}).
    """

    name = "whisperer"

    def __init__(self, noted: bool = True) -> None:
        self.noted = noted

    def envelopeToEngine(self, envelope: Envelope, context: Any) -> Envelope:
        if envelope.type == "reply.request":
            addSceneText(envelope if self.noted else envelope.fields, "Mira owes the smith.")
        return envelope


class NearerTheGameTests(SynchronousTestCase):
    """
    A plugin nearer the game than the playbook adds to the prompt context;
    the stage the playbook applies keeps what it added.
    """

    def rig(self, near: Whisperer, **fields: Any) -> tuple[Rig, Envelope]:
        rig = Rig()
        rig.harness = PluginHarness([near, rig.plugin])
        rig.harness.startSession()
        rig.clock = rig.harness.clock
        return rig, rig.request("Hello.", **fields)

    def test_bothReachRPEngine(self) -> None:
        rig, request = self.rig(Whisperer())
        stage = rig.plugin.playbooks["mira"].stage("start")
        expected = stage.promptContext("direct_user")
        assert expected is not None
        expected["promptDirective"]["sceneContext"] = "An inn.\n\nMira owes the smith."
        self.assertEqual(prompt(request), expected)
        self.assertEqual(told(request), ("direct_user", "An inn.\n\nMira owes the smith.", "Chat."))

    def test_afterTheGamesScene(self) -> None:
        """The game's scene comes first (the stage's), then what plugins added."""
        rig = Rig()
        rig.harness = PluginHarness([Whisperer(), rig.plugin])
        rig.harness.startSession()
        rig.clock = rig.harness.clock
        rig.event("A cart rolls by.", policy="queue", scene="The square.")
        request = rig.request("Hello.")
        self.assertEqual(
            request["promptDirective"]["sceneContext"],
            "An inn.\n\nThe square.\n\nMira owes the smith.",
        )

    def test_overTheGamesOwnContext(self) -> None:
        """
        The game's own context is still replaced by the stage's whole; the
        plugin's text, added to it, is kept.
        """
        _, request = self.rig(Whisperer(), **gamesContext())
        self.assertEqual(
            request["promptDirective"]["sceneContext"], "An inn.\n\nMira owes the smith."
        )
        self.assertEqual(request["promptScene"]["family"], "test")

    def test_fieldsAloneAreReplaced(self) -> None:
        """Added to the fields alone (nothing noted), it is the request's, replaced."""
        _, request = self.rig(Whisperer(noted=False))
        self.assertEqual(request["promptDirective"]["sceneContext"], "An inn.")

    def test_withoutAStageKeptOnce(self) -> None:
        """With no playbook, the context the plugin made is the request's, told once."""
        rig = Rig(None)
        rig.harness = PluginHarness([Whisperer(), rig.plugin])
        rig.harness.startSession()
        request = rig.request("Hello.")
        self.assertEqual(request["promptDirective"]["sceneContext"], "Mira owes the smith.")
