"""
The scene plugin's parts on their own: a scene's description checked field
by field, and the director's choices.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin.scene.director import answerer, named, reactor
from rpmiddleware.builtin.scene.model import Scene, SceneError, parseScene
from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import exampleCard


def card(name: str) -> dict[str, Any]:
    return exampleCard(name=name)


def own(document: dict[str, Any]) -> tuple[dict[str, Any], str]:
    return document, "0" * 64


def threeOf(**extra: Any) -> Scene:
    return parseScene(
        {
            "sceneId": "square",
            "cast": [
                {"characterId": "garrick", "card": card("Garrick the Guard")},
                {"characterId": "mara", "card": card("Mara")},
                {"characterId": "tom", "card": card("Tom")},
            ],
            **extra,
        },
        "game",
        own,
    )


class DescriptionTests(SynchronousTestCase):
    def test_errorsNameTheField(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"sceneId": "bad id!"}, "scene.sceneId"),
            ({"sceneId": "s", "cast": []}, "scene.cast must be a non-empty array"),
            (
                {"sceneId": "s", "cast": [{"characterId": "a", "card": card("A"), "voice": "X9"}]},
                "voice",
            ),
            (
                {"sceneId": "s", "cast": [{"characterId": "a", "card": card("A: B")}]},
                "without a colon",
            ),
            (
                {
                    "sceneId": "s",
                    "cast": [{"characterId": "a", "card": card("A"), "hears": ["zed"]}],
                },
                "'zed', who is not in the scene",
            ),
            ({"sceneId": "s", "cast": [{"characterId": "a", "card": card("A")}] * 2}, "twice"),
            (
                {
                    "sceneId": "s",
                    "cast": [{"characterId": "a", "card": card("A")}],
                    "director": "x",
                },
                "director",
            ),
            ({"sceneId": "s", "cast": [{"characterId": "a", "card": card("A")}] * 9}, "at most 8"),
        ]
        for description, expected in cases:
            with self.assertRaises(SceneError) as caught:
                parseScene(description, "game", own)
            self.assertIn(expected, str(caught.exception))

    def test_voiceAndHearingKept(self) -> None:
        made = parseScene(
            {
                "sceneId": "s",
                "cast": [
                    {"characterId": "a", "card": card("A"), "voice": "F2", "hears": ["player"]},
                    {"characterId": "b", "card": card("B")},
                ],
            },
            "game",
            own,
        )
        self.assertEqual(
            made.cast["a"].asSpeaker(), {"characterId": "a", "name": "A", "voice": "F2"}
        )
        self.assertEqual([m.characterId for m in made.listeners("b")], [])
        self.assertEqual([m.characterId for m in made.listeners("player")], ["a", "b"])
        self.assertEqual(made.cast["a"].transfer["mode"], "snapshot")


class DirectorTests(SynchronousTestCase):
    def test_namedFindsTheEarliestNameAndFirstNames(self) -> None:
        scene = threeOf()
        cast = list(scene.cast.values())
        self.assertEqual(named("Tom, ask Garrick.", cast).characterId, "tom")  # type: ignore[union-attr]
        self.assertEqual(named("Well, garrick?", cast).characterId, "garrick")  # type: ignore[union-attr]
        self.assertIsNone(named("Tomorrow, Marathon.", cast), "whole words only")

    def test_answererOrder(self) -> None:
        scene = threeOf()
        self.assertEqual(answerer(scene, "Hello there.", "mara", None).characterId, "mara")
        self.assertEqual(answerer(scene, "Tom, hello.", "mara", None).characterId, "tom")
        self.assertEqual(answerer(scene, "Tom, hello.", "mara", "garrick").characterId, "garrick")
        scene.nextAddressee = "garrick"
        self.assertEqual(answerer(scene, "Tom, hello.", "mara", None).characterId, "garrick")
        scene.nextAddressee = None
        self.assertEqual(answerer(scene, "Hi.", "nobody", None).characterId, "garrick")

    def test_directorRules(self) -> None:
        scene = threeOf(director="round-robin")
        scene.lastSpeaker = "mara"
        self.assertEqual(answerer(scene, "Hi.", "garrick", None).characterId, "tom")
        scene.lastSpeaker = "tom"
        self.assertEqual(answerer(scene, "Hi.", "garrick", None).characterId, "garrick")
        scene = threeOf(director="last-speaker")
        scene.lastSpeaker = "tom"
        self.assertEqual(answerer(scene, "Hi.", "garrick", None).characterId, "tom")

    def test_onlyThoseWhoHearThePlayerAnswer(self) -> None:
        scene = threeOf()
        scene.cast["tom"] = scene.cast["tom"].__class__(
            "tom", "Tom", scene.cast["tom"].transfer, None, frozenset({"mara"})
        )
        self.assertEqual(answerer(scene, "Tom!", "tom", None).characterId, "garrick")

    def test_reactorGoesRoundTheRoom(self) -> None:
        scene = threeOf()
        scene.spoken = ["garrick", "mara"]
        self.assertEqual(reactor(scene, "garrick", "Halt.", ["garrick"]).characterId, "tom")  # type: ignore[union-attr]
        self.assertEqual(reactor(scene, "garrick", "Mara, see?", ["garrick"]).characterId, "mara")  # type: ignore[union-attr]
        scene.spoken = ["tom", "garrick", "mara"]
        self.assertEqual(reactor(scene, "mara", "So.", ["garrick", "mara"]).characterId, "tom")  # type: ignore[union-attr]


class PluginTests(SynchronousTestCase):
    def harness(self) -> Any:
        from rpmiddleware.builtin.actions import ActionsSettings, buildActions
        from rpmiddleware.builtin.scene import SceneSettings, buildScene
        from rpmiddleware.testing.kit import PluginHarness, exampleAction, pluginServices

        clock = Clock()
        services = pluginServices(clock)
        scene = buildScene(SceneSettings(), services)
        actions = buildActions(ActionsSettings(), services)
        harness = PluginHarness([scene, actions], clock)
        harness.startSession()
        scene.openScene(
            {
                "sceneId": "gate",
                "cast": [
                    {"characterId": "garrick", "card": card("Garrick")},
                    {"characterId": "mara", "card": card("Mara")},
                ],
            }
        )
        actions.declare([exampleAction()])
        return harness

    def test_aLineSentAgainIsNotPlayedTwice(self) -> None:
        """
        A request the engine link sends again (resubmitted in a new RPEngine
        session) passes as it went the first time: no second answerer, no
        line heard twice, no second action rule (RPEngine refuses a
        duplicate rule id).
        """
        harness = self.harness()
        output = {"modalities": ["text"], "language": "en"}
        harness.toEngine(
            harness.replyRequest(text="Garrick, open up.", characterId="mara", output=output)
        )
        heard = [e for e in harness.sentToEngine if e.type == "x-memory.heard"]
        self.assertEqual([e["characterId"] for e in heard], ["mara"])
        request = harness.sentToEngine[-1]
        self.assertEqual(request["characterId"], "garrick")
        again = Envelope(dict(request.fields), {**request.meta, "resubmitted": True})
        harness.toEngine(again)
        resent = harness.sentToEngine[-1]
        self.assertEqual(resent.fields, request.fields)
        self.assertEqual([e for e in harness.sentToEngine if e.type == "x-memory.heard"], heard)
        rules = resent["output"]["responseProcessing"]["rules"]
        self.assertEqual([r["id"] for r in rules], ["rpmiddleware.action"])

    def test_joinIsBoundedAndChecked(self) -> None:
        from rpmiddleware.builtin.scene import ScenePlugin

        plugin = ScenePlugin(CardHasher(None), None)
        cast = [{"characterId": f"c{i}", "card": card(f"C{i}")} for i in range(8)]
        plugin.openScene({"sceneId": "s", "cast": cast})
        with self.assertRaises(SceneError) as caught:
            plugin.join({"characterId": "c9", "card": card("Nine")})
        self.assertIn("at most 8", str(caught.exception))
        with self.assertRaises(SceneError) as caught:
            plugin.join({"characterId": "c1", "card": card("One"), "hears": ["ghost"]})
        self.assertIn("'ghost', who is not in the scene", str(caught.exception))
        described = plugin.scene()
        assert described is not None
        self.assertEqual(described["cast"][1]["name"], "C1", "the member is as it was")
