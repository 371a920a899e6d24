"""
card-cache: transfers chosen per session, hashes checked against RPEngine's
canonical form computed directly, resync healed, large cards off the reactor.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Generator
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase
from zope.interface.verify import verifyObject

from rpmiddleware.builtin.card_cache import CardCache, cardCache, jsonSize
from rpmiddleware.cards.canonical import canonicalJson
from rpmiddleware.cards.validation import CardHasher
from rpmiddleware.config.settings import Settings
from rpmiddleware.plugin import PluginServices
from rpmiddleware.plugin.interfaces import IEnvelopePlugin, IPluginFactory
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import HeldHasher, PluginHarness, exampleCard


def independentHash(document: Any) -> str:
    """
    The card hash RPEngine computes (its serde_json canonical form, which
    tests/test_canonical.py holds to serde_json's own output), computed here
    directly rather than through rpmiddleware.cards.validation and its hasher.  RFC 8785
    would not do: these cards hold floats, which RPEngine writes otherwise.
    """
    return hashlib.sha256(canonicalJson(document)).hexdigest()


def snapshot(card: dict[str, Any], targetHash: str | None = None) -> dict[str, Any]:
    transfer: dict[str, Any] = {"format": "chara_card_v2", "mode": "snapshot", "snapshot": card}
    transfer["targetHash"] = targetHash if targetHash is not None else independentHash(card)
    return transfer


def reference(card: dict[str, Any]) -> dict[str, Any]:
    return {"format": "chara_card_v2", "mode": "reference", "targetHash": independentHash(card)}


class FakeEngineCards:
    """
    One RPEngine session's card cache as RPEngine keeps it: one card per
    integrationId + characterId (crates/rp-engine-core/src/session.rs).
    """

    def __init__(self) -> None:
        self.cards: dict[tuple[str, str], tuple[str, Any]] = {}

    def accept(self, transfer: dict[str, Any], key: tuple[str, str] = ("game", "mira")) -> str:
        mode, target = transfer["mode"], transfer.get("targetHash")
        held = self.cards.get(key)
        if mode == "reference":
            if held is None or held[0] != target:
                raise AssertionError(f"reference to {target}, which {key} does not hold")
            return target
        if mode == "snapshot":
            document = transfer["snapshot"]
        else:
            if held is None or held[0] != transfer["baseHash"]:
                raise AssertionError(f"patch against {transfer['baseHash']}, not held for {key}")
            document = jsonpatch.apply_patch(held[1], transfer["patch"])
        actual = independentHash(document)
        if target is not None and actual != target:
            raise AssertionError(f"targetHash {target} but the card hashes to {actual}")
        self.cards[key] = (actual, copy.deepcopy(document))
        return actual


def largeCard(entries: int = 300, marker: str = "", edited: int | None = None) -> dict[str, Any]:
    book = {
        "name": "Big lore",
        "extensions": {},
        "entries": [
            {
                "keys": [f"place-{i}", f"person-{i}"],
                "content": f"Entry {i}{marker if edited in (None, i) else ''}: "
                + "the road winds past the old mill. " * 4,
                "extensions": {},
                "enabled": True,
                "insertion_order": i,
            }
            for i in range(entries)
        ],
    }
    return exampleCard(character_book=book)


class Rig:
    """
    A card-cache in a harness, with a fake RPEngine card cache behind it.
    """

    def __init__(
        self,
        hasher: CardHasher | None = None,
        clock: Any = None,
        engineRules: bool = True,
        **kw: Any,
    ) -> None:
        self.timeline = Timeline()
        self.hasher = hasher if hasher is not None else CardHasher(None)
        self.plugin = CardCache(self.hasher, self.timeline, **kw)
        self.harness = PluginHarness(self.plugin, clock=clock, engineRules=engineRules)
        self.engine = FakeEngineCards()

    def newSession(self) -> None:
        self.harness.startSession()
        self.engine = FakeEngineCards()

    def request(
        self, requestId: str, transfer: dict[str, Any], characterId: str = "mira", **meta: Any
    ) -> Deferred[None]:
        envelope = self.harness.envelope(
            "reply.request",
            requestId=requestId,
            integrationId="game",
            characterId=characterId,
            event={"text": "Hello"},
            card=transfer,
        )
        envelope.meta.update(meta)
        return self.harness.toEngine(envelope)

    def sent(self) -> Envelope:
        return self.harness.sentToEngine[-1]

    def accept(self, requestId: str) -> None:
        """
        Let the fake engine check the last transfer sent for C{requestId} and
        answer reply.accepted.
        """
        sent = [e for e in self.harness.sentToEngine if e.requestId == requestId][-1]
        resolved = self.engine.accept(sent["card"], (sent["integrationId"], sent["characterId"]))
        self.harness.toGame("reply.accepted", requestId=requestId, resolvedCardHash=resolved)


class FactoryTests(SynchronousTestCase):
    def services(self) -> PluginServices:
        return PluginServices(None, Settings(), CardHasher(None), Timeline())

    def test_interfaces(self) -> None:
        self.assertTrue(verifyObject(IPluginFactory, cardCache))
        plugin = cardCache.buildPlugin({}, self.services())
        self.assertTrue(verifyObject(IEnvelopePlugin, plugin))
        self.assertEqual((cardCache.name, plugin.name), ("card-cache", "card-cache"))

    def test_unknownSetting(self) -> None:
        build = cardCache.buildPlugin
        e = self.assertRaises(ValueError, build, {"stor_size": 3}, self.services())
        self.assertIn("unknown setting plugins.card-cache.stor_size", str(e))

    def test_wrongTypes(self) -> None:
        for key, value in [
            ("store_size", "big"),
            ("defer_threshold", True),
            ("pending_limit", 0),
            ("store_size", 1.5),
        ]:
            build = cardCache.buildPlugin
            e = self.assertRaises(ValueError, build, {key: value}, self.services())
            self.assertIn(f"plugins.card-cache.{key} must be", str(e))

    def test_settingsUsed(self) -> None:
        plugin = cardCache.buildPlugin({"store_size": 1}, self.services())
        assert isinstance(plugin, CardCache)
        harness = PluginHarness(plugin)
        harness.startSession()
        for name in ("A", "B"):
            card = exampleCard(name=name)
            harness.toEngine(
                "character.sync", integrationId="g", characterId="c", card=snapshot(card)
            )
        self.assertEqual(len(plugin.store), 1)


class HashTests(SynchronousTestCase):
    def test_wrongHashCorrected(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        rig.request("r1", snapshot(card, targetHash="0" * 64))
        self.assertEqual(rig.sent()["card"]["targetHash"], independentHash(card))
        self.assertEqual(rig.sent()["card"]["mode"], "snapshot")

    def test_missingHashFilled(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard(name="Nameless hash")
        transfer = snapshot(card)
        del transfer["targetHash"]
        rig.request("r1", transfer)
        self.assertEqual(rig.sent()["card"]["targetHash"], independentHash(card))

    def test_unhashableCardRefused(self) -> None:
        rig = Rig()
        rig.newSession()
        # A lone surrogate: RPEngine's JSON reader (serde_json) refuses it.
        card = exampleCard(extensions={"broken": "a\ud800b"})
        rig.request("r1", snapshot(card, "0" * 64))
        self.assertEqual(rig.harness.sentToEngine, [])
        self.assertEqual(rig.harness.sentToGame[0]["code"], "invalid_character_card")


class TransferTests(SynchronousTestCase):
    def test_snapshotThenReferenceThenPatch(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        rig.request("r1", snapshot(card))
        self.assertEqual(rig.sent()["card"]["mode"], "snapshot")
        # RPEngine resolves cards in the order they arrive (app.rs
        # transport_message), so a request sent right behind the snapshot
        # may already name it.
        rig.request("r2", snapshot(card))
        self.assertEqual(rig.sent()["card"], reference(card))
        rig.accept("r1")
        rig.accept("r2")
        rig.request("r3", snapshot(card))
        self.assertEqual(rig.sent()["card"], reference(card))
        rig.engine.accept(rig.sent()["card"])

        changed = exampleCard(scenario="The inn is on fire.")
        rig.request("r4", snapshot(changed))
        transfer = rig.sent()["card"]
        self.assertEqual(transfer["mode"], "patch")
        self.assertEqual(transfer["baseHash"], independentHash(card))
        self.assertEqual(transfer["targetHash"], independentHash(changed))
        self.assertEqual(rig.engine.accept(transfer), independentHash(changed))
        self.assertLess(jsonSize(transfer), jsonSize(snapshot(changed)))

        entry = rig.timeline.get("r4")
        assert entry is not None
        self.assertEqual(entry.details["cardMode"], "patch")
        self.assertEqual(entry.details["cardBytes"], jsonSize(transfer))
        entry = rig.timeline.get("r3")
        assert entry is not None
        self.assertEqual(entry.details["cardMode"], "reference")

    def test_patchNotChosenWhenBigger(self) -> None:
        rig = Rig()
        rig.newSession()
        base = exampleCard()
        rig.request("r1", snapshot(base))
        rig.accept("r1")
        other = copy.deepcopy(base)
        other["data"] = {k: (v + "!" if isinstance(v, str) else v) for k, v in base["data"].items()}
        # The premise: a patch would cost more than the card itself.
        self.assertGreaterEqual(jsonSize(jsonpatch.make_patch(base, other).patch), jsonSize(other))
        rig.request("r2", snapshot(other))
        self.assertEqual(rig.sent()["card"]["mode"], "snapshot")
        rig.engine.accept(rig.sent()["card"])

    def test_patchOnlyAgainstSameCharacter(self) -> None:
        rig = Rig()
        rig.newSession()
        rig.request("r1", snapshot(exampleCard()), characterId="mira")
        rig.accept("r1")
        rig.request("r2", snapshot(exampleCard(name="Tom")), characterId="tom")
        self.assertEqual(rig.sent()["card"]["mode"], "snapshot")

    def test_characterSyncedAcknowledges(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        rig.harness.toEngine(
            "character.sync", integrationId="game", characterId="mira", card=snapshot(card)
        )
        self.assertEqual(rig.sent()["card"]["mode"], "snapshot")
        rig.harness.toGame("character.synced", targetHash=independentHash(card))
        rig.request("r1", snapshot(card))
        self.assertEqual(rig.sent()["card"]["mode"], "reference")
        rig.request("r2", snapshot(exampleCard(first_mes="Hi.")))
        self.assertEqual(rig.sent()["card"]["mode"], "patch")

    def test_referenceAndPatchBecomeSnapshotsInNewSession(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        changed = exampleCard(personality="Grumpy.")
        rig.request("r1", snapshot(card))
        rig.accept("r1")
        rig.request("r2", snapshot(card))
        ref = rig.sent()["card"]
        rig.request("r3", snapshot(changed))
        patch = rig.sent()["card"]
        self.assertEqual((ref["mode"], patch["mode"]), ("reference", "patch"))

        rig.newSession()
        rig.request("r3", copy.deepcopy(patch))
        self.assertEqual(rig.sent()["card"], snapshot(changed))
        # RPEngine's cache is per integrationId + characterId (session.rs):
        # another character holds nothing yet.
        rig.request("r2", copy.deepcopy(ref), characterId="tomas")
        self.assertEqual(rig.sent()["card"], snapshot(card))

    def test_patchFromGameLearnt(self) -> None:
        """
        A patch the game made itself, against a card this plugin knows, is
        enough to send its target as a snapshot in a session that lacks the base.
        """
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        rig.request("r1", snapshot(card))
        changed = exampleCard(creator="someone else")
        gamePatch = {
            "format": "chara_card_v2",
            "mode": "patch",
            "baseHash": independentHash(card),
            "targetHash": independentHash(changed),
            "patch": jsonpatch.make_patch(card, changed).patch,
        }
        rig.newSession()
        rig.request("r2", gamePatch)
        self.assertEqual(rig.sent()["card"], snapshot(changed))

    def test_patchKeepsBooleansApartFromNumbers(self) -> None:
        rig = Rig()
        rig.newSession()
        rig.request("r1", snapshot(exampleCard(extensions={"x": 1, "y": 0.0})))
        rig.accept("r1")
        changed = exampleCard(extensions={"x": True, "y": False})
        rig.request("r2", snapshot(changed))
        self.assertEqual(rig.engine.accept(rig.sent()["card"]), independentHash(changed))

    def test_unknownCardPassesUnchanged(self) -> None:
        # An unknown transfer mode is RPEngine's to refuse, not the cache's.
        rig = Rig(engineRules=False)
        rig.newSession()
        unknown = reference(exampleCard(name="Stranger"))
        rig.request("r1", dict(unknown))
        self.assertEqual(rig.sent()["card"], unknown)
        odd = {"format": "chara_card_v2", "mode": "teleport", "targetHash": "x"}
        rig.request("r2", dict(odd))
        self.assertEqual(rig.sent()["card"], odd)

    def test_storeIsBoundedButOutlivesSessions(self) -> None:
        rig = Rig(storeSize=1)
        rig.newSession()
        first, second = exampleCard(name="One"), exampleCard(name="Two")
        rig.request("r1", snapshot(first))
        rig.request("r2", snapshot(second))
        rig.newSession()
        rig.request("r3", reference(second))
        self.assertEqual(rig.sent()["card"]["mode"], "snapshot")
        rig.request("r4", reference(first))
        self.assertEqual(rig.sent()["card"], reference(first))

    def test_sessionEndForgets(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        rig.request("r1", snapshot(card))
        rig.accept("r1")
        rig.harness.endSession()
        rig.request("r2", reference(card))
        self.assertEqual(rig.sent()["card"]["mode"], "snapshot")

    def test_gameChangingItsDictLater(self) -> None:
        """
        The store keeps its own copy, so a game that edits the card it sent in
        place still gets correct patches.
        """
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        rig.request("r1", snapshot(card))
        rig.accept("r1")
        card["data"]["name"] = "Renamed in place"
        rig.request("r2", snapshot(card))
        self.assertEqual(rig.engine.accept(rig.sent()["card"]), independentHash(card))


class RefusalTests(SynchronousTestCase):
    def test_invalidCardRefusedLocally(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        card["data"]["name"] = 5
        rig.request("r1", snapshot(card, "0" * 64))
        self.assertEqual(rig.harness.sentToEngine, [])
        [error] = rig.harness.sentToGame
        self.assertEqual(error.type, "request.error")
        self.assertEqual(error["code"], "invalid_character_card")
        self.assertEqual(error["requestId"], "r1")
        self.assertIs(error["retryable"], False)
        self.assertIn("data.name", error["message"])
        self.assertIn("sourceMessageId", error)

    def test_missingFieldNamed(self) -> None:
        rig = Rig()
        rig.newSession()
        card = exampleCard()
        del card["data"]["tags"]
        rig.harness.toEngine(
            "character.sync", integrationId="g", characterId="c", card=snapshot(card, "0" * 64)
        )
        self.assertEqual(rig.harness.sentToEngine, [])
        self.assertIn("data.tags", rig.harness.sentToGame[0]["message"])
        self.assertNotIn("requestId", rig.harness.sentToGame[0])


class ResyncTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.rig = Rig()
        self.rig.newSession()
        self.card = exampleCard()
        self.rig.request("r1", snapshot(self.card), client="c7")
        self.rig.accept("r1")
        self.rig.request("r2", snapshot(self.card), client="c7")
        self.assertEqual(self.rig.sent()["card"]["mode"], "reference")
        self.rig.harness.sentToGame.clear()

    def resyncError(self, requestId: str) -> None:
        self.rig.harness.toGame(
            "request.error",
            requestId=requestId,
            code="card_resync_required",
            message="card is not cached in this session",
            retryable=True,
        )

    def test_healed(self) -> None:
        first = self.rig.sent()
        self.resyncError("r2")
        self.assertEqual(self.rig.harness.sentToGame, [])
        again = self.rig.sent()
        self.assertIsNot(again, first)
        self.assertEqual(again.requestId, "r2")
        self.assertEqual(again.type, "reply.request")
        # Without targetHash: RPEngine computes it, and says it in reply.accepted.
        self.assertEqual(
            again["card"], {"format": "chara_card_v2", "mode": "snapshot", "snapshot": self.card}
        )
        self.assertEqual(again["event"], first["event"])
        self.assertNotEqual(again.messageId, first.messageId)
        self.assertEqual(again.meta.get("client"), "c7")
        entry = self.rig.timeline.get("r2")
        assert entry is not None
        self.assertEqual(entry.details["cardMode"], "snapshot")
        # The resent snapshot reaches RPEngine before what follows it.
        self.rig.request("r3", snapshot(self.card))
        self.assertEqual(self.rig.sent()["card"]["mode"], "reference")
        self.rig.harness.toGame("reply.accepted", requestId="r2")
        self.rig.request("r4", snapshot(self.card))
        self.assertEqual(self.rig.sent()["card"]["mode"], "reference")

    def test_secondFailureSurfaces(self) -> None:
        self.resyncError("r2")
        sentBefore = len(self.rig.harness.sentToEngine)
        self.resyncError("r2")
        self.assertEqual(len(self.rig.harness.sentToEngine), sentBefore)
        [error] = self.rig.harness.sentToGame
        self.assertEqual((error["code"], error.requestId), ("card_resync_required", "r2"))

    def test_unknownRequestPassesThrough(self) -> None:
        self.resyncError("never-sent")
        self.assertEqual(self.rig.harness.typesToGame(), ["request.error"])

    def test_endedRequestNotResent(self) -> None:
        self.rig.harness.toGame("reply.completed", requestId="r2")
        self.resyncError("r2")
        self.assertEqual(self.rig.harness.typesToGame(), ["reply.completed", "request.error"])

    def test_healedInTheNextSession(self) -> None:
        """
        A reference written for one session and read by an RPEngine of the
        next (a new tab reads the file mailbox before its handshake) comes
        back as card_resync_required there, and is healed with the card.
        """
        self.rig.newSession()
        self.resyncError("r2")
        self.assertEqual(self.rig.harness.sentToGame, [])
        again = self.rig.sent()
        self.assertEqual((again.requestId, again["card"]["mode"]), ("r2", "snapshot"))


class OrderTests(SynchronousTestCase):
    def test_laterEnvelopesWaitBehindAHeldOne(self) -> None:
        hasher = HeldHasher()
        rig = Rig(hasher=hasher)
        rig.newSession()
        held = rig.request("r1", snapshot(exampleCard()))
        cancel = rig.harness.toEngine("request.cancel", requestId="r1")
        rig.request("r2", snapshot(exampleCard(name="Other")))
        self.assertFalse(held.called)
        self.assertFalse(cancel.called)
        self.assertEqual(rig.harness.sentToEngine, [])
        hasher.release()
        self.assertEqual(rig.harness.typesToEngine(), ["reply.request", "request.cancel"])
        hasher.release()
        self.assertEqual([e.requestId for e in rig.harness.sentToEngine], ["r1", "r1", "r2"])
        self.successResultOf(held)
        self.successResultOf(cancel)

    def test_largeCardDiffInLaterTurnsOnAClock(self) -> None:
        """
        On a Clock as on a real reactor, a large card's diff and its check
        each run in a later turn: the request waits for the clock.
        """
        clock = Clock()
        rig = Rig(clock=clock)
        rig.newSession()
        big = largeCard()
        self.assertGreater(jsonSize(big), 32 * 1024)
        self.successResultOf(rig.request("r1", snapshot(big)))
        rig.accept("r1")
        d = rig.request("r2", snapshot(largeCard(marker="*", edited=3)))
        self.assertNoResult(d)
        self.assertEqual(rig.harness.typesToEngine(), ["reply.request"])
        self.assertEqual(rig.plugin.deferred, 1)  # the diff waits for a later turn
        clock.advance(0)  # the diff's turn, then its check's
        self.successResultOf(d)
        self.assertEqual(rig.sent()["card"]["mode"], "patch")
        self.assertEqual(rig.plugin.deferred, 2)
        self.assertEqual(clock.getDelayedCalls(), [])


class LargeCardTurnTests(TestCase):
    """
    On the reactor's turns (a Clock's, advanced by the test), a large card
    a game owns is written down in the turn that brings it, then parsed,
    checked and hashed in a later turn,
    and diffed in a turn after that, so no one turn does it all; a card that
    needs the pure-Python RFC 8785 encoder is hashed in the thread pool (a
    real reactor's: a Clock has none).
    Later envelopes wait behind the held one.
    """

    def test_diffInItsOwnTurn(self) -> None:
        clock = Clock()
        rig = Rig(hasher=CardHasher(clock), clock=clock)
        rig.newSession()
        big = largeCard()
        d = rig.request("r1", snapshot(big, "0" * 64))
        self.assertNoResult(d)
        big["data"]["description"] = "changed after it was sent"
        clock.advance(0)
        self.successResultOf(d)
        self.assertEqual(rig.sent()["card"]["targetHash"], independentHash(largeCard()))
        self.assertEqual(rig.plugin.deferred, 0)
        rig.accept("r1")

        changed = largeCard(marker="!", edited=7)
        d = rig.request("r2", snapshot(changed))
        cancel = rig.harness.toEngine("request.cancel", requestId="r2")
        self.assertFalse(d.called)
        self.assertFalse(cancel.called)
        clock.advance(0)
        self.successResultOf(d)
        self.successResultOf(cancel)
        self.assertEqual(rig.harness.typesToEngine()[-2:], ["reply.request", "request.cancel"])
        transfer = rig.harness.sentToEngine[-2]["card"]
        self.assertEqual(transfer["mode"], "patch")
        self.assertEqual(rig.plugin.deferred, 2)  # the diff, then its check
        self.assertEqual(rig.engine.accept(transfer), independentHash(changed))

    @inlineCallbacks
    def test_slowEncoderInAThread(self) -> Generator[Deferred[Any], Any, None]:
        from twisted.internet import reactor

        hasher = CardHasher(reactor)  # type: ignore[arg-type]
        rig = Rig(hasher=hasher, clock=reactor)  # type: ignore[arg-type]
        rig.newSession()
        big = largeCard()
        big["data"]["extensions"]["talkativeness"] = 0.5
        d = rig.request("r1", snapshot(big))
        self.assertFalse(d.called)
        self.assertEqual(rig.harness.sentToEngine, [])
        yield d
        self.assertEqual(rig.sent()["card"]["targetHash"], independentHash(big))
        self.assertEqual(hasher.computed, 1)


def reordered(value: Any) -> Any:
    """
    The same JSON with every object's keys in reverse order.
    """
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


_text = st.text(max_size=30)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    _text,
)


@st.composite
def cards(draw: Any) -> dict[str, Any]:
    entries = draw(
        st.lists(
            # Every field RPEngine requires of an entry (json_core.rs validate_card_value).
            st.fixed_dictionaries(
                {
                    "keys": st.lists(_text, max_size=2),
                    "content": _text,
                    "extensions": st.just({}),
                    "enabled": st.booleans(),
                    "insertion_order": st.integers(0, 100),
                }
            ),
            max_size=4,
        )
    )
    return exampleCard(
        description=draw(st.sampled_from(["", "Kind.", "Mira runs the inn."]) | _text),
        tags=draw(st.lists(_text, max_size=3)),
        extensions=draw(st.dictionaries(st.text(max_size=4), _scalar, max_size=3)),
        character_book={"name": "lore", "extensions": {}, "entries": entries},
    )


class PropertyTests(SynchronousTestCase):
    @settings(max_examples=60, deadline=None)
    @given(cards())
    def test_hashStableUnderKeyOrder(self, card: dict[str, Any]) -> None:
        rig = Rig()
        rig.newSession()
        rig.request("r1", snapshot(reordered(card), "0" * 64))
        self.assertEqual(rig.sent()["card"]["targetHash"], independentHash(card))
        rig.accept("r1")
        rig.request("r2", snapshot(card, "0" * 64))
        self.assertEqual(rig.sent()["card"], reference(card))

    @settings(max_examples=60, deadline=None)
    @given(cards(), cards())
    def test_patchReproducesTarget(self, base: dict[str, Any], target: dict[str, Any]) -> None:
        rig = Rig()
        rig.newSession()
        rig.request("r1", snapshot(base))
        rig.accept("r1")
        rig.request("r2", snapshot(target))
        transfer = rig.sent()["card"]
        self.assertEqual(transfer["targetHash"], independentHash(target))
        if transfer["mode"] == "patch":
            patched = jsonpatch.apply_patch(base, transfer["patch"])
            self.assertEqual(independentHash(patched), transfer["targetHash"])
            self.assertLess(jsonSize(transfer["patch"]), jsonSize(target))
        else:
            self.assertIn(transfer["mode"], ("snapshot", "reference"))
            self.assertEqual(rig.engine.accept(transfer), independentHash(target))


class EngineHashTests(SynchronousTestCase):
    """
    RPEngine's hash is the one that counts (crates/rp-engine-core/src/
    session.rs hashes with its own canonical form): what it reports in
    reply.accepted.resolvedCardHash names the card from then on.
    """

    def setUp(self) -> None:
        self.rig = Rig()
        self.rig.newSession()
        self.card = exampleCard()
        self.ours = independentHash(self.card)
        self.theirs = "f" * 64
        self.rig.request("r1", snapshot(self.card))
        self.rig.harness.toGame("reply.accepted", requestId="r1", resolvedCardHash=self.theirs)

    def test_referenceUsesEngineHash(self) -> None:
        self.rig.request("r2", snapshot(self.card))
        self.assertEqual(
            self.rig.sent()["card"],
            {"format": "chara_card_v2", "mode": "reference", "targetHash": self.theirs},
        )

    def test_noPatchWhoseTargetCannotBeKnown(self) -> None:
        """
        Where RPEngine hashed the base differently, the target's hash cannot
        be known: the change goes as a snapshot without targetHash, which
        RPEngine computes itself.
        """
        changed = exampleCard(scenario="The inn is on fire.")
        self.rig.request("r2", snapshot(changed))
        transfer = self.rig.sent()["card"]
        self.assertEqual(transfer["mode"], "snapshot")
        self.assertEqual(transfer["targetHash"], independentHash(changed))
        self.rig.request("r3", snapshot(self.card))
        self.assertEqual(self.rig.sent()["card"]["mode"], "snapshot")
        self.assertNotIn("targetHash", self.rig.sent()["card"])

    def test_characterSyncTeachesTheHash(self) -> None:
        envelope = self.rig.harness.envelope(
            "character.sync",
            integrationId="game",
            characterId="tomas",
            card=snapshot(exampleCard(name="Tomas")),
        )
        self.rig.harness.toEngine(envelope)
        self.rig.harness.toGame(
            "character.synced", integrationId="game", characterId="tomas", targetHash="e" * 64
        )
        self.rig.request("r2", snapshot(exampleCard(name="Tomas")), characterId="tomas")
        self.assertEqual(self.rig.sent()["card"]["targetHash"], "e" * 64)
        self.assertEqual(self.rig.sent()["card"]["mode"], "reference")

    def test_referenceOnlyForTheSameCharacter(self) -> None:
        """
        RPEngine holds one card per integrationId + characterId: the same
        card for another character is sent whole.
        """
        self.rig.request("r2", snapshot(self.card), characterId="tomas")
        self.assertEqual(self.rig.sent()["card"]["mode"], "snapshot")
