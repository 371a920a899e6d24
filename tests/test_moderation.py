"""
Tests for the moderation plugin: local rules on streamed text, and the remote
mode against a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from rpmiddleware.builtin.moderation import (
    Moderation,
    ModerationSettings,
    Rules,
    masked,
    moderation,
)
from rpmiddleware.plugin.interfaces import IEnvelopePlugin
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.testing.kit import REFERENCE_CARD, PluginHarness


def makeHarness(reactor: Any = None, **config: Any) -> tuple[PluginHarness, Moderation]:
    plugin = Moderation(ModerationSettings.fromMapping(config), reactor)
    harness = PluginHarness(plugin, clock=reactor)
    harness.startSession()
    return harness, plugin


def request(harness: PluginHarness, text: str, requestId: str = "r1") -> Envelope:
    envelope = harness.replyRequest(requestId, text=text)
    harness.toEngine(envelope)
    return envelope


def deltas(
    harness: PluginHarness, pieces: list[str], requestId: str = "r1", name: str = "text"
) -> None:
    for sequence, piece in enumerate(pieces):
        harness.toGame("reply.text.delta", requestId=requestId, sequence=sequence, **{name: piece})


def shown(harness: PluginHarness, name: str = "text") -> list[str]:
    return [e[name] for e in harness.sentToGame if e.type == "reply.text.delta"]


def sequences(harness: PluginHarness) -> list[int]:
    return [e["sequence"] for e in harness.sentToGame if e.type == "reply.text.delta"]


class SettingsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        s = ModerationSettings.fromMapping({})
        self.assertEqual(
            (s.words, s.patterns, s.inputAction, s.outputAction, s.mask_char, s.max_hold_chars),
            ((), (), "mask", "mask", "*", 64),
        )
        self.assertEqual(
            (s.remote_url, s.remote_model, s.remote_timeout, s.fail_policy),
            ("", "omni-moderation-latest", 2.0, "open"),
        )

    def test_overrides(self) -> None:
        s = ModerationSettings.fromMapping({"action": "block", "output_action": "cancel"})
        self.assertEqual((s.inputAction, s.outputAction), ("block", "cancel"))

    def test_rejected(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"word": ["x"]}, "word"),
            ({"words": "darn"}, "words"),
            ({"words": ["ok", ""]}, "words"),
            ({"patterns": ["("]}, "patterns[0]"),
            ({"action": "shout"}, "action"),
            ({"input_action": "drop"}, "input_action"),
            ({"output_action": 1}, "output_action"),
            ({"mask_char": "##"}, "mask_char"),
            ({"max_hold_chars": 0}, "max_hold_chars"),
            ({"remote_url": "ftp://x"}, "remote_url"),
            ({"remote_model": 4}, "remote_model"),
            ({"remote_timeout": "2"}, "remote_timeout"),
            ({"remote_timeout": 0}, "remote_timeout"),
            ({"fail_policy": "maybe"}, "fail_policy"),
        ]
        for bad, key in cases:
            with self.assertRaises(ValueError) as caught:
                ModerationSettings.fromMapping(bad)
            self.assertIn(key, str(caught.exception))

    def test_factory(self) -> None:
        class Services:
            reactor = None

        plugin = moderation.buildPlugin({"words": ["darn"]}, Services())  # type: ignore[arg-type]
        self.assertEqual((moderation.name, plugin.name), ("moderation", "moderation"))
        self.assertTrue(IEnvelopePlugin.providedBy(plugin))


class RulesTests(SynchronousTestCase):
    def test_word_boundaries_and_case(self) -> None:
        rules = Rules(["darn"], [])
        self.assertEqual(
            [(h.start, h.end) for h in rules.hits("Darn! darned DARN")], [(0, 4), (13, 17)]
        )

    def test_hold_back(self) -> None:
        rules = Rules(["darn", "son of a"], [])
        # Nothing could start a match: everything goes at once.
        self.assertEqual(rules.scan("", "Hello there", False), (11, []))
        self.assertEqual(rules.scan("", "Hello th", False)[0], 8)
        # "so" could start "son of a", "d" could start "darn".
        self.assertEqual(rules.scan("", "Well so", False)[0], 5)
        self.assertEqual(rules.scan("", "Hello d", False)[0], 6)
        # Inside a word no match can start ("ad" is not at a boundary).
        self.assertEqual(rules.scan("", "Hello ad", False)[0], 8)
        self.assertEqual(rules.scan("x", "d", False)[0], 1)
        # A whole word at the end could still become "darned".
        self.assertEqual(rules.scan("", "oh darn", False)[0], 3)
        self.assertEqual(rules.scan("", "oh darn", True), (7, rules.hits("oh darn")))


class LocalTests(SynchronousTestCase):
    def test_mask_across_deltas(self) -> None:
        harness, _ = makeHarness(words=["darn"])
        request(harness, "hi")
        deltas(harness, ["dar", "n it"])
        self.assertEqual(shown(harness), ["**** it"])
        self.assertEqual(sequences(harness), [0])
        harness.toGame("reply.text.completed", requestId="r1", text="darn it")
        self.assertEqual(harness.sentToGame[-1]["text"], "**** it")

    @settings(max_examples=200, deadline=None)
    @given(
        tokens=st.lists(
            st.sampled_from(["darn", "Darned", " ", "son", " of", " a", "x", "!", "DARN", "dar"]),
            max_size=14,
        ),
        cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8),
    )
    def test_any_split_masks_like_whole_text(self, tokens: list[str], cuts: list[int]) -> None:
        """
        However the reply is cut into deltas, the game sees the text the
        whole reply masks to, in contiguous zero-based deltas.
        """
        text = "".join(tokens)
        bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
        harness, _ = makeHarness(words=["darn", "son of a"])
        deltas(harness, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
        harness.toGame("reply.completed", requestId="r1")
        rules = Rules(["darn", "son of a"], [])
        self.assertEqual("".join(shown(harness)), masked(text, rules.hits(text), "*"))
        self.assertEqual(sequences(harness), list(range(len(sequences(harness)))))

    def test_minimal_hold_back(self) -> None:
        harness, _ = makeHarness(words=["darn"])
        deltas(harness, ["Hello there, ", "adder ", "Well d"])
        # The first two could not start a match and are shown whole at once.
        self.assertEqual(shown(harness), ["Hello there, ", "adder ", "Well "])
        deltas(harness, ["ance"], requestId="r1")
        self.assertEqual(shown(harness)[-1], "dance")

    def test_sequence_renumbering(self) -> None:
        harness, _ = makeHarness(words=["darn"])
        deltas(harness, ["Oh ", "d", "a", "rn", " it", " all", " da"])
        self.assertEqual(shown(harness), ["Oh ", "**** it", " all", " "])
        self.assertEqual(sequences(harness), [0, 1, 2, 3])
        harness.toGame("reply.text.completed", requestId="r1", text="Oh darn it all da")
        harness.toGame("reply.completed", requestId="r1")
        # The held "da" is released as one more delta before the completed text.
        self.assertEqual(
            harness.typesToGame()[-3:],
            ["reply.text.delta", "reply.text.completed", "reply.completed"],
        )
        self.assertEqual(shown(harness)[-1], "da")
        self.assertEqual(sequences(harness), [0, 1, 2, 3, 4])

    def test_release_at_reply_completed(self) -> None:
        harness, _ = makeHarness(words=["darn"])
        deltas(harness, ["oh darn"], name="delta")
        self.assertEqual(shown(harness, "delta"), ["oh "])
        harness.toGame("reply.completed", requestId="r1")
        self.assertEqual(
            harness.typesToGame(), ["reply.text.delta", "reply.text.delta", "reply.completed"]
        )
        self.assertEqual(shown(harness, "delta"), ["oh ", "****"])
        self.assertEqual(sequences(harness), [0, 1])

    def test_no_rules_pass(self) -> None:
        harness, plugin = makeHarness()
        request(harness, "darn")
        deltas(harness, ["dar", "n"])
        self.assertEqual(shown(harness), ["dar", "n"])
        self.assertEqual(harness.sentToEngine[0]["event"]["text"], "darn")
        self.assertEqual(plugin._replies, {})

    def test_regex_pattern(self) -> None:
        harness, _ = makeHarness(patterns=[r"(?i)fr[a@]ck\w*", r"\b\d{3}-\d{4}\b"])
        deltas(harness, ["what the Fr", "acking hell, call 555-1234 now"])
        # "now" could still be the start of a pattern's match: it waits.
        self.assertEqual(shown(harness), ["what the ", "******** hell, call ******** "])
        harness.toGame("reply.completed", requestId="r1")
        self.assertEqual(shown(harness)[-1], "now")

    def test_block_input(self) -> None:
        harness, _ = makeHarness(words=["darn"], action="block")
        sent = request(harness, "you darn fool")
        self.assertEqual(harness.sentToEngine, [])
        [error] = harness.sentToGame
        self.assertEqual(
            {
                k: error.get(k)
                for k in ("type", "requestId", "sourceMessageId", "code", "retryable")
            },
            {
                "type": "request.error",
                "requestId": "r1",
                "sourceMessageId": sent.messageId,
                "code": "content_blocked",
                "retryable": False,
            },
        )
        self.assertIn("blocked word (words[0])", error["message"])
        self.assertNotIn("darn", error["message"])

    def test_mask_input(self) -> None:
        harness, _ = makeHarness(words=["darn"])
        request(harness, "you darn fool")
        self.assertEqual(harness.sentToEngine[0]["event"]["text"], "you **** fool")

    def test_cancel_output(self) -> None:
        harness, _ = makeHarness(words=["darn"], output_action="cancel", input_action="block")
        sent = request(harness, "hello")
        self.assertEqual(harness.typesToEngine(), ["reply.request"])
        deltas(harness, ["What the da", "rn thing", " is that"])
        harness.toGame("reply.audio.chunk", requestId="r1", sequence=0, segmentSequence=0, data="")
        harness.toGame("reply.cancelled", requestId="r1")
        self.assertEqual(harness.typesToEngine(), ["reply.request", "request.cancel"])
        self.assertEqual(harness.sentToEngine[1]["requestId"], "r1")
        self.assertEqual(harness.typesToGame(), ["reply.text.delta", "request.error"])
        self.assertEqual(shown(harness), ["What the "])
        error = harness.sentToGame[1]
        self.assertEqual(
            (error["code"], error["sourceMessageId"], error["retryable"]),
            ("content_blocked", sent.messageId, False),
        )
        self.assertIn("the character's reply was stopped", error["message"])
        # The request is forgotten after RPEngine's terminal message: a
        # (stray) later delta is no longer dropped as part of a cut reply.
        deltas(harness, ["Hello"])
        self.assertEqual(shown(harness), ["What the ", "Hello"])

    def test_cut_at_terminal(self) -> None:
        harness, _ = makeHarness(words=["darn"], action="cancel")
        deltas(harness, ["oh darn"])
        harness.toGame("reply.completed", requestId="r1")
        # The held "darn" completes at the end: the game gets an error, not
        # the completion, and nothing is cancelled upstream as it is over.
        self.assertEqual(harness.typesToGame(), ["reply.text.delta", "request.error"])
        self.assertEqual(harness.sentToEngine, [])

    def test_block_completed_text(self) -> None:
        harness, _ = makeHarness(patterns=["secret plan"], action="block")
        harness.toGame("reply.text.completed", requestId="r1", text="my secret plan")
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.assertIn("blocked pattern (patterns[0])", harness.sentToGame[0]["message"])

    def test_transcript(self) -> None:
        harness, _ = makeHarness(words=["darn"])
        harness.toGame("reply.accepted", requestId="r1", transcript="darn you")
        self.assertEqual(harness.sentToGame[0]["transcript"], "**** you")
        harness, _ = makeHarness(words=["darn"], input_action="block")
        harness.toGame("reply.accepted", requestId="r1", transcript="darn you")
        deltas(harness, ["Sorry"])
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.assertIn("the player's speech was stopped", harness.sentToGame[0]["message"])


class ModerationResource(Resource):
    """
    A stand-in /v1/moderations: flags inputs containing "forbidden"; other
    modes answer 500, never answer, or answer when told ("held").
    """

    isLeaf = True

    def __init__(self, mode: str = "normal") -> None:
        super().__init__()
        self.mode = mode
        self.bodies: list[dict[str, Any]] = []
        self.unanswered: list[Deferred[None]] = []
        self.held: list[tuple[Any, str]] = []

    def render_POST(self, request: Any) -> Any:
        self.bodies.append(json.loads(request.content.read()))
        if self.mode == "error":
            request.setResponseCode(500)
            return b"internal error"
        if self.mode == "hang":
            self.unanswered.append(request.notifyFinish())
            return NOT_DONE_YET
        if self.mode == "held":
            self.held.append((request, self.bodies[-1]["input"]))
            return NOT_DONE_YET
        return self.verdict(request, self.bodies[-1]["input"])

    def verdict(self, request: Any, text: str) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        flagged = "forbidden" in text
        return json.dumps({"id": "m", "results": [{"flagged": flagged}]}).encode()

    def answerHeld(self) -> None:
        """Answer the requests held so far (mode "held")."""
        held, self.held = self.held, []
        for request, text in held:
            request.write(self.verdict(request, text))
            request.finish()


class TrackingSite(Site):
    """
    A Site that can say when all its connections are closed, so that a test
    ends with a clean reactor.
    """

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource)
        self.open: set[Any] = set()
        self._waiting: list[Deferred[None]] = []

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        lost = protocol.connectionLost
        self.open.add(protocol)

        def connectionLost(reason: Any) -> None:
            lost(reason)
            self.open.discard(protocol)
            if not self.open:
                waiting, self._waiting = self._waiting, []
                for d in waiting:
                    d.callback(None)

        protocol.connectionLost = connectionLost
        return protocol

    def allClosed(self) -> Deferred[None]:
        if not self.open:
            return defer.succeed(None)
        d: Deferred[None] = Deferred()
        self._waiting.append(d)
        return d


def theReactor() -> Any:
    """
    The global reactor, imported only when a test runs.
    """
    from twisted.internet import reactor

    return reactor


URL = "http://moderation.test/v1/moderations"


class RemoteTests(SynchronousTestCase):
    """
    The remote mode against a stand-in service through C{StubTreq}, on a
    Clock: no socket, no real time.
    """

    def remote(
        self, mode: str = "held", **config: Any
    ) -> tuple[PluginHarness, ModerationResource, StubTreq]:
        resource = self.resource = ModerationResource(mode)
        http = StubTreq(resource)
        config.setdefault("remote_timeout", 10.0)
        settings = ModerationSettings.fromMapping(
            {"remote_url": URL, "remote_model": "test-model", **config}
        )
        plugin = Moderation(settings, Clock(), http)
        harness = PluginHarness(plugin, clock=plugin.reactor)
        harness.startSession()
        return harness, resource, http

    def sendRequest(self, harness: PluginHarness, text: str) -> tuple[Envelope, Deferred[None]]:
        envelope = harness.envelope(
            "reply.request",
            requestId="r1",
            integrationId="game",
            characterId="c1",
            card=dict(REFERENCE_CARD),
            event={"text": text},
        )
        return envelope, harness.toEngine(envelope)

    def answered(self, http: StubTreq, left: Deferred[Any]) -> Any:
        """The service answers; what was held goes on."""
        http.flush()
        self.assertNoResult(left)
        self.resource.answerHeld()
        http.flush()
        return self.successResultOf(left)

    def test_flagged(self) -> None:
        harness, resource, http = self.remote(action="block")
        envelope, left = self.sendRequest(harness, "something forbidden")
        self.assertEqual(harness.sentToEngine, [])
        self.answered(http, left)
        self.assertEqual(resource.bodies, [{"input": "something forbidden", "model": "test-model"}])
        self.assertEqual(harness.sentToEngine, [])
        [error] = harness.sentToGame
        self.assertEqual(
            (error["code"], error["sourceMessageId"]), ("content_blocked", envelope.messageId)
        )
        self.assertIn("flagged by the moderation service", error["message"])
        self.assertNotIn("forbidden", error["message"])

    def test_flagged_masks_whole_text(self) -> None:
        harness, _, http = self.remote()
        _, left = self.sendRequest(harness, "so forbidden")
        self.answered(http, left)
        self.assertEqual(harness.sentToEngine[0]["event"]["text"], "** *********")

    def test_not_flagged(self) -> None:
        harness, resource, http = self.remote(action="block")
        envelope, left = self.sendRequest(harness, "hello there")
        self.answered(http, left)
        self.assertEqual(harness.sentToEngine, [envelope])
        self.assertEqual(envelope["event"]["text"], "hello there")
        self.assertEqual(harness.sentToGame, [])
        self.assertEqual(len(resource.bodies), 1)

    def test_cancel_while_checking(self) -> None:
        harness, _, http = self.remote()
        _, left = self.sendRequest(harness, "hello")
        harness.toEngine("request.cancel", requestId="r1")
        self.answered(http, left)
        self.assertEqual(harness.sentToEngine, [])
        self.assertEqual(harness.typesToGame(), ["reply.cancelled"])

    def test_timeout_fail_open(self) -> None:
        harness, resource, http = self.remote(
            "hang", remote_timeout=0.2, fail_policy="open", action="block"
        )
        envelope, left = self.sendRequest(harness, "something forbidden")
        http.flush()
        self.assertNoResult(left)
        harness.clock.advance(0.2)
        self.successResultOf(left)
        self.assertEqual(harness.sentToEngine, [envelope])
        self.assertEqual(len(resource.bodies), 1)

    def test_timeout_fail_closed(self) -> None:
        harness, _, http = self.remote(
            "hang", remote_timeout=0.2, fail_policy="closed", action="block"
        )
        _, left = self.sendRequest(harness, "hello")
        http.flush()
        harness.clock.advance(0.2)
        self.successResultOf(left)
        self.assertEqual(harness.sentToEngine, [])
        [error] = harness.sentToGame
        self.assertEqual(error["code"], "content_blocked")
        self.assertIn("could not check it (no answer within 0.2 s)", error["message"])

    def test_server_error(self) -> None:
        harness, _, http = self.remote("error", fail_policy="closed", action="block")
        _, left = self.sendRequest(harness, "hello")
        http.flush()
        self.successResultOf(left)
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertIn("(HTTP 500)", harness.sentToGame[0]["message"])
        harness, _, http = self.remote("error", fail_policy="open", action="block")
        envelope, left = self.sendRequest(harness, "hello")
        http.flush()
        self.successResultOf(left)
        self.assertEqual(harness.sentToEngine, [envelope])

    def test_completed_text_keeps_order(self) -> None:
        """
        While the completed text is being checked, the rest of the reply
        waits behind it instead of overtaking it.
        """
        harness, _, http = self.remote()
        held = [
            harness.toGame("reply.text.completed", requestId="r1", text="all fine"),
            harness.toGame(
                "reply.audio.chunk", requestId="r1", sequence=0, segmentSequence=0, data=""
            ),
            harness.toGame("reply.completed", requestId="r1"),
        ]
        self.assertEqual(harness.sentToGame, [])
        self.answered(http, defer.gatherResults(held))
        self.assertEqual(
            harness.typesToGame(), ["reply.text.completed", "reply.audio.chunk", "reply.completed"]
        )

    def test_completed_text_flagged(self) -> None:
        harness, _, http = self.remote(output_action="cancel")
        held = [
            harness.toGame("reply.text.completed", requestId="r1", text="a forbidden tale"),
            harness.toGame(
                "reply.audio.chunk", requestId="r1", sequence=0, segmentSequence=0, data=""
            ),
        ]
        self.answered(http, defer.gatherResults(held))
        harness.toGame("reply.cancelled", requestId="r1")
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])
        self.assertIn("flagged by the moderation service", harness.sentToGame[0]["message"])

    def test_transcript_flagged(self) -> None:
        harness, _, http = self.remote(action="block")
        held = [
            harness.toGame("reply.accepted", requestId="r1", transcript="forbidden words"),
            harness.toGame("reply.text.delta", requestId="r1", sequence=0, delta="Well"),
        ]
        self.answered(http, defer.gatherResults(held))
        self.assertEqual(harness.typesToGame(), ["request.error"])
        self.assertEqual(harness.typesToEngine(), ["request.cancel"])


class RemoteOverHttpTests(TestCase):
    """
    One check end to end over a real loopback HTTP connection, with the
    plugin's own treq client and connection pool.
    """

    def test_flaggedOverHttp(self) -> Deferred[None]:
        resource = ModerationResource()
        site = TrackingSite(resource)
        port = theReactor().listenTCP(0, site, interface="127.0.0.1")
        self.addCleanup(site.allClosed)
        self.addCleanup(port.stopListening)
        url = f"http://127.0.0.1:{port.getHost().port}/v1/moderations"
        harness, plugin = makeHarness(
            theReactor(), remote_url=url, remote_model="test-model", action="block"
        )
        self.addCleanup(plugin.close)

        async def run() -> None:
            await harness.toEngine(harness.replyRequest("r1", text="something forbidden"))
            self.assertEqual(resource.bodies[0]["input"], "something forbidden")
            self.assertEqual(harness.typesToGame(), ["request.error"])

        return Deferred.fromCoroutine(run())
