"""
Scenes and actions end to end: a client of the endpoint, the default chain
(playbook, scene, actions, memory, ...) and the simulated RPEngine, which
plays one request per line in FIFO order and assembles every prompt as
RPEngine's core does.  No sockets and no real time: everything on a Clock.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.actions import IActions
from rpmiddleware.builtin.memory import IConversationMemory
from rpmiddleware.builtin.scene import IScenes
from rpmiddleware.client.clientext import ExtensionBridge
from rpmiddleware.client.status import hubFor
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.protocol.prompt import AssembledPrompt
from rpmiddleware.testing.inmemory import connectInMemory
from rpmiddleware.testing.kit import exampleAction, exampleCard
from rpmiddleware.testing.simoptions import SimulatorOptions, defaultReplyText
from tests.support.client import clockedEndpoint
from tests.support.connections import OpenConnections
from tests.support.memory import settle

OPEN_GATE = exampleAction(characters=["garrick"])
GUARD_LINE = 'Fine, I will open the north gate. [[open_gate {"gate": "north"}]] Stand back.'


def card(name: str, description: str) -> dict[str, Any]:
    return exampleCard(name=name, description=description, mes_example="", first_mes="")


CAST: list[dict[str, Any]] = [
    {"characterId": "garrick", "card": card("Garrick", "The north gate's guard."), "voice": "M2"},
    {"characterId": "mara", "card": card("Mara", "The innkeeper by the gate."), "voice": "F3"},
]


class SceneRig:
    """
    The default chain on a Clock with the simulator, a client endpoint and
    its bridges; C{lines} maps a characterId to what its model says.
    """

    def __init__(self, lines: dict[str, str] | None = None) -> None:
        self.lines = lines if lines is not None else {}
        self.clock = Clock()
        settings = Settings()
        settings.plugins["memory"] = {"path": ":memory:", "summaries": False}
        self.middleware = Middleware.fromSettings(self.clock, settings)
        self.link = connectInMemory(
            self.middleware, self.clock, SimulatorOptions(replyText=self._reply)
        )
        self.endpoint = clockedEndpoint(self.middleware, settings, self.clock)
        self.clients = OpenConnections(self.endpoint, self.clock)
        self.middleware.router.observe(ExtensionBridge(self.clients))
        settle(self.clock, 0.1)
        self.connection, self.writer = self.clients.connect()

    def _reply(self, request: dict[str, Any]) -> str:
        said = self.lines.get(str(request.get("characterId")))
        return said if said is not None else defaultReplyText(request)

    @property
    def engine(self) -> Any:
        return self.link.engine

    @property
    def invocations(self) -> list[AssembledPrompt]:
        return list(self.engine.invocations)

    def say(self, **message: Any) -> None:
        self.clients.say(self.connection, **message)

    def asked(self, characterId: str) -> bool:
        return any(r.get("characterId") == characterId for r in self.engine.receivedMessages)

    def playUntilAsked(self, characterId: str, seconds: float = 20.0) -> None:
        """Run the Clock in 50 ms steps until RPEngine got a request for C{characterId}."""
        for _ in range(int(seconds / 0.05)):
            if self.asked(characterId):
                return
            self.clock.advance(0.05)

    def sent(self, *types: str) -> list[dict[str, Any]]:
        return [m for m in self.writer.sent if not types or m["type"] in types]

    def openScene(self, **extra: Any) -> None:
        self.say(type="character", characterId="garrick", card=CAST[0]["card"])
        self.say(type="configure", player={"displayName": "Alex"})
        self.say(type="scene", op="open", sceneId="gate", cast=CAST, **extra)
        state = self.sent("scene-state")[-1]
        assert [m["characterId"] for m in state["scene"]["cast"]] == ["garrick", "mara"], state

    def turn(self, text: str, seconds: float = 30.0) -> dict[str, Any]:
        self.say(type="text", text=text)
        settle(self.clock, seconds)
        return self.sent("reply-complete")[-1]


class SceneTests(SynchronousTestCase):
    def test_addressedCharacterAnswersAndTheOtherReactsOnce(self) -> None:
        """
        The player's line to the guard is answered by the guard, the
        innkeeper reacts once, and the turn's messages say who speaks each
        line, with that character's voice.
        """
        rig = SceneRig({"garrick": "Halt. The gate is shut.", "mara": "He says that every night."})
        rig.openScene()
        done = rig.turn("Garrick, may I pass?")
        requests = [r for r in rig.engine.receivedMessages if r.get("type") == "reply.request"]
        self.assertEqual([r["characterId"] for r in requests], ["garrick", "mara"])
        self.assertEqual(
            [r["output"]["audio"]["voice"] for r in requests], ["M2", "F3"], "each line's voice"
        )
        self.assertEqual(
            [(line["speaker"]["characterId"], line["text"]) for line in done["lines"]],
            [("garrick", "Halt. The gate is shut."), ("mara", "He says that every night.")],
        )
        llm = rig.sent("llm")
        self.assertEqual(
            [(m["speaker"]["name"], m["speaker"]["voice"], m["text"]) for m in llm],
            [
                ("Garrick", "M2", "Halt. The gate is shut."),
                ("Mara", "F3", "He says that every night."),
            ],
        )
        for kind in ("llm-chunk", "tts-start", "tts-chunk", "tts-complete"):
            speakers = {m["speaker"]["characterId"] for m in rig.sent(kind)}
            self.assertEqual(speakers, {"garrick", "mara"}, kind)
        # One turn: the client saw one reply-complete, after both lines.
        self.assertEqual(len(rig.sent("reply-complete")), 1)
        last = rig.writer.sent.index(done)
        self.assertTrue(all(rig.writer.sent.index(m) < last for m in llm))

    def test_sessionHistoryKeepsEveryLine(self) -> None:
        """What reconnect's history tells: each line, with its speaker."""
        rig = SceneRig({"garrick": "Halt.", "mara": "Hush."})
        rig.openScene()
        rig.turn("Garrick?")
        said = [
            (h["role"], h.get("speaker", {}).get("name"), h["text"])
            for h in rig.connection.session.history
        ]
        self.assertEqual(
            said,
            [
                ("player", None, "Garrick?"),
                ("character", "Garrick", "Halt."),
                ("character", "Mara", "Hush."),
            ],
        )

    def test_eachLineHasItsOwnWavWhenNotStreaming(self) -> None:
        """
        A client that takes one WAV per reply gets one per line, each with
        its speaker and only that line's speech.
        """
        rig = SceneRig({"garrick": "Halt.", "mara": "He says that every night, you know."})
        rig.say(type="configure", output={"streaming": False})
        rig.openScene()
        done = rig.turn("Garrick, may I pass?")
        wavs = rig.sent("tts")
        self.assertEqual([w["speaker"]["characterId"] for w in wavs], ["garrick", "mara"])
        self.assertLess(len(wavs[0]["data"]), len(wavs[1]["data"]), "the first holds its line only")
        self.assertEqual(
            done["speech"]["samples"] * 2 + 2 * 44,
            sum(len(base64.b64decode(w["data"])) for w in wavs),
        )

    def test_eachInvocationHoldsTheOthersLinesWithNames(self) -> None:
        """
        Each character's memory holds what it heard, with the speaker's name:
        the innkeeper's invocation has the player's line to the guard and the
        guard's words as its event; the guard's next has the innkeeper's.
        """
        rig = SceneRig({"garrick": "Halt. The gate is shut.", "mara": "He says that every night."})
        rig.openScene()
        rig.turn("Garrick, may I pass?")
        garrick, mara = rig.invocations[-2:]
        self.assertEqual(garrick.user, "Garrick, may I pass?")
        self.assertEqual(mara.user, "Garrick: Halt. The gate is shut.")
        self.assertIn(("user", "(to Garrick) Garrick, may I pass?"), mara.history)
        self.assertIn("You are Mara", mara.system)
        rig.lines["mara"] = "Off with you."
        rig.turn("Garrick, please, it is raining.")
        nextGarrick = rig.invocations[-2]
        self.assertEqual(
            list(nextGarrick.history[-3:]),
            [
                ("user", "Garrick, may I pass?"),
                ("assistant", "Halt. The gate is shut."),
                ("user", "Mara: He says that every night."),
            ],
        )
        memory = rig.middleware.plugin(IConversationMemory)
        marasLines = memory.read("mara", "session:" + rig.connection.session.id)["entries"]
        self.assertEqual(
            [(e["role"], e["speaker"]) for e in marasLines[:3]],
            [("player", "Alex"), ("other", "Garrick"), ("character", "Mara")],
        )

    def test_whoCannotHearHearsNothing(self) -> None:
        """
        A character who does not hear the player neither answers nor
        remembers the player's line; it still hears the guard and reacts.
        """
        rig = SceneRig({"garrick": "Halt.", "mara": "Who is there?"})
        cast = copy.deepcopy(CAST)
        cast[1]["hears"] = ["garrick"]
        rig.say(type="character", characterId="mara", card=cast[1]["card"])
        rig.say(type="scene", op="open", sceneId="gate", cast=cast)
        rig.turn("Mara, I need a room.")
        mara = rig.invocations[-1]
        self.assertEqual(rig.invocations[-2].user, "Mara, I need a room.")
        self.assertEqual(mara.user, "Garrick: Halt.")
        self.assertNotIn("I need a room", " ".join(text for _, text in mara.history))

    def test_reactionsAreBoundedAndCanBeNone(self) -> None:
        rig = SceneRig({"garrick": "Halt.", "mara": "Hush."})
        rig.openScene(reactions=0)
        done = rig.turn("Garrick, hello.")
        self.assertEqual([line["speaker"]["characterId"] for line in done["lines"]], ["garrick"])
        rig.say(type="scene", op="set", reactions=3)
        done = rig.turn("Garrick, hello again.")
        speakers = [line["speaker"]["characterId"] for line in done["lines"]]
        self.assertEqual(speakers, ["garrick", "mara", "garrick", "mara"])

    def test_nextRequestIsSentWhenTheLineIsCompleteAsText(self) -> None:
        """
        The innkeeper's request reaches RPEngine while the guard's line is
        still being spoken, not after its playback.
        """
        rig = SceneRig({"garrick": "Halt. The gate is shut for the night.", "mara": "True."})
        rig.engine.options.audioRealtime = True
        rig.openScene()
        rig.say(type="text", text="Garrick, may I pass?")
        rig.playUntilAsked("mara")
        self.assertTrue(rig.asked("mara"))
        self.assertFalse(
            any(m["type"] == "tts-complete" for m in rig.writer.sent),
            "the guard's speech had not finished when the innkeeper's request left",
        )

    def test_bargeInStopsTheExchange(self) -> None:
        rig = SceneRig({"garrick": "Halt. " * 20, "mara": "Enough, Garrick."})
        rig.engine.options.audioRealtime = True
        rig.openScene()
        rig.say(type="text", text="Garrick, may I pass?")
        rig.playUntilAsked("mara")
        rig.say(type="cancel")
        settle(rig.clock, 60)
        cancels = [r for r in rig.engine.receivedMessages if r.get("type") == "request.cancel"]
        self.assertTrue(cancels, "the lines still to come were cancelled upstream")
        self.assertEqual(rig.sent("reply-complete"), [])
        self.assertEqual(len(rig.sent("tts-cancelled")), 1)
        self.assertNotIn("Enough, Garrick.", [m.get("text") for m in rig.sent("llm")])
        # The next turn plays normally.
        rig.lines["garrick"] = "Fine."
        done = rig.turn("Garrick?")
        self.assertEqual(done["lines"][0]["text"], "Fine.")

    def test_joinLeaveAndAddress(self) -> None:
        rig = SceneRig({"garrick": "Halt.", "mara": "Hello.", "tom": "Ale!"})
        rig.openScene(reactions=0)
        rig.say(
            type="scene",
            op="join",
            member={"characterId": "tom", "card": card("Tom", "A drunk."), "voice": "M4"},
        )
        rig.say(type="scene", op="address", characterId="tom")
        done = rig.turn("Evening.")
        self.assertEqual(done["lines"][0]["speaker"]["characterId"], "tom")
        rig.say(type="scene", op="leave", characterId="tom")
        done = rig.turn("Tom, are you there?")
        self.assertEqual(done["lines"][0]["speaker"]["characterId"], "garrick")

    def test_badSceneMessagesNameTheField(self) -> None:
        rig = SceneRig()
        rig.say(type="scene", op="open", sceneId="gate", cast=[{"characterId": "x", "card": {}}])
        error = rig.sent("error")[-1]
        self.assertEqual(error["code"], "INVALID_MESSAGE")
        self.assertIn("scene.cast[0].card", error["message"])
        rig.say(type="scene", op="open", sceneId="gate", cast=CAST, reactions=99)
        self.assertIn("scene.reactions", rig.sent("error")[-1]["message"])
        rig.say(type="scene", op="leave", characterId="garrick")
        self.assertIn("no scene is open", rig.sent("error")[-1]["message"])
        rig.say(type="scene", op="dance")
        self.assertIn("scene.op must be one of", rig.sent("error")[-1]["message"])

    def test_withoutASceneTurnsAreUntagged(self) -> None:
        rig = SceneRig({"garrick": "Halt."})
        rig.say(type="character", characterId="garrick", card=CAST[0]["card"])
        done = rig.turn("Hello.")
        self.assertNotIn("lines", done)
        self.assertNotIn("speaker", rig.sent("llm")[-1])
        rig.say(type="scene", op="open", sceneId="gate", cast=CAST)
        rig.say(type="scene", op="close")
        self.assertIsNone(rig.sent("scene-state")[-1]["scene"])
        self.assertNotIn("lines", rig.turn("Hello?"))


class ActionTests(SynchronousTestCase):
    def declare(self, rig: SceneRig, *actions: dict[str, Any]) -> None:
        rig.say(type="actions", op="declare", actions=list(actions) or [OPEN_GATE])
        self.assertEqual(rig.sent("actions-result")[-1]["op"], "declare")

    def test_callReachesTheClientAndIsNotSpoken(self) -> None:
        """
        A reply that calls open_gate {"gate": "north"} reaches the client as
        tool-call-start with those arguments; the words around it are shown
        and spoken without the call.
        """
        rig = SceneRig({"garrick": GUARD_LINE, "mara": "Finally."})
        rig.openScene()
        self.declare(rig)
        done = rig.turn("Garrick, open the north gate.")
        start = rig.sent("tool-call-start")[-1]
        self.assertEqual((start["name"], start["arguments"]), ("open_gate", {"gate": "north"}))
        self.assertEqual(start["speaker"]["characterId"], "garrick")
        self.assertTrue(start["callId"].startswith("action-"))
        guard = done["lines"][0]["text"]
        self.assertNotIn("[[", guard)
        self.assertIn("open the north gate.", guard)
        self.assertIn("Stand back.", guard)
        self.assertNotIn("extractedContent", rig.sent("llm")[0])
        guardRequest = next(
            r for r in rig.engine.receivedMessages if r.get("characterId") == "garrick"
        )
        spoken = " ".join(rig.engine.spoken[guardRequest["requestId"]])
        self.assertIn("Stand back.", spoken)
        self.assertNotIn("open_gate", spoken)
        # Mara was offered no action: her request streams unbuffered.
        maraRequest = next(r for r in rig.engine.receivedMessages if r.get("characterId") == "mara")
        self.assertNotIn("responseProcessing", maraRequest["output"])
        self.assertIn("[[open_gate", rig.invocations[-2].system)

    def test_resultEndsTheCallAndIsRemembered(self) -> None:
        rig = SceneRig({"garrick": GUARD_LINE})
        rig.openScene(reactions=0)
        self.declare(rig)
        rig.turn("Garrick, open the north gate.")
        callId = rig.sent("tool-call-start")[-1]["callId"]
        rig.say(type="tool-result", callId=callId, result={"open": True})
        end = rig.sent("tool-call-end")[-1]
        self.assertEqual(end["turnId"], rig.sent("tool-call-start")[-1]["turnId"])
        self.assertEqual(end["turnId"], rig.sent("reply-complete")[-1]["turnId"])
        self.assertEqual((end["callId"], end["result"]), (callId, {"open": True}))
        rig.lines["garrick"] = "It is open."
        rig.turn("Garrick, is it open?")
        history = " ".join(text for _, text in rig.invocations[-1].history)
        self.assertIn(
            '[Game event] Garrick did open_gate {"gate": "north"}: {"open": true}', history
        )
        rig.say(type="tool-result", callId=callId, result=None)
        self.assertIn("no tool call", rig.sent("error")[-1]["message"])

    def test_timeoutEndsTheCall(self) -> None:
        rig = SceneRig({"garrick": GUARD_LINE})
        rig.openScene(reactions=0)
        self.declare(rig)
        rig.turn("Open it.")
        settle(rig.clock, 31)
        end = rig.sent("tool-call-end")[-1]
        self.assertIn("did not answer within 30 s", end["error"])

    def test_badCallsNeverReachTheClient(self) -> None:
        """
        Arguments that fail the schema, an unknown action, or an action not
        offered to that character never reach the game: they are remembered
        as not done.
        """
        for said, why in [
            ('[[open_gate {"gate": "west"}]] There.', "gate: 'west' is not one of"),
            ("[[open_gate {gate: north}]] There.", "not JSON"),
            ('[[burn_inn {"now": true}]] There.', "no such action is offered"),
        ]:
            rig = SceneRig({"garrick": said})
            rig.openScene(reactions=0)
            self.declare(rig)
            rig.turn("Open it.")
            self.assertEqual(rig.sent("tool-call-start"), [], said)
            rig.turn("Well?")
            history = " ".join(text for _, text in rig.invocations[-1].history)
            self.assertIn("but it was not done", history, said)
            self.assertIn(why, history, said)
        rig = SceneRig({"mara": '[[open_gate {"gate": "north"}]] There.'})
        rig.say(type="character", characterId="mara", card=CAST[1]["card"])
        self.declare(rig)
        rig.turn("Mara, open it.")
        request = rig.engine.receivedMessages[-1]
        self.assertNotIn("responseProcessing", request["output"], "not offered to Mara")

    def test_stagesLimitWhereAnActionIsOffered(self) -> None:
        rig = SceneRig({"garrick": GUARD_LINE})
        rig.say(type="character", characterId="garrick", card=CAST[0]["card"])
        self.declare(rig, {**OPEN_GATE, "stages": ["bribed"]})
        rig.turn("Open it.")
        self.assertEqual(rig.sent("tool-call-start"), [])
        request = [r for r in rig.engine.receivedMessages if r.get("type") == "reply.request"][-1]
        self.assertNotIn("responseProcessing", request["output"])

    def test_clientsOwnRulesKeepTheirCaptures(self) -> None:
        rig = SceneRig({"garrick": 'Fine. [[open_gate {"gate": "north"}]] <calm>'})
        rig.say(type="character", characterId="garrick", card=CAST[0]["card"])
        rule = {
            "id": "emotion",
            "matcher": {"type": "regex", "pattern": "<([a-z]+)>\\s*$"},
            "captureGroup": 1,
            "occurrence": "last",
            "remove": "match",
            "removeFrom": ["text", "audio"],
        }
        rig.say(
            type="configure", output={"responseProcessing": {"mode": "buffered", "rules": [rule]}}
        )
        self.declare(rig)
        rig.turn("Open it.")
        self.assertEqual(rig.sent("llm")[-1]["extractedContent"], {"emotion": ["calm"]})
        self.assertEqual(rig.sent("tool-call-start")[-1]["arguments"], {"gate": "north"})

    def test_badDeclarationsNameTheField(self) -> None:
        rig = SceneRig()
        for actions, field in [
            ([{"name": "Open Gate"}], "actions.actions[0].name"),
            ([{"name": "a", "parameters": {"type": "object", "properties": 3}}], "parameters"),
            ([{"name": "a"}, {"name": "a"}], "there twice"),
            ("open", "must be an array"),
        ]:
            rig.say(type="actions", op="declare", actions=actions)
            error = rig.sent("error")[-1]
            self.assertEqual(error["code"], "INVALID_MESSAGE")
            self.assertIn(field, error["message"])


class PythonApiTests(SynchronousTestCase):
    def test_sceneThroughThePythonApi(self) -> None:
        clock = Clock()
        settings = Settings()
        settings.plugins["memory"] = {"path": ":memory:", "summaries": False}
        middleware = Middleware.fromSettings(clock, settings)
        lines = {"garrick": GUARD_LINE, "mara": "At last."}
        connectInMemory(
            middleware,
            clock,
            SimulatorOptions(replyText=lambda r: lines.get(r["characterId"], "?")),
        )
        settle(clock, 0.1)
        scenes = middleware.plugin(IScenes)
        actions = middleware.plugin(IActions)
        scenes.openScene({"sceneId": "gate", "cast": CAST})
        actions.declare([OPEN_GATE])
        calls: list[dict[str, Any]] = []
        middleware.router.observe(
            lambda e: calls.append(e["message"]) if e.type == "x-client.send" else None
        )
        stream = middleware.requestReply(
            "mara",
            text="Garrick, open up.",
            card=CAST[1]["card"],
            output={"modalities": ["text"], "language": "en"},
            meta={"addressee": "garrick"},
        )
        settle(clock, 30)
        speakers = [
            e.meta["speaker"]["characterId"]
            for e in stream.envelopes
            if e.type == "reply.text.completed"
        ]
        self.assertEqual(speakers, ["garrick", "mara"])
        self.assertEqual(self.successResultOf(stream.done).type, "reply.completed")
        self.assertEqual(calls[-1]["arguments"], {"gate": "north"})
        self.assertTrue(actions.answer(calls[-1]["callId"], result="open"))
        self.assertEqual(scenes.scene()["lastSpeaker"], "mara")


class ConsoleTests(SynchronousTestCase):
    def test_statusShowsTheSceneAndTheActionsCalled(self) -> None:
        """
        The status (what the console shows) has the turn's scene: its cast,
        who spoke in order, and the actions called, without arguments.
        """
        rig = SceneRig({"garrick": GUARD_LINE, "mara": "At last."})
        rig.openScene()
        rig.say(type="actions", op="declare", actions=[OPEN_GATE])
        rig.turn("Garrick, open the gate.")
        turn = hubFor(rig.endpoint).snapshot(38471)["turns"][0]
        self.assertEqual(
            turn["scene"],
            {"sceneId": "gate", "cast": ["Garrick", "Mara"], "speakers": ["Garrick", "Mara"]},
        )
        self.assertEqual(
            [(t["name"], t["outcome"]) for t in turn["tools"]], [("open_gate", "running")]
        )
        self.assertNotIn("arguments", turn["tools"][0])

    def test_aReactionsActionIsShownOnThePlayersTurn(self) -> None:
        rig = SceneRig({"garrick": "Ask her.", "mara": GUARD_LINE})
        rig.openScene()
        rig.say(type="actions", op="declare", actions=[{**OPEN_GATE, "characters": ["mara"]}])
        rig.turn("Garrick, open the gate.")
        self.assertEqual(rig.sent("tool-call-start")[-1]["speaker"]["characterId"], "mara")
        # The reaction's call belongs to the player's turn, and says so.
        turnId = rig.sent("transcript")[-1]["turnId"]
        self.assertEqual(rig.sent("tool-call-start")[-1]["turnId"], turnId)
        rig.say(type="tool-result", callId=rig.sent("tool-call-start")[-1]["callId"], result=None)
        self.assertEqual(rig.sent("tool-call-end")[-1]["turnId"], turnId)
        turns = hubFor(rig.endpoint).snapshot(38471)["turns"]
        self.assertEqual(len(turns), 1, "the reaction is no turn of its own")
        self.assertEqual([t["name"] for t in turns[0]["tools"]], ["open_gate"])


PLAYBOOK = """
name = "gate-night"
initial = "shut"

[defaults.promptScene]
sceneLine = "The north gate at night."

[defaults.promptDirective]
sceneContext = "The north gate, after dark."
autoEventGuide = "React to what just happened."

[stages.shut.promptDirective]
directUserGuide = "The gate stays shut tonight."

[[stages.shut.transitions]]
on = "player"
keywords = ["silver"]
to = "bribed"

[stages.bribed.promptDirective]
directUserGuide = "You have been paid: you may open the gate."
"""


class PlaybookInSceneTests(SynchronousTestCase):
    def test_stageIsTheScenesAndOffersItsActions(self) -> None:
        """
        A playbook runs per client session, so per scene: each line of a
        turn (the answer and the reaction) is told the stage, and an action
        limited to a stage is offered only once the scene reached it.
        """
        rig = SceneRig({"garrick": GUARD_LINE, "mara": "Shameless."})
        rig.openScene()
        rig.say(type="playbook", toml=PLAYBOOK)
        rig.say(type="actions", op="declare", actions=[{**OPEN_GATE, "stages": ["bribed"]}])
        rig.turn("Garrick, let me through.")
        garrick, mara = rig.invocations[-2:]
        for invocation in (garrick, mara):
            self.assertIn("The north gate, after dark.", invocation.system)
        self.assertIn("The gate stays shut tonight.", garrick.system)
        self.assertIn("React to what just happened.", mara.system)
        self.assertEqual(rig.sent("tool-call-start"), [], "not offered before the stage")
        rig.turn("Garrick, here is some silver.")
        self.assertIn("You have been paid", rig.invocations[-2].system)
        self.assertEqual(rig.sent("tool-call-start")[-1]["arguments"], {"gate": "north"})


class FailureTests(SynchronousTestCase):
    def test_engineLostMidExchangeEndsTheTurn(self) -> None:
        """
        RPEngine going away while a reaction waits ends the turn with an
        error within the reactor turn, never a hang; the next RPEngine
        plays the next turn.
        """
        rig = SceneRig({"garrick": "Halt. " * 10, "mara": "Hush."})
        rig.engine.options.audioRealtime = True
        rig.openScene()
        rig.say(type="text", text="Garrick, may I pass?")
        rig.playUntilAsked("mara")
        self.assertTrue(rig.asked("mara"))
        rig.link.disconnect()
        rig.clock.advance(0)
        errors = rig.sent("error")
        self.assertEqual(errors[-1]["code"], "LLM_ERROR", errors)
        self.assertEqual(rig.connection.current, None)
        rig.link = connectInMemory(rig.middleware, rig.clock, SimulatorOptions())
        settle(rig.clock, 6)
        rig.lines["garrick"] = "Back again."
        done = rig.turn("Garrick?")
        self.assertEqual(done["lines"][0]["speaker"]["characterId"], "garrick")

    def test_failedReactionEndsTheTurnWithTheLinesSaid(self) -> None:
        """A reaction RPEngine fails ends the turn as completed, with the lines said."""
        rig = SceneRig({"garrick": "Halt."})

        def replies(request: dict[str, Any]) -> str:
            if request["characterId"] == "mara":
                raise RuntimeError("the model failed")
            return "Halt."

        rig.engine.options.replyText = replies
        rig.openScene()
        done = rig.turn("Garrick?")
        self.assertEqual([line["text"] for line in done["lines"]], ["Halt."])
        self.assertEqual(rig.sent("error"), [])
