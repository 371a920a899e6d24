"""
Client messages and error codes: what is refused, with what words, and how
every RPEngine code reaches a client.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.client import messages
from rpmiddleware.client.messages import configureChanges, decodeFrame, turnOptions
from rpmiddleware.protocol import clienterrors as errors
from rpmiddleware.protocol import clientfields
from rpmiddleware.protocol.clienterrors import (
    CLIENT_CODES,
    ENGINE_TO_CLIENT,
    InvalidMessage,
    engineErrorMessage,
)
from rpmiddleware.protocol.messages import ERROR_CODES


def frame(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


class DecodeFrameTests(SynchronousTestCase):
    def assertRefused(self, payload: bytes, isBinary: bool, words: str) -> None:
        with self.assertRaises(InvalidMessage) as caught:
            decodeFrame(payload, isBinary)
        self.assertIn(words, str(caught.exception))

    def test_refusals(self) -> None:
        """
        Each kind of malformed frame is refused with a sentence naming the
        problem.
        """
        cases = [
            (b"not json", False, "not valid JSON"),
            (b"\xff\xfe", False, "UTF-8"),
            (frame([1, 2]), False, "must be a JSON object, got an array"),
            (frame("text"), False, "got a string"),
            (frame({"text": "hi"}), False, "string type"),
            (frame({"type": 5}), False, "string type"),
            (frame({"type": "bogus"}), False, "unknown message type 'bogus'"),
            (frame({"type": "ping", "timestamp": 1}), True, "binary frames"),
            (b'{"type": "ping", "timestamp": NaN}', False, "NaN is not a JSON value"),
            (b'{"type": "ping", "timestamp": -Infinity}', False, "not a JSON value"),
        ]
        for payload, isBinary, words in cases:
            self.assertRefused(payload, isBinary, words)

    def test_accepted(self) -> None:
        for kind in messages.CLIENT_TYPES:
            self.assertEqual(decodeFrame(frame({"type": kind}), False)["type"], kind)


class FieldTests(SynchronousTestCase):
    def test_string(self) -> None:
        with self.assertRaises(InvalidMessage) as caught:
            clientfields.string({"type": "text"}, "text")
        self.assertEqual(str(caught.exception), "text needs text")
        with self.assertRaises(InvalidMessage) as caught:
            clientfields.string({"type": "text", "text": 5}, "text")
        self.assertEqual(str(caught.exception), "text.text must be a string, got a number")
        with self.assertRaises(InvalidMessage):
            clientfields.string({"type": "text", "text": "   "}, "text")
        self.assertEqual(clientfields.string({"type": "text", "text": "hi"}, "text"), "hi")

    def test_number(self) -> None:
        self.assertEqual(clientfields.number({"type": "ping", "timestamp": 1.5}, "timestamp"), 1.5)
        for bad in (True, "1", None, [1]):
            with self.assertRaises(InvalidMessage):
                clientfields.number({"type": "ping", "timestamp": bad}, "timestamp")

    def test_identifier(self) -> None:
        message = {"type": "reconnect", "sessionId": "x" * 257}
        with self.assertRaises(InvalidMessage) as caught:
            clientfields.identifier(message, "sessionId")
        self.assertIn("longer than 256", str(caught.exception))
        self.assertIsNone(clientfields.identifier({"type": "character"}, "x", required=False))

    def test_attachments(self) -> None:
        parsed = messages.attachments(
            {
                "type": "attachments",
                "attachments": [
                    {"data": "data:image/png;base64,AAAA", "alt": "  a   red\ndoor "},
                    {"data": "https://example/x.png", "mimeType": "image/png"},
                ],
            },
            required=True,
        )
        self.assertEqual([a.usableAlt for a in parsed], ["a red door", None])
        self.assertEqual(parsed[1].mimeType, "image/png")
        bad: list[tuple[dict[str, Any], str]] = [
            ({"type": "attachments"}, "needs attachments"),
            ({"type": "attachments", "attachments": {}}, "must be an array"),
            ({"type": "attachments", "attachments": [3]}, "attachments[0] must be an object"),
            ({"type": "attachments", "attachments": [{"alt": "x"}]}, "attachments[0].data"),
            (
                {"type": "attachments", "attachments": [{"data": "x"}, {"data": ""}]},
                "attachments.attachments[1].data must be a non-empty string (a data URI or URL)",
            ),
            (
                {"type": "attachments", "attachments": [{"data": "x", "mimeType": ["a"]}]},
                "attachments.attachments[0].mimeType must be a string or null, got an array",
            ),
            (
                {"type": "attachments", "attachments": [{"data": "x", "alt": 3}]},
                "attachments[0].alt must be a string",
            ),
        ]
        for message, words in bad:
            with self.assertRaises(InvalidMessage) as caught:
                messages.attachments(message, required=True)
            self.assertIn(words, str(caught.exception))
        self.assertEqual(messages.attachments({"type": "audio"}, required=False), [])

    def test_longAltIsCut(self) -> None:
        [attachment] = messages.attachments(
            {"type": "attachments", "attachments": [{"data": "x", "alt": "y" * 5000}]},
            required=True,
        )
        assert attachment.usableAlt is not None
        self.assertEqual(len(attachment.usableAlt), messages.MAX_ALT_CHARS)

    def test_voiceAction(self) -> None:
        for action in ("start", "stop", "cancel"):
            self.assertEqual(
                messages.voiceAction({"type": "voice-capture", "action": action}), action
            )
        with self.assertRaises(InvalidMessage) as caught:
            messages.voiceAction({"type": "voice-capture", "action": "jump"})
        self.assertIn("start, stop, cancel", str(caught.exception))


class ConfigureTests(SynchronousTestCase):
    def refused(self, message: dict[str, Any]) -> str:
        with self.assertRaises(InvalidMessage) as caught:
            configureChanges({"type": "configure", **message})
        return str(caught.exception)

    def test_everything(self) -> None:
        processing = {
            "mode": "buffered",
            "rules": [
                {
                    "id": "mood",
                    "matcher": {"type": "regex", "pattern": r"\[mood:(\w+)\]", "flags": "i"},
                    "captureGroup": 1,
                    "occurrence": "last",
                    "remove": "match",
                    "removeFrom": ["text", "audio"],
                }
            ],
        }
        scene = {
            "kind": "location",
            "family": "tavern",
            "label": "The Drowned Rat",
            "sceneLine": "A smoky tavern at dusk.",
            "priority": 2,
        }
        directive = {
            "protocolVersion": 1,
            "sceneContext": "Stay in the tavern.",
            "autoEventGuide": "React briefly.",
            "directUserGuide": "Answer the player.",
        }
        changes = configureChanges(
            {
                "type": "configure",
                "output": {
                    "modalities": ["text"],
                    "language": "fr",
                    "voice": "M3",
                    "sampleRate": 44100,
                    "streaming": False,
                    "audioProcessing": "cinematic_radio",
                    "responseProcessing": processing,
                },
                "player": {"displayName": "Ada"},
                "interactionMode": "direct_user",
                "promptScene": scene,
                "promptDirective": directive,
                "inputLanguage": "ja",
                "silenceBehavior": "restart",
                "bargeIn": False,
            }
        )
        self.assertEqual(
            changes,
            {
                "modalities": ["text"],
                "language": "fr",
                "voice": "M3",
                "sampleRate": 44100,
                "streaming": False,
                "audioProcessing": "cinematic_radio",
                "responseProcessing": processing,
                "player": {"displayName": "Ada"},
                "interactionMode": "direct_user",
                "promptScene": scene,
                "promptDirective": directive,
                "inputLanguage": "ja",
                "silenceBehavior": "restart",
                "bargeIn": False,
            },
        )

    def test_nullResets(self) -> None:
        self.assertEqual(
            configureChanges(
                {
                    "type": "configure",
                    "output": {"voice": None, "responseProcessing": None, "audioProcessing": None},
                    "player": None,
                    "silenceBehavior": None,
                }
            ),
            {
                "voice": None,
                "responseProcessing": None,
                "audioProcessing": None,
                "player": None,
                "silenceBehavior": None,
            },
        )

    def test_refusedLocally(self) -> None:
        """
        Voices and languages outside the seed's lists, response-processing
        rules RPEngine would refuse, and everything else malformed, are
        refused with the field named.
        """
        rule = {
            "id": "mood",
            "matcher": {"type": "regex", "pattern": "x"},
            "captureGroup": 0,
            "occurrence": "first",
            "remove": "none",
            "removeFrom": [],
        }
        cases: list[tuple[dict[str, Any], str]] = [
            ({"output": {"voice": "F6"}}, "configure.output.voice 'F6' is not a voice"),
            ({"output": {"voice": "f1"}}, "is not a voice"),
            ({"output": {"language": "xx"}}, "configure.output.language 'xx'"),
            ({"output": {"language": 7}}, "configure.output.language a number"),
            ({"inputLanguage": "fr"}, "configure.inputLanguage 'fr'"),
            ({"output": {"modalities": ["audio"]}}, "modalities must be"),
            ({"output": {"modalities": "text"}}, "modalities must be"),
            ({"output": {"sampleRate": 4000}}, "sampleRate must be a whole number"),
            ({"output": {"sampleRate": 24000.5}}, "sampleRate must be a whole number"),
            ({"output": {"sampleRate": True}}, "sampleRate must be a whole number"),
            ({"output": {"streaming": "yes"}}, "streaming must be"),
            ({"output": {"voise": "F1"}}, "unknown field 'voise'"),
            ({"speechMarks": ["word", "phoneme"]}, "speechMarks has unknown kind 'phoneme'"),
            ({"speechMarks": "word"}, "configure.speechMarks must be a list"),
            ({"output": []}, "configure.output must be an object"),
            ({"voice": "F1"}, "configure has unknown field 'voice'"),
            ({"player": "Ada"}, "configure.player must be an object"),
            ({"player": {"displayName": 3}}, "configure.player.displayName must be a string, got"),
            ({"player": {"displayName": None}}, "configure.player.displayName must be a string"),
            ({"interactionMode": ""}, "configure.interactionMode '' is not an interaction mode"),
            ({"interactionMode": "chat"}, "(one of auto_event, direct_user)"),
            ({"promptScene": "tavern"}, "configure.promptScene must be an object or null"),
            ({"silenceBehavior": "wait"}, "configure.silenceBehavior 'wait' is not what RPEngine"),
            ({"bargeIn": 1}, "bargeIn must be"),
            (
                {"output": {"audioProcessing": "telephone"}},
                "configure.output.audioProcessing 'telephone' is not an audio processing "
                "profile of RPEngine (one of cinematic_radio, narrowband_voice)",
            ),
            (
                {"output": {"responseProcessing": {"mode": "streaming", "rules": [rule]}}},
                'configure.output.responseProcessing.mode must be "buffered"',
            ),
            (
                {
                    "output": {
                        "responseProcessing": {
                            "mode": "buffered",
                            "rules": [{**rule, "id": "Mood"}],
                        }
                    }
                },
                "configure.output.responseProcessing.rules[0].id must match",
            ),
            (
                {
                    "output": {
                        "responseProcessing": {
                            "mode": "buffered",
                            "rules": [{**rule, "matcher": {"type": "regex", "pattern": "(?=x)y"}}],
                        }
                    }
                },
                "configure.output.responseProcessing.rules[0].matcher.pattern uses",
            ),
        ]
        for message, words in cases:
            self.assertIn(words, self.refused(message), message)

    def test_blankDisplayName(self) -> None:
        """
        A blank displayName is RPEngine's to replace with "Player", as it does.
        """
        self.assertEqual(
            configureChanges({"type": "configure", "player": {"displayName": " "}}),
            {"player": {"displayName": " "}},
        )

    def test_nothingAppliedWhenOneFieldIsBad(self) -> None:
        """
        A configure with one bad field changes nothing: the whole message
        is checked before any of it is used.
        """
        self.refused({"output": {"voice": "M1", "language": "xx"}})


class TurnOptionsTests(SynchronousTestCase):
    def test_none(self) -> None:
        self.assertEqual(turnOptions({"type": "text", "text": "hi"}), {})

    def test_options(self) -> None:
        self.assertEqual(
            turnOptions(
                {
                    "type": "text",
                    "text": "hi",
                    "options": {"output": {"language": "de"}, "player": {"displayName": "Kai"}},
                }
            ),
            {"language": "de", "player": {"displayName": "Kai"}},
        )

    def test_silenceBehaviorBesideAction(self) -> None:
        """
        voice-capture start takes silenceBehavior beside action (and in
        options); beside action wins.
        """
        message = {
            "type": "voice-capture",
            "action": "start",
            "silenceBehavior": "restart",
            "options": {"silenceBehavior": "error"},
        }
        self.assertEqual(turnOptions(message), {"silenceBehavior": "restart"})
        with self.assertRaises(InvalidMessage) as caught:
            turnOptions({"type": "voice-capture", "action": "start", "silenceBehavior": "again"})
        self.assertIn("voice-capture.silenceBehavior 'again'", str(caught.exception))

    def test_refused(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"type": "text", "options": "fast"}, "text.options must be an object, got a string"),
            ({"type": "audio", "options": {"bargeIn": False}}, "audio.options has unknown field"),
            ({"type": "text", "options": {"output": {"voice": "X"}}}, "text.options.output.voice"),
        ]
        for message, words in cases:
            with self.assertRaises(InvalidMessage) as caught:
                turnOptions(message)
            self.assertIn(words, str(caught.exception), message)


class ErrorMappingTests(SynchronousTestCase):
    def test_everyEngineCodeIsMapped(self) -> None:
        """
        Every code RPEngine documents and every code the middleware adds has
        an explicit row, and every row names a seed code.
        """
        self.assertEqual(set(ENGINE_TO_CLIENT), set(ERROR_CODES))
        self.assertLessEqual(set(ENGINE_TO_CLIENT.values()), CLIENT_CODES)

    def test_table(self) -> None:
        expected = {
            "invalid_payload": "INVALID_MESSAGE",
            "invalid_request": "INVALID_MESSAGE",
            "prompt_too_large": "INVALID_MESSAGE",
            "voice_capture_active": "VAD_ERROR",
            "stt_model_not_installed": "STT_ERROR",
            "empty_speech": "STT_ERROR",
            "unsupported_sample_rate": "TTS_ERROR",
            "audio_transport_failed": "TTS_ERROR",
            "card_resync_required": "INTERNAL_ERROR",
            "invalid_character_card": "INVALID_MESSAGE",
            "service_not_started": "LLM_ERROR",
            "capacity_exceeded": "RATE_LIMITED",
            "duplicate_request": "INTERNAL_ERROR",
            "microphone_not_enabled": "VAD_ERROR",
            "unsupported_language": "INVALID_MESSAGE",
            "unsupported_voice": "INVALID_MESSAGE",
            "request_failed": "LLM_ERROR",
            "engine_disconnected": "LLM_ERROR",
            "engine_unavailable": "RATE_LIMITED",
            "invalid_audio": "INVALID_AUDIO_FORMAT",
            "content_blocked": "LLM_ERROR",
            "something_new": "INTERNAL_ERROR",
        }
        for engineCode, clientCode in expected.items():
            for retryable in (True, False):
                message = engineErrorMessage(
                    {"code": engineCode, "message": "why", "retryable": retryable}, "t1"
                )
                self.assertEqual(
                    message,
                    {
                        "type": "error",
                        "code": clientCode,
                        "message": "why",
                        "retryable": retryable,
                        "engineCode": engineCode,
                        "turnId": "t1",
                    },
                )

    def test_missingFields(self) -> None:
        message = engineErrorMessage({})
        self.assertEqual(message["code"], "LLM_ERROR")
        self.assertEqual(message["engineCode"], "request_failed")
        self.assertFalse(message["retryable"])
        self.assertIn("request_failed", message["message"])

    def test_onlySeedCodes(self) -> None:
        with self.assertRaises(AssertionError):
            errors.errorMessage("NOT_A_CODE", "x")


class BuilderTests(SynchronousTestCase):
    def test_ready(self) -> None:
        servers = [{"urls": "stun:stun.example:3478"}]
        self.assertEqual(
            messages.ready("abc", servers),
            {"type": "ready", "id": "abc", "protocolVersion": 1, "iceServers": servers},
        )

    def test_turnMessage(self) -> None:
        self.assertEqual(
            messages.turnMessage("llm", "t", text="x"), {"type": "llm", "text": "x", "turnId": "t"}
        )
        self.assertEqual(messages.turnMessage("tts-cancelled", None), {"type": "tts-cancelled"})

    def test_encode(self) -> None:
        self.assertEqual(
            messages.encode({"type": "llm", "text": "é"}), '{"type":"llm","text":"é"}'.encode()
        )


class AttachmentHelperTests(SynchronousTestCase):
    def test_keepPendingDropsOldest(self) -> None:
        from rpmiddleware.client.attachments import acknowledgement, keepPending

        old = [messages.Attachment("o1", alt="old one"), messages.Attachment("o2")]
        new = [messages.Attachment(f"n{i}", alt=f"new {i}") for i in range(3)]
        kept, dropped = keepPending(old, new, 4)
        self.assertEqual([a.data for a in kept], ["o2", "n0", "n1", "n2"])
        self.assertEqual(dropped, 1)
        ack = acknowledgement(new, dropped, 4, "your next turn")
        self.assertEqual(
            {k: ack[k] for k in ("received", "altTextKept", "imagesDropped", "olderDropped")},
            {"received": 3, "altTextKept": 3, "imagesDropped": 3, "olderDropped": 1},
        )
        self.assertIn("1 older attachment(s) beyond 4 were dropped", ack["message"])

    def test_contextText(self) -> None:
        from rpmiddleware.client.attachments import contextText

        self.assertIsNone(contextText([messages.Attachment("x")]))
        self.assertEqual(
            contextText(
                [messages.Attachment("x", alt="a cat"), messages.Attachment("y", alt="a hat")]
            ),
            "[The player shows an image: a cat]\n[The player shows an image: a hat]",
        )
