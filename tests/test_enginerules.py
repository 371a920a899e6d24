"""
RPEngine's rules for game envelopes, checked before sending: each case is one
that crates/rp-engine-core/src/json_core.rs (validate_envelope_value,
validate_output, validate_prompt_context, validate_card_transfer) or text.rs
(parse_response_processing) refuses, or accepts.
"""

from __future__ import annotations

import copy
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.cards.validation import InvalidCard, validateCard
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.rules import EngineRefusal, checkEnvelope
from rpmiddleware.testing.kit import exampleCard, examplePromptContext, exampleResponseRule

RULE = exampleResponseRule()
CONTEXT = examplePromptContext("auto_event")


def request(**changes: Any) -> dict[str, Any]:
    card = exampleCard()
    fields = Envelope.build(
        "reply.request",
        "s1",
        requestId="r1",
        eventId="e1",
        integrationId="game",
        characterId="mira",
        event={"text": "Hello"},
        output={
            "modalities": ["text", "audio"],
            "language": "en",
            "audio": {"model": "gemtavern-supertonic-3", "voice": "F1", "format": "pcm_s16le"},
        },
        card={"format": "chara_card_v2", "mode": "snapshot", "snapshot": card},
    ).fields
    fields.update(changes)
    return fields


def refused(fields: dict[str, Any]) -> EngineRefusal:
    try:
        checkEnvelope(fields)
    except EngineRefusal as e:
        return e
    raise AssertionError("accepted")


class EnvelopeRuleTests(SynchronousTestCase):
    def test_validRequest(self) -> None:
        checkEnvelope(request())
        checkEnvelope(request(**CONTEXT))
        checkEnvelope(request(output={"modalities": ["text"], "language": "en"}))

    def test_head(self) -> None:
        self.assertEqual(refused(request(protocolVersion="3")).field, "protocolVersion")
        self.assertEqual(refused(request(messageId="")).field, "messageId")
        self.assertEqual(refused(request(eventId=None)).field, "eventId")

    def test_event(self) -> None:
        self.assertEqual(refused(request(event={"text": "  "})).field, "event")
        self.assertEqual(refused(request(event={"text": 5, "audio": {}})).field, "event.text")
        audio = {"format": "pcm_s16le", "sampleRate": 24000, "channels": 1, "data": "AAAA"}
        self.assertEqual(refused(request(event={"audio": audio})).field, "event.audio")
        audio.update(sampleRate=16000, language="fr")
        self.assertEqual(refused(request(event={"audio": audio})).field, "event.audio.language")
        audio.update(language="en")
        checkEnvelope(request(event={"audio": audio}))

    def test_output(self) -> None:
        cases = [
            ({"modalities": ["audio"], "language": "en"}, "output.modalities"),
            ({"modalities": ["text", "text"], "language": "en"}, "output.modalities"),
            ({"modalities": ["text", "audio"], "language": "en"}, "output.audio"),
            ({"modalities": ["text"], "language": " "}, "output.language"),
            (
                {"modalities": ["text"], "language": "en", "audio": {"voice": "F1"}},
                "output.audio",
            ),
            (
                {
                    "modalities": ["text", "audio"],
                    "language": "en",
                    "audio": {"model": "other", "voice": "F1"},
                },
                "output.audio.model",
            ),
            (
                {
                    "modalities": ["text", "audio"],
                    "language": "en",
                    "audio": {
                        "model": "gemtavern-supertonic-3",
                        "voice": "F1",
                        "processing": {"profile": "telephone"},
                    },
                },
                "output.audio.processing.profile",
            ),
        ]
        for output, field in cases:
            self.assertEqual(refused(request(output=output)).field, field, output)

    def test_responseProcessing(self) -> None:
        def processing(**rule: Any) -> dict[str, Any]:
            return {
                "modalities": ["text"],
                "language": "en",
                "responseProcessing": {"mode": "buffered", "rules": [{**RULE, **rule}]},
            }

        checkEnvelope(request(output=processing()))
        at = "output.responseProcessing.rules[0]"
        cases: list[tuple[dict[str, Any], str]] = [
            ({"id": "Emotion"}, f"{at}.id"),
            ({"captureGroup": 2}, f"{at}.captureGroup"),
            ({"occurrence": "every"}, f"{at}.occurrence"),
            ({"remove": "none"}, f"{at}.removeFrom"),
            ({"removeFrom": ["text", "text"]}, f"{at}.removeFrom"),
            ({"matcher": {"type": "regex", "pattern": "(?<=a)b"}}, f"{at}.matcher.pattern"),
            ({"matcher": {"type": "regex", "pattern": "a", "flags": "x"}}, f"{at}.matcher.flags"),
            ({"matcher": {"type": "glob", "pattern": "a"}}, f"{at}.matcher.type"),
        ]
        for rule, field in cases:
            self.assertEqual(refused(request(output=processing(**rule))).field, field, rule)
        many = processing()
        many["responseProcessing"]["rules"] = [dict(RULE, id=f"r{i}") for i in range(9)]
        self.assertEqual(refused(request(output=many)).field, "output.responseProcessing.rules")

    def test_promptContextAllOrNone(self) -> None:
        partial = {"promptScene": CONTEXT["promptScene"]}
        error = refused(request(**partial))
        self.assertEqual(error.field, "interactionMode")
        self.assertIn("go together", str(error))
        for name, change, field in [
            ("interactionMode", "chat", "interactionMode"),
            ("promptScene", {**CONTEXT["promptScene"], "priority": "high"}, "promptScene.priority"),
            ("promptScene", {**CONTEXT["promptScene"], "label": ""}, "promptScene.label"),
            (
                "promptDirective",
                {**CONTEXT["promptDirective"], "protocolVersion": 0},
                "promptDirective.protocolVersion",
            ),
            (
                "promptDirective",
                {**CONTEXT["promptDirective"], "promptVersion": " "},
                "promptDirective.promptVersion",
            ),
        ]:
            self.assertEqual(refused(request(**{**CONTEXT, name: change})).field, field)

    def test_cardTransfer(self) -> None:
        self.assertEqual(refused(request(card={"format": "x"})).field, "card.format")
        self.assertEqual(
            refused(request(card={"format": "chara_card_v2", "mode": "snapshot"})).field,
            "card.snapshot",
        )
        self.assertEqual(
            refused(
                request(card={"format": "chara_card_v2", "mode": "patch", "targetHash": "a"})
            ).field,
            "card.baseHash",
        )

    def test_voiceCaptureOptions(self) -> None:
        fields = request(type="voice.capture.start")
        del fields["event"]
        checkEnvelope({**fields, "returnTranscript": True, "silenceBehavior": "restart"})
        self.assertEqual(refused({**fields, "returnTranscript": "yes"}).field, "returnTranscript")
        self.assertEqual(refused({**fields, "silenceBehavior": "wait"}).field, "silenceBehavior")

    def test_withdrawals(self) -> None:
        cancel = Envelope.build("request.cancel", "s1").fields
        self.assertEqual(refused(cancel).field, "requestId")
        checkEnvelope({**cancel, "requestId": "r1"})

    def test_unknownTypesPass(self) -> None:
        """
        RPEngine acks and ignores a type it does not know.
        """
        checkEnvelope(Envelope.build("x.custom", "s1").fields)


class CardRuleTests(SynchronousTestCase):
    """
    json_core.rs validate_card_value.
    """

    def invalid(self, card: dict[str, Any]) -> str:
        with self.assertRaises(InvalidCard) as caught:
            validateCard(card)
        return caught.exception.field

    def test_blankName(self) -> None:
        self.assertEqual(self.invalid(exampleCard(name="  ")), "data.name")

    def test_characterBook(self) -> None:
        entry = {
            "keys": ["inn"],
            "content": "The Rusty Anchor.",
            "extensions": {},
            "enabled": True,
            "insertion_order": 0,
        }
        book: dict[str, Any] = {"extensions": {}, "entries": [entry]}
        validateCard(exampleCard(character_book=book))
        cases = [
            ({"extensions": None}, "data.character_book.entries[0].extensions"),
            ({"enabled": 1}, "data.character_book.entries[0].enabled"),
            ({"insertion_order": "1"}, "data.character_book.entries[0].insertion_order"),
            ({"keys": ["a", 1]}, "data.character_book.entries[0].keys[1]"),
            ({"position": "middle"}, "data.character_book.entries[0].position"),
            ({"priority": None}, "data.character_book.entries[0].priority"),
        ]
        for change, field in cases:
            changed = copy.deepcopy(book)
            changed["entries"][0].update(change)
            self.assertEqual(self.invalid(exampleCard(character_book=changed)), field)
        self.assertEqual(
            self.invalid(exampleCard(character_book={"entries": []})),
            "data.character_book.extensions",
        )
        self.assertEqual(
            self.invalid(exampleCard(character_book={"extensions": {}, "scan_depth": "3"})),
            "data.character_book.scan_depth",
        )
