"""
Tests for the logging plugin (plugins/envelope_log.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any, cast

from twisted.logger import ILogObserver, Logger, LogLevel, eventAsJSON, formatEvent
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from rpmiddleware.builtin.envelope_log import (
    ENVELOPE_FORMAT,
    SUMMARY_FORMAT,
    EnvelopeLog,
    LogSettings,
    digest,
    envelopeLog,
    isSecretName,
)
from rpmiddleware.plugin.base import ChainPlugin
from rpmiddleware.plugin.interfaces import IChainObserver, IEnvelopePlugin
from rpmiddleware.protocol.envelope import Direction, Envelope
from rpmiddleware.protocol.messages import MESSAGES
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.testing.kit import PluginHarness, exampleCard

FIELDS = (
    "direction",
    "type",
    "messageId",
    "sessionId",
    "requestId",
    "size",
    "chainMs",
    "decisions",
    "outcome",
)
SAMPLE = {str: "x", int: 0, float: 0.5, bool: True, dict: {}, list: []}


@implementer(IEnvelopePlugin)
class Dropper(ChainPlugin):
    """
    Drops acks on their way to RPEngine and replaces capacity updates.
    """

    name = "dropper"

    def envelopeToEngine(self, envelope: Envelope, context: Any) -> Any:
        return None if envelope.type == "ack" else envelope

    def envelopeToGame(self, envelope: Envelope, context: Any) -> Any:
        if envelope.type == "capacity.update":
            return envelope.replace(queueDepth=99)
        return envelope


class Recorder:
    def __init__(self, **config: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.now = 100.0
        self.timeline = Timeline(now=lambda: self.now)
        self.plugin = EnvelopeLog(
            LogSettings.fromMapping(config),
            self.timeline,
            Logger(observer=cast(ILogObserver, self.events.append)),
        )
        # The traffic logged here is made to leak, not to be sent.
        self.harness = PluginHarness([self.plugin, Dropper()], engineRules=False)
        self.harness.startSession("s1")

    def envelopeEvents(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["log_format"] == ENVELOPE_FORMAT]

    def summaries(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["log_format"] == SUMMARY_FORMAT]


def sampleFields(type: str) -> dict[str, Any]:
    spec = MESSAGES[type]
    fields = {
        name: SAMPLE[types[0]] for name, types in spec.required.items() if name != "sessionId"
    }
    if "requestId" in fields or "requestId" in spec.optional:
        fields["requestId"] = f"req-{type}"
    if type == "ack":
        fields["sourceMessageId"] = "m0"
    return fields


class SettingsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        self.assertEqual(LogSettings.fromMapping({}), LogSettings("", True, 256, "info"))

    def test_rejected(self) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"path": "x"}, "path"),
            ({"jsonl_path": 3}, "jsonl_path"),
            ({"redact": "yes"}, "redact"),
            ({"max_field_chars": 0}, "max_field_chars"),
            ({"max_field_chars": "10"}, "max_field_chars"),
            ({"level": "warn"}, "level"),
        ]
        for bad, key in cases:
            with self.assertRaises(ValueError) as caught:
                LogSettings.fromMapping(bad)
            self.assertIn(key, str(caught.exception))

    def test_unopenable_file(self) -> None:
        path = os.path.join(self.mktemp(), "missing-folder", "log.jsonl")
        with self.assertRaises(ValueError) as caught:
            EnvelopeLog(LogSettings(jsonl_path=path))
        self.assertIn("jsonl_path", str(caught.exception))

    def test_factory(self) -> None:
        class Services:
            timeline = Timeline()

        plugin = envelopeLog.buildPlugin({"level": "debug"}, Services())  # type: ignore[arg-type]
        self.assertEqual((envelopeLog.name, plugin.name), ("logging", "logging"))
        self.assertTrue(IEnvelopePlugin.providedBy(plugin))
        self.assertTrue(IChainObserver.providedBy(plugin))
        self.assertIs(plugin.timeline, Services.timeline)  # type: ignore[attr-defined]


class EventTests(SynchronousTestCase):
    def test_every_type_logged_once(self) -> None:
        recorder = Recorder()
        sent: list[tuple[Envelope, Direction]] = []
        for type, spec in MESSAGES.items():
            for direction in spec.directions:
                envelope = recorder.harness.envelope(type, **sampleFields(type))
                if direction is Direction.TO_ENGINE:
                    recorder.harness.toEngine(envelope)
                else:
                    recorder.harness.toGame(envelope)
                sent.append((envelope, direction))
        events = recorder.envelopeEvents()
        self.assertEqual(len(events), len(sent))
        for (envelope, direction), event in zip(sent, events, strict=True):
            self.assertEqual(
                {k: event[k] for k in FIELDS if k not in ("size", "chainMs", "decisions")},
                {
                    "direction": direction.value,
                    "type": envelope.type,
                    "messageId": envelope.messageId,
                    "sessionId": "s1",
                    "requestId": envelope.requestId,
                    "outcome": "dropped"
                    if envelope.type == "ack" and direction is Direction.TO_ENGINE
                    else "delivered",
                },
            )
            if envelope.type == "capacity.update":
                envelope = envelope.replace(queueDepth=99)
            self.assertEqual(event["size"], len(envelope.toBytes()))
            self.assertIsInstance(event["chainMs"], float)
            self.assertGreaterEqual(event["chainMs"], 0.0)
            self.assertEqual(event["log_level"], LogLevel.info)
            self.assertIn(envelope.type, formatEvent(event))

    def test_decisions(self) -> None:
        recorder = Recorder()
        recorder.harness.toEngine("ack", sourceMessageId="m1")
        recorder.harness.toGame(
            "capacity.update", acceptingRequests=True, queueDepth=0, queueLimit=4
        )
        dropped, replaced = recorder.envelopeEvents()
        self.assertEqual(
            (dropped["outcome"], dropped["decisions"]), ("dropped", [["dropper", "dropped"]])
        )
        self.assertEqual(replaced["decisions"], [["dropper", "replaced"]])
        self.assertEqual(replaced["envelope"]["queueDepth"], 99)

    def test_debug_level(self) -> None:
        recorder = Recorder(level="debug")
        recorder.harness.toGame("reply.accepted", requestId="r")
        self.assertEqual(recorder.envelopeEvents()[0]["log_level"], LogLevel.debug)

    def test_summary_per_finished_request(self) -> None:
        recorder = Recorder()
        recorder.timeline.submitted("r1", characterId="c1")
        recorder.now = 100.25
        recorder.harness.toGame("reply.accepted", requestId="r1")
        recorder.timeline.saw("r1", "reply.accepted")
        recorder.now = 101.0
        recorder.harness.toGame("reply.completed", requestId="r1")
        [summary] = recorder.summaries()
        self.assertEqual(summary["requestId"], "r1")
        self.assertEqual(summary["outcome"], "reply.completed")
        self.assertEqual(summary["marks"], {"accepted": 250.0, "completed": 1000.0})
        self.assertEqual(
            recorder.plugin.timelines(),
            [
                {
                    "requestId": "r1",
                    "marks": {"accepted": 250.0, "completed": 1000.0},
                    "characterId": "c1",
                }
            ],
        )
        self.assertIn("1000.0", formatEvent(summary))


AUDIO = base64.b64encode(bytes(range(256)) * 12).decode("ascii")
CARD_SECRET = "A tavern keeper whose secret recipe is cinnamon-7731"


class RedactionTests(SynchronousTestCase):
    def leakyTraffic(self, recorder: Recorder) -> None:
        harness = recorder.harness
        harness.toEngine(
            "reply.request",
            requestId="r1",
            integrationId="game",
            characterId="c1",
            event={"text": "hello", "audio": {"format": "pcm_s16le", "data": AUDIO}},
            card={
                "format": "chara_card_v2",
                "mode": "snapshot",
                "targetHash": "abc",
                "card": exampleCard(description=CARD_SECRET),
            },
            player={"displayName": "P", "apiKey": "sk-live-4242", "authToken": "tok-9999"},
            authorization="Bearer hunter2",
        )
        harness.toEngine(
            "character.sync",
            integrationId="game",
            characterId="c1",
            card={
                "format": "chara_card_v2",
                "mode": "patch",
                "patch": [{"op": "replace", "value": CARD_SECRET}],
            },
        )
        harness.toGame(
            "reply.audio.chunk", requestId="r1", sequence=0, segmentSequence=0, data=AUDIO
        )
        harness.toGame("reply.text.completed", requestId="r1", text="hi", stats={"tokens": 12})

    def serialized(self, recorder: Recorder) -> str:
        return "\n".join(formatEvent(e) + eventAsJSON(e) for e in recorder.events)

    def test_payloads_never_logged(self) -> None:
        path = self.mktemp()
        recorder = Recorder(jsonl_path=path)
        self.leakyTraffic(recorder)
        recorder.plugin.close()
        with open(path, encoding="utf-8") as f:
            written = f.read()
        for output in (self.serialized(recorder), written):
            for leaked in (
                AUDIO[:40],
                AUDIO[-40:],
                "cinnamon-7731",
                "sk-live-4242",
                "tok-9999",
                "hunter2",
            ):
                self.assertNotIn(leaked, output)
            self.assertIn(digest(AUDIO)["sha256"], output)
        events = recorder.envelopeEvents()
        audio = events[0]["envelope"]["event"]["audio"]["data"]
        self.assertEqual(
            audio, {"bytes": 3072, "sha256": hashlib.sha256(AUDIO.encode()).hexdigest()[:16]}
        )
        self.assertEqual(events[0]["envelope"]["card"]["card"]["bytes"] > 100, True)
        self.assertEqual(events[0]["envelope"]["player"]["apiKey"], "[redacted]")
        self.assertEqual(events[0]["envelope"]["event"]["text"], "hello")
        self.assertEqual(events[2]["envelope"]["data"], digest(AUDIO))
        # Token counts are statistics, not secrets.
        self.assertEqual(events[3]["envelope"]["stats"], {"tokens": 12})

    def test_without_redaction(self) -> None:
        path = self.mktemp()
        recorder = Recorder(jsonl_path=path, redact=False, max_field_chars=20)
        self.leakyTraffic(recorder)
        long = "words " * 100
        recorder.harness.toGame("reply.text.completed", requestId="r1", text=long)
        output = self.serialized(recorder)
        self.assertIn("sk-live-4242", output)
        self.assertNotIn(long[:21], output)
        self.assertIn(long[:20] + "...(+580 chars)", output)
        for leaked in (AUDIO[:40], "cinnamon-7731"):
            self.assertNotIn(leaked, output)

    def test_secret_names(self) -> None:
        for name in (
            "token",
            "accessToken",
            "api_key",
            "apiKey",
            "APIKEY",
            "clientSecret",
            "password",
            "Authorization",
            "credentials",
            "x-api-key",
        ):
            self.assertTrue(isSecretName(name), name)
        for name in ("tokens", "maxTokens", "keyframe", "requestId", "capital"):
            self.assertFalse(isSecretName(name), name)


class FileTests(SynchronousTestCase):
    def test_lines_parse(self) -> None:
        path = self.mktemp()
        recorder = Recorder(jsonl_path=path)
        recorder.harness.toGame("reply.accepted", requestId="r1")
        recorder.harness.toGame("reply.text.delta", requestId="r1", sequence=0, delta="Hi")
        # Flushed per line: readable before close.
        with open(path, encoding="utf-8") as f:
            self.assertEqual(len(f.readlines()), 2)
        recorder.harness.toGame("reply.completed", requestId="r1")
        recorder.plugin.close()
        recorder.harness.toGame("reply.accepted", requestId="r2")
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual(
            [(line["event"], line.get("type")) for line in lines],
            [
                ("envelope", "reply.accepted"),
                ("envelope", "reply.text.delta"),
                ("envelope", "reply.completed"),
                ("request.finished", None),
            ],
        )
        for line in lines[:3]:
            self.assertEqual(set(FIELDS) - set(line), set())
            self.assertEqual(line["envelope"]["requestId"], "r1")
        self.assertEqual(lines[3]["requestId"], "r1")
        self.assertEqual(len(recorder.envelopeEvents()), 4)

    def test_appends(self) -> None:
        path = self.mktemp()
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"earlier": true}\n')
        recorder = Recorder(jsonl_path=path)
        recorder.harness.toGame("reply.accepted", requestId="r1")
        recorder.plugin.close()
        with open(path, encoding="utf-8") as f:
            self.assertEqual([json.loads(line).get("type") for line in f], [None, "reply.accepted"])
