"""
The RPEngine v3 envelope: one JSON object per WebSocket message.

An L{Envelope} keeps every field it was given, known or not, because RPEngine
promises to preserve unknown fields and so must we: a newer RPEngine may add
fields that a plugin further down the chain understands.  Middleware-only
annotations (which client asked, what the chain decided) live in C{meta} and
never reach the wire.
"""

from __future__ import annotations

import enum
import json
import math
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson

PROTOCOL = "gemtavern.rp_engine"
PROTOCOL_VERSION = 3

#: Fields every envelope carries, in the order the seed lists them.
ENVELOPE_FIELDS = ("protocol", "protocolVersion", "type", "messageId", "sessionId", "timestamp")


class Direction(enum.Enum):
    """
    Which way an envelope travels through the chain.
    """

    TO_ENGINE = "to_engine"
    TO_GAME = "to_game"

    # Members are singletons compared by identity, so identity's hash is
    # theirs; Enum's own hashes the name in Python, and every envelope looks
    # its direction up in a dict or two.
    __hash__ = object.__hash__

    @property
    def opposite(self) -> Direction:
        return Direction.TO_GAME if self is Direction.TO_ENGINE else Direction.TO_ENGINE


def newMessageId() -> str:
    return uuid.uuid4().hex


def isoTimestamp(when: datetime | None = None) -> str:
    """
    An ISO 8601 UTC timestamp with milliseconds and a C{Z}, as in the seed's
    examples (C{2026-07-16T00:00:00.000Z}).
    """
    when = when or datetime.now(UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


class Envelope:
    """
    A protocol message that remembers every field it carries.

    Plugins may read and change C{fields} in place or build a new envelope
    with L{replace}; C{meta} is for annotations that stay inside the
    middleware.
    """

    __slots__ = ("fields", "meta")

    def __init__(self, fields: dict[str, Any], meta: dict[str, Any] | None = None) -> None:
        self.fields = fields
        self.meta: dict[str, Any] = meta if meta is not None else {}

    @classmethod
    def build(cls, type: str, sessionId: str | None = None, **fields: Any) -> Envelope:
        """
        A new envelope with the seed's common fields filled in.
        """
        head: dict[str, Any] = {
            "protocol": PROTOCOL,
            "protocolVersion": PROTOCOL_VERSION,
            "type": type,
            "messageId": newMessageId(),
        }
        if sessionId is not None:
            head["sessionId"] = sessionId
        head["timestamp"] = isoTimestamp()
        head.update(fields)
        return cls(head)

    @property
    def type(self) -> str:
        kind = self.fields.get("type", "")
        return kind if kind.__class__ is str else str(kind)

    @property
    def messageId(self) -> str | None:
        return self.fields.get("messageId")

    @property
    def sessionId(self) -> str | None:
        return self.fields.get("sessionId")

    @property
    def requestId(self) -> str | None:
        value = self.fields.get("requestId")
        return value if isinstance(value, str) else None

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.fields[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.fields

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def replace(self, **changes: Any) -> Envelope:
        """
        A shallow copy with some fields changed; C{meta} is copied too.
        """
        fields = dict(self.fields)
        fields.update(changes)
        return Envelope(fields, dict(self.meta))

    def copy(self) -> Envelope:
        return self.replace()

    def toBytes(self) -> bytes:
        return jsonBytes(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Envelope) and other.fields == self.fields

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Envelope {self.type} {self.messageId} request={self.requestId}>"


def _refuseConstant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finiteFloat(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"the number {text[:32]} is too large to pass on")
    return value


def loadJson(payload: bytes | str) -> Any:
    """
    Strict JSON from a peer: Python's reader also takes C{NaN}, C{Infinity}
    and C{-Infinity}, which no JSON reader of a browser or game takes, so a
    message holding one would be passed on to peers that cannot read it; a
    number too large for a double (C{1e400}) would be written on as
    C{Infinity}, so it is refused too.

    Read by msgspec first (a text delta frame in 0.55 us where json's reader
    took 3.9 us, a 32 KiB audio chunk in 19 us where it took 43 us:
    bench/jsonread.py), which reads what json reads to the same values: integers
    of any size (up to Python's 4300 digits), correctly rounded floats, the
    last of duplicate keys in the first one's place.  Anything it refuses
    (constants, a float that overflows, an escaped lone surrogate, a byte
    order mark, text that is not UTF-8 or not JSON, deep nesting) is read
    again by json's reader, so what it takes and every error are as before;
    tests/test_jsonread.py checks the two agree.

    @raise ValueError: (C{json.JSONDecodeError} among them) for anything that
        is not JSON; C{UnicodeDecodeError} for bytes that are not UTF-8;
        C{RecursionError} for nesting past the interpreter's limit.
    """
    try:
        return _FAST_READER.decode(payload)
    except (ValueError, RecursionError):
        # msgspec.DecodeError and the UnicodeEncodeError of a str holding a
        # lone surrogate are ValueErrors.
        pass
    return loadJsonStdlib(payload)


def loadJsonUtf8(payload: bytes) -> Any:
    """
    L{loadJson} of C{payload.decode("utf-8")}, without decoding it first
    when it is JSON msgspec reads (which refuses bytes that are not strict
    UTF-8, and a byte order mark).

    @raise ValueError: as L{loadJson}; C{UnicodeDecodeError} for bytes that
        are not UTF-8.
    """
    try:
        return _FAST_READER.decode(payload)
    except (ValueError, RecursionError):
        pass
    return loadJsonStdlib(payload.decode("utf-8"))


def loadJsonStdlib(payload: bytes | str) -> Any:
    """
    json's reader with our hooks: what L{loadJson} was before msgspec, its
    fallback, and the reference its tests and benchmark compare it with.
    """
    if isinstance(payload, str) and not payload.startswith("\ufeff"):
        # One reader for every message: json.loads with these hooks builds a
        # new JSONDecoder per call (1.7 us of a 4.0 us text delta).
        return _READER.decode(payload)
    return json.loads(payload, parse_constant=_refuseConstant, parse_float=_finiteFloat)


_READER = json.JSONDecoder(parse_constant=_refuseConstant, parse_float=_finiteFloat)
_FAST_READER: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def jsonBytes(value: Any) -> bytes:
    """
    Compact UTF-8 JSON, written by orjson: 4.8 us for a 100 ms speech chunk
    at 44.1 kHz (12 KB) where C{json.dumps(..., ensure_ascii=False)} and the
    UTF-8 encoding took 31.6 us, 0.36 us for a text delta where they took
    4.4 us.  The text is what json writes but for floats' exponents
    (C{1e16}, not C{1e+16}: the same number) and non-finite floats, which
    it writes as C{null} (json wrote C{NaN}, which no peer reads).  What
    orjson refuses (integers past 64 bits, keys that are not strings, a
    lone surrogate, other types) is written by json as before; a lone
    surrogate (legal in JSON text as an escape, not encodable as UTF-8)
    falls back to ASCII escapes rather than losing the message.
    """
    try:
        return orjson.dumps(value)
    except TypeError:
        pass
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode("ascii")


def summarize(fields: Mapping[str, Any]) -> dict[str, Any]:
    """
    The identifying fields of an envelope, for log events: never payloads.
    """
    return {k: fields[k] for k in ("type", "messageId", "sessionId", "requestId") if k in fields}
