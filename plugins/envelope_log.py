"""
The logging plugin: one structured log event per envelope that leaves the
chain, and optionally a JSON-lines file of them.

It watches rather than acts (L{IChainObserver}), so it sees each envelope
once, as it finally left, with what every plugin decided and how long the
chain took.  The module is not called C{logging.py} so that it cannot shadow
the standard library's C{logging} for anyone importing from this folder.

What is logged is a redacted copy: audio and card bodies are replaced by
their size and a short hash (enough to tell two payloads apart, never enough
to replay a player's voice or leak a character), secrets by a marker, and
long strings are cut.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import IO, Annotated, Any, Literal

import msgspec
from twisted.logger import Logger, LogLevel
from zope.interface import implementer

from rpmiddleware.plugin import (
    TERMINAL,
    ChainPlugin,
    Direction,
    Envelope,
    IChainObserver,
    IEnvelopePlugin,
    IPluginServices,
    PluginFactory,
    PluginSettings,
    Timeline,
    isoTimestamp,
)

NAME = "logging"
LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info}
REDACTED = "[redacted]"
#: Keys of a card transfer that hold (part of) the card document.
CARD_BODY_KEYS = ("card", "document", "snapshot", "patch")
#: Words that make a field name secret ("accessToken", "api_key", ...).
#: "tokens" is absent on purpose: it counts tokens in reply statistics.
SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "authorization", "credential", "credentials"}
)
_NAME_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")

ENVELOPE_FORMAT = (
    "{direction} {type} {messageId} request={requestId} {size} B in chain {chainMs} ms: "
    "{outcome} {decisions}"
)
SUMMARY_FORMAT = "request {requestId} finished with {outcome}: {marks}"


class LogSettings(PluginSettings):
    """
    The plugin's TOML table, checked.
    """

    #: Append one JSON object per line to this file; "" writes none.
    jsonl_path: str = ""
    #: Replace the values of secret-looking fields.
    redact: bool = True
    #: Longer strings are cut to this many characters.
    max_field_chars: Annotated[int, msgspec.Meta(ge=1)] = 256
    #: "debug" or "info", for every event this plugin logs.
    level: Literal["debug", "info"] = "info"

    @classmethod
    def fromMapping(cls, settings: Mapping[str, Any]) -> LogSettings:
        """
        The table read as the factory reads it.

        @raise ValueError: naming C{plugins.logging.KEY}.
        """
        return cls.read(settings, NAME)


def isSecretName(name: str) -> bool:
    """
    Whether a field called C{name} probably holds a credential.
    """
    words = [w.lower() for w in _NAME_WORDS.findall(name)]
    if SECRET_WORDS.intersection(words) or "apikey" in words:
        return True
    return any(a == "api" and b == "key" for a, b in zip(words, words[1:], strict=False))


def digest(value: Any) -> dict[str, Any]:
    """
    Size and a 16-hex-digit SHA-256 prefix of a payload: base64 text counts
    the bytes it encodes; anything else its canonical JSON.
    """
    if isinstance(value, str):
        raw = value.encode("utf-8")
        size = len(value) * 3 // 4 - (len(value) - len(value.rstrip("=")))
    else:
        raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
        size = len(raw)
    return {"bytes": size, "sha256": hashlib.sha256(raw).hexdigest()[:16]}


class Redactor:
    """
    Makes the copy of an envelope's fields that may be logged.
    """

    def __init__(self, redact: bool = True, maxChars: int = 256) -> None:
        self.redact = redact
        self.maxChars = maxChars

    def fields(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        clean: dict[str, Any] = {}
        for key, value in fields.items():
            if key == "card" and isinstance(value, dict):
                clean[key] = self._card(value)
            else:
                clean[key] = self._value(key, value)
        return clean

    def _card(self, transfer: dict[str, Any]) -> Any:
        if "spec" in transfer or "data" in transfer:
            # A bare Character Card V2 rather than a transfer around one.
            return digest(transfer)
        return {
            key: digest(value) if key in CARD_BODY_KEYS else self._value(key, value)
            for key, value in transfer.items()
        }

    def _value(self, key: str, value: Any) -> Any:
        if self.redact and isSecretName(key):
            return REDACTED
        if key == "data" and isinstance(value, str):
            # Audio (event.audio.data, reply.audio.chunk data) is never logged.
            return digest(value)
        if isinstance(value, dict):
            return self.fields(value)
        if isinstance(value, list):
            return [self._value(key, item) for item in value]
        if isinstance(value, str) and len(value) > self.maxChars:
            return f"{value[: self.maxChars]}...(+{len(value) - self.maxChars} chars)"
        return value


@implementer(IEnvelopePlugin, IChainObserver)
class EnvelopeLog(ChainPlugin):
    """
    Passes everything and logs every envelope as it leaves the chain.
    """

    name = NAME

    def __init__(
        self,
        settings: LogSettings | None = None,
        timeline: Timeline | None = None,
        logger: Logger | None = None,
    ) -> None:
        self.settings = settings or LogSettings()
        self.timeline = timeline if timeline is not None else Timeline()
        self.log = logger if logger is not None else Logger(namespace="rpmiddleware.envelopes")
        self.level = LEVELS[self.settings.level]
        self.redactor = Redactor(self.settings.redact, self.settings.max_field_chars)
        self._file: IO[str] | None = None
        if self.settings.jsonl_path:
            try:
                self._file = open(self.settings.jsonl_path, "a", encoding="utf-8")
            except OSError as e:
                raise ValueError(f"jsonl_path {self.settings.jsonl_path!r} cannot be opened: {e}")

    def envelopeLeft(self, envelope: Envelope, direction: Direction, outcome: str) -> None:
        enteredAt = envelope.meta.get("enteredAt")
        chainMs = None
        if isinstance(enteredAt, float):
            chainMs = round((self.timeline.now() - enteredAt) * 1000, 3)
        record: dict[str, Any] = {
            "direction": direction.value,
            "type": envelope.type,
            "messageId": envelope.messageId,
            "sessionId": envelope.sessionId,
            "requestId": envelope.requestId,
            "size": len(envelope.toBytes()),
            "chainMs": chainMs,
            "decisions": [list(d) for d in envelope.meta.get("decisions", [])],
            "outcome": outcome,
        }
        redacted = self.redactor.fields(envelope.fields)
        self.log.emit(self.level, ENVELOPE_FORMAT, envelope=redacted, **record)
        self._write({"event": "envelope", **record, "envelope": redacted})
        finished = envelope.type in TERMINAL and outcome == "delivered"
        if finished and direction is Direction.TO_GAME and envelope.requestId:
            self._summarize(envelope.requestId, envelope.type)

    def _summarize(self, requestId: str, outcome: str) -> None:
        # The router marks the terminal on the timeline only after observers
        # ran; marking it here (the first mark wins) lets the summary show it.
        self.timeline.saw(requestId, outcome)
        entry = self.timeline.get(requestId)
        summary = entry.asDict() if entry is not None else {"requestId": requestId, "marks": {}}
        summary = self.redactor.fields(summary)
        self.log.emit(
            self.level,
            SUMMARY_FORMAT,
            requestId=requestId,
            outcome=outcome,
            marks=summary.get("marks", {}),
            timeline=summary,
        )
        self._write({"event": "request.finished", "outcome": outcome, **summary})

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps({"time": isoTimestamp(), **record}, ensure_ascii=False, default=str)
        self._file.write(line + "\n")
        self._file.flush()

    def timelines(self) -> list[dict[str, Any]]:
        """
        The recent requests' timelines as dicts, for the console and benchmarks.
        """
        return [entry.asDict() for entry in self.timeline.recent()]

    def close(self) -> None:
        """
        Close the JSON-lines file; later events are still logged, not written.
        """
        if self._file is not None:
            self._file.close()
            self._file = None


def _build(settings: LogSettings, services: IPluginServices) -> EnvelopeLog:
    return EnvelopeLog(settings, services.timeline)


envelopeLog = PluginFactory(
    NAME,
    "Logs every envelope leaving the chain (redacted), optionally to a JSON-lines file.",
    _build,
    settings=LogSettings,
)
