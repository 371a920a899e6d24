"""
A fuzzer for the engine endpoint: random and mutated frames over a real
loopback WebSocket, with an account of what each one must have caused.

L{FrameFactory} makes frames: valid RPEngine envelopes of every type that
may travel to the game, replays of them, and mutations (fields dropped or
given the wrong JSON type, foreign sessions and versions, unknown and
wrong-direction types, huge strings, deep nesting, numbers JSON cannot hold,
lone surrogates, truncated JSON, garbage, binary frames with invalid UTF-8).
Every frame stays valid UTF-8 when sent as text, because RFC 6455 makes the
peer close the connection (1007) otherwise: that answer is tested on its
own, in tests/test_reliability_hostile.py.

L{fuzzEngine} sends them to a live middleware in batches and checks the
books: every frame the protocol refuses was logged and dropped (counted by
the session and by log events), every replay was dropped as a duplicate,
everything else reached the game end, no plugin raised, the connection
stayed up, and memory did not grow with the number of frames.

The trial suite runs about 2000 frames (tests/test_reliability_fuzz.py);
C{python -m bench stress} runs tens of thousands.
"""

from __future__ import annotations

import base64
import gc
import json
import random
import string
import time
import tracemalloc
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import ILogObserver, globalLogPublisher
from zope.interface import implementer

from rpmiddleware.engine.session import (
    MALFORMED_WINDOW,
    EngineSession,
    copyKey,
    malformedEnding,
)
from rpmiddleware.protocol.envelope import PROTOCOL, Direction, Envelope, loadJson
from rpmiddleware.protocol.messages import MESSAGES, ProtocolViolation, validate
from rpmiddleware.testing.live import LiveMiddleware, TestClient, connectClient

ORIGIN = "https://rpengine.gemtavern.com"

#: Types RPEngine may send us over the WebSocket (the file mailbox's own
#: types are refused there), and ones it may not.
TO_GAME_TYPES = sorted(
    t for t, s in MESSAGES.items() if Direction.TO_GAME in s.directions and not s.fileModeOnly
)
TO_ENGINE_TYPES = sorted(t for t, s in MESSAGES.items() if Direction.TO_GAME not in s.directions)


@dataclass
class Frame:
    payload: bytes
    binary: bool
    #: What made it, for the report.
    kind: str
    #: "invalid" when the protocol must refuse it whatever else is true;
    #: None when only the oracle (decode, validate, dedup) can tell.
    expect: str | None = None


def randomText(rng: random.Random, size: int) -> str:
    alphabet = string.ascii_letters + string.digits + " .,!?'\"\\/{}[]:\u00e9\u4e2d\U0001f600\n\t"
    return "".join(rng.choice(alphabet) for _ in range(size))


class FrameFactory:
    """
    Frames for one engine session; deterministic for a given seed.

    @param maxString: the largest huge string a mutation inserts, in characters.
    """

    def __init__(self, rng: random.Random, sessionId: str, maxString: int = 256 * 1024) -> None:
        self.rng = rng
        self.sessionId = sessionId
        self.maxString = maxString
        self.valid: list[bytes] = []
        self._requests = [f"fuzz-{i}" for i in range(24)]

    # Valid envelopes

    def requestId(self) -> str:
        rng = self.rng
        if rng.random() < 0.7:
            return rng.choice(self._requests)
        return f"fresh-{rng.getrandbits(48):x}"

    def envelope(self, kind: str | None = None) -> dict[str, Any]:
        """
        A valid envelope of C{kind} (a random engine-to-game type if None).
        """
        rng = self.rng
        kind = kind or rng.choice([t for t in TO_GAME_TYPES if t != "hello"])
        fields: dict[str, Any] = Envelope.build(kind, self.sessionId).fields
        fields["messageId"] = f"{rng.getrandbits(64):016x}"
        requestId = self.requestId()
        if kind == "ack":
            fields["acknowledgedMessageId"] = f"{rng.getrandbits(64):x}"
        elif kind == "character.synced":
            fields.update(
                integrationId="game", characterId="mira", targetHash=f"{rng.getrandbits(256):064x}"
            )
        elif kind == "reply.text.delta":
            fields.update(requestId=requestId, sequence=rng.randrange(50), delta=randomText(rng, 8))
        elif kind == "reply.text.completed":
            fields.update(
                requestId=requestId, text=randomText(rng, 40), tokenCount=9, elapsedMs=12.5
            )
        elif kind == "reply.audio.start":
            fields.update(
                requestId=requestId,
                format="pcm_s16le",
                sampleRate=rng.choice([44100, 24000, 0, -1, 10**9]),
                channels=1,
            )
        elif kind == "reply.audio.chunk":
            pcm = rng.randbytes(rng.choice([0, 1, 2, 441, 8820]))
            data = base64.b64encode(pcm).decode("ascii")
            if rng.random() < 0.1:
                data = data[:-1] + "*"  # not base64
            fields.update(
                requestId=requestId,
                sequence=rng.randrange(50),
                segmentSequence=rng.randrange(3),
                segmentChunkSequence=rng.randrange(20),
                segmentChunkCount=rng.randrange(1, 20),
                data=data,
            )
        elif kind == "reply.audio.completed":
            fields.update(
                requestId=requestId, chunkCount=rng.randrange(9), totalBytes=rng.randrange(9999)
            )
        elif kind == "capacity.update":
            fields.update(
                acceptingRequests=rng.random() < 0.7,
                queueDepth=rng.choice([0, 1, 3, -5, 2**40]),
                queueLimit=rng.choice([0, 1, 4, -1, 2**40]),
            )
        elif kind == "request.error":
            fields.update(
                requestId=requestId,
                code=rng.choice(["request_failed", "card_resync_required", "capacity_exceeded"]),
                message=randomText(rng, 20),
                retryable=rng.random() < 0.5,
            )
        elif kind == "voice.capture.level":
            fields.update(requestId=requestId, seconds=1.5, peak=rng.random(), rms=rng.random())
        elif kind == "voice.capture.state":
            fields.update(
                requestId=requestId,
                state=rng.choice(["listening", "speech_started", "speech_ended", "odd"]),
                seconds=0.5,
                autoEndEnabled=True,
                message=None,
            )
        elif kind == "voice.capture.transcript":
            fields.update(requestId=requestId, text=randomText(rng, 20), language="en")
        else:
            fields["requestId"] = requestId
        return fields

    # Frames

    def frame(self) -> Frame:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:
            fields = self.envelope()
            payload = dumps(fields)
            self.valid.append(payload)
            if len(self.valid) > 512:
                del self.valid[: len(self.valid) - 512]
            return Frame(payload, False, "valid")
        if roll < 0.32 and self.valid:
            return Frame(rng.choice(self.valid), False, "replay")
        if roll < 0.85:
            return self.mutated()
        return self.garbage()

    def mutated(self) -> Frame:
        rng = self.rng
        fields = self.envelope()
        spec = MESSAGES[fields["type"]]
        head = ["protocol", "protocolVersion", "type", "messageId", "timestamp"]
        # An ack may come without a session: RPEngine acks welcome before it
        # adopts it (app.rs transport_message).
        if fields["type"] != "ack":
            head.append("sessionId")
        required = head + list(spec.required)
        choice = rng.randrange(16)
        if choice == 0:
            name = rng.choice(required)
            del fields[name]
            return Frame(dumps(fields), False, "drop-required", "invalid")
        if choice == 1:
            name = rng.choice(list(fields))
            del fields[name]
            return Frame(dumps(fields), False, "drop-any")
        if choice == 2:
            name = rng.choice(required)
            fields[name] = _wrongType(rng, name, spec.required.get(name))
            return Frame(dumps(fields), False, "wrong-type", "invalid")
        if choice == 3:
            # An ack may come without a session: RPEngine acks welcome
            # before adopting it (app.rs transport_message).
            foreign: list[Any] = ["", "other", 7, "x" * 300]
            fields["sessionId"] = rng.choice(
                foreign if fields["type"] == "ack" else [*foreign, None]
            )
            return Frame(dumps(fields), False, "foreign-session", "invalid")
        if choice == 4:
            fields["protocolVersion"] = rng.choice([2, 4, 3.0, True, "3.0", None, [3]])
            return Frame(dumps(fields), False, "wrong-version", "invalid")
        if choice == 5:
            fields["protocol"] = rng.choice(["gemtavern.rp", "", None, PROTOCOL.upper()])
            return Frame(dumps(fields), False, "wrong-protocol", "invalid")
        if choice == 6:
            fields["type"] = rng.choice([*TO_ENGINE_TYPES, "reply.unknown", "", "HELLO", "hello "])
            return Frame(dumps(fields), False, "wrong-type-name", "invalid")
        if choice == 7:
            size = rng.choice([1024, 65536, rng.randrange(1, self.maxString + 1)])
            name = rng.choice([*list(fields), "x-huge"])
            fields[name] = "h" * size
            return Frame(dumps(fields), False, "huge-string")
        if choice == 8:
            depth = rng.choice([50, 400, 200_000])
            fields["x-deep"] = "PLACEHOLDER"
            text = dumps(fields).decode("utf-8")
            text = text.replace('"PLACEHOLDER"', "[" * depth + "]" * depth)
            kind = "deep-nesting-huge" if depth > 10_000 else "deep-nesting"
            return Frame(text.encode("utf-8"), False, kind, "invalid" if depth > 10_000 else None)
        if choice == 9:
            number = rng.choice(["1e400", "-1e400", "9" * 5000, "NaN", "-Infinity", "1.5e-400"])
            name = rng.choice(["sequence", "queueDepth", "level", "x-number"])
            fields[name] = "PLACEHOLDER"
            text = dumps(fields).decode("utf-8").replace('"PLACEHOLDER"', number)
            return Frame(text.encode("utf-8"), False, "odd-number")
        if choice == 10:
            name = rng.choice(["text", "message", "state", "x-surrogate", "requestId"])
            fields[name] = "PLACEHOLDER"
            lone = rng.choice(["\\ud800", "\\udfff", "a\\ud83d", "\\u0000"])
            text = dumps(fields).decode("utf-8").replace("PLACEHOLDER", lone)
            return Frame(text.encode("utf-8"), False, "escaped-surrogate")
        if choice == 11:
            text = dumps(fields).decode("utf-8")
            cut = rng.randrange(0, len(text))
            return Frame(text[:cut].encode("utf-8"), False, "truncated", "invalid")
        if choice == 12:
            fields["messageId"] = rng.choice(["", "m" * 257, 5, None])
            return Frame(dumps(fields), False, "bad-message-id", "invalid")
        if choice == 13:
            fields["timestamp"] = rng.choice(["yesterday", "", 1752624000, "2026-13-45T99:00Z"])
            return Frame(dumps(fields), False, "bad-timestamp", "invalid")
        if choice == 14:
            text = "  \n" + dumps(fields).decode("utf-8") + "\t "
            self.valid.append(text.encode("utf-8"))
            return Frame(text.encode("utf-8"), False, "whitespace-padded")
        extra = {f"x-{i}": randomText(rng, 3) for i in range(rng.randrange(1, 40))}
        fields.update(extra)
        return Frame(dumps(fields), False, "unknown-fields")

    def garbage(self) -> Frame:
        rng = self.rng
        choice = rng.randrange(7)
        if choice == 0:
            return Frame(rng.randbytes(rng.randrange(0, 512)), True, "binary-random", "invalid")
        if choice == 1:
            bad = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b'{"a":"\x80"}'])
            return Frame(bad, True, "binary-invalid-utf8", "invalid")
        if choice == 2:
            value = rng.choice([[], [1, 2], "text", 3, None, True, 1.5, [{"type": "hello"}]])
            return Frame(json.dumps(value).encode(), False, "not-an-object", "invalid")
        if choice == 3:
            text = randomText(rng, rng.randrange(0, 200))
            return Frame(text.encode("utf-8"), False, "garbage-text")
        if choice == 4:
            return Frame(b"", False, "empty", "invalid")
        if choice == 5:
            hello = Envelope.build("hello").fields
            return Frame(dumps(hello), False, "repeated-hello", "invalid")
        # An envelope whose JSON text repeats a key: the last one counts.
        fields = self.envelope("reply.completed")
        text = dumps(fields).decode("utf-8")
        text = text[:-1] + ',"type":"reply.completed","type":"no.such.type"}'
        return Frame(text.encode("utf-8"), False, "duplicate-key", "invalid")


def dumps(fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _wrongType(rng: random.Random, name: str, allowed: tuple[type, ...] | None) -> Any:
    candidates: list[Any] = ["text", 7, True, None, {"a": 1}, [1], 1.5]
    if name in ("messageId", "timestamp", "protocol", "sessionId", "type", "requestId"):
        candidates = [7, True, None, {"a": 1}, [1], 1.5, ""]
    if name == "protocolVersion":
        candidates = ["three", None, 3.5, True, [3]]
    if allowed is not None:
        candidates = [
            c for c in candidates if c is None or isinstance(c, bool) or not isinstance(c, allowed)
        ]
        if bool in allowed:
            candidates = [c for c in candidates if not isinstance(c, bool)]
    return rng.choice(candidates)


class Oracle:
    """
    What the engine endpoint must do with each frame: refuse it (logged and
    dropped), drop it as a duplicate, match it as an ack, or deliver it.
    It keeps its own window of seen messageIds, as RPEngine's peer must.
    """

    def __init__(self, sessionId: str, dedupWindow: int) -> None:
        self.sessionId = sessionId
        self.window = dedupWindow
        self.seen: OrderedDict[str, None] = OrderedDict()
        #: messageIds of invalid frames that end a request (terminal by
        #: type, naming a requestId, in this session): a copy of one is a
        #: duplicate, dropped unlogged (EngineSession._violation).
        self.malformedSeen: OrderedDict[str, None] = OrderedDict()
        self.outcomes: Counter[str] = Counter()

    def judge(self, frame: Frame) -> str:
        outcome = self._judge(frame)
        self.outcomes[outcome] += 1
        return outcome

    def _invalid(self, fields: Any, violation: ProtocolViolation) -> str:
        if (
            not isinstance(fields, dict)
            or fields.get("sessionId") != self.sessionId
            or copyKey(violation.messageId) is None
            or malformedEnding(fields, violation.reason) is None
        ):
            return "invalid"
        messageId = str(violation.messageId)
        if messageId in self.malformedSeen:
            return "duplicate"
        self.malformedSeen[messageId] = None
        while len(self.malformedSeen) > MALFORMED_WINDOW:
            self.malformedSeen.popitem(last=False)
        return "invalid"

    def _judge(self, frame: Frame) -> str:
        if frame.binary:
            return "invalid"
        try:
            # Strict JSON, as the endpoint reads it (as does validate below).
            fields = loadJson(frame.payload.decode("utf-8"))
        except (ValueError, RecursionError):
            return "invalid"
        try:
            spec = validate(fields, Direction.TO_GAME, self.sessionId)
        except ProtocolViolation as e:
            return self._invalid(fields, e)
        if spec.type == "hello":
            return "invalid"
        if spec.type == "ack":
            return "ack"
        messageId = fields["messageId"]
        if messageId in self.seen:
            self.seen.move_to_end(messageId)
            return "duplicate"
        self.seen[messageId] = None
        while len(self.seen) > self.window:
            self.seen.popitem(last=False)
        return "delivered"


@implementer(ILogObserver)
class LogCounter:
    """
    Counts log events by format, and keeps the first few failures.
    """

    def __init__(self) -> None:
        self.formats: Counter[str] = Counter()
        self.failures: list[str] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.formats[str(event.get("log_format"))] += 1
        failure = event.get("log_failure")
        if failure is not None and len(self.failures) < 5:
            self.failures.append(f"{event.get('log_format')}: {failure.getTraceback()}")

    def count(self, fragment: str) -> int:
        return sum(n for f, n in self.formats.items() if fragment in f)


@dataclass
class FuzzReport:
    frames: int = 0
    bytes: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    expected: Counter[str] = field(default_factory=Counter)
    #: Frames a mutation marked must-refuse but the oracle accepted.
    oracleMisses: list[str] = field(default_factory=list)
    invalidDropped: int = 0
    invalidLogged: int = 0
    duplicatesDropped: int = 0
    delivered: int = 0
    pluginFailures: int = 0
    failures: list[str] = field(default_factory=list)
    connectionsClosed: int = 0
    sessions: int = 0
    seenWindow: int = 0
    unacked: int = 0
    #: tracemalloc bytes after the first half and the whole run.
    memoryHalf: int = 0
    memoryEnd: int = 0
    memoryPeak: int = 0
    seconds: float = 0.0

    @property
    def memoryGrowth(self) -> int:
        return self.memoryEnd - self.memoryHalf

    def problems(self) -> list[str]:
        """
        Every way the books do not balance; empty when all is well.
        """
        found = []
        if self.oracleMisses:
            found.append(f"must-refuse frames accepted: {self.oracleMisses[:5]}")
        for name, actual in (
            ("invalid", self.invalidDropped),
            ("duplicate", self.duplicatesDropped),
            ("delivered", self.delivered),
        ):
            if self.expected[name] != actual:
                found.append(f"{name}: expected {self.expected[name]}, got {actual}")
        if self.invalidLogged != self.invalidDropped:
            found.append(f"{self.invalidDropped} invalid dropped but {self.invalidLogged} logged")
        if self.pluginFailures or self.failures:
            found.append(f"{self.pluginFailures} plugin failures; {self.failures[:2]}")
        if self.connectionsClosed:
            found.append(f"{self.connectionsClosed} connections closed by the server")
        return found

    def summary(self) -> str:
        return (
            f"{self.frames} frames ({self.bytes / 1e6:.1f} MB) in {self.seconds:.1f} s over "
            f"{self.sessions} sessions: {self.invalidDropped} refused and logged, "
            f"{self.duplicatesDropped} duplicates dropped, {self.delivered} delivered, "
            f"{self.expected['ack']} acks; memory growth over the second half "
            f"{self.memoryGrowth / 1024:.0f} KiB (peak {self.memoryPeak / 1e6:.1f} MB)"
        )


def _tick(reactor: Any) -> Deferred[None]:
    return deferLater(reactor, 0, lambda: None)


async def _until(reactor: Any, predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await deferLater(reactor, 0.002, lambda: None)


async def _session(reactor: Any, live: LiveMiddleware) -> tuple[TestClient, EngineSession]:
    client = connectClient(reactor, live.url("/rp-engine/socket"), origin=ORIGIN)
    await client.opened
    client.send(Envelope.build("hello").fields)
    welcome = await client.next()
    session = live.middleware.link.session
    assert session is not None and session.sessionId == welcome["sessionId"], welcome
    return client, session


async def fuzzEngine(
    reactor: Any,
    live: LiveMiddleware,
    frames: int,
    seed: int = 1,
    sessions: int = 1,
    batch: int = 250,
    maxString: int = 256 * 1024,
    trackMemory: bool = True,
) -> FuzzReport:
    """
    Send C{frames} fuzz frames to C{live}'s engine endpoint over C{sessions}
    successive connections (each ends with a frame over the size limit,
    which must close it with 1009), and account for every frame.
    """
    report = FuzzReport()
    rng = random.Random(seed)
    middleware = live.middleware
    delivered: list[int] = [0]
    marks: set[str] = set()

    def observe(envelope: Envelope) -> None:
        delivered[0] += 1
        if str(envelope.messageId).startswith("mark-"):
            marks.add(str(envelope.messageId))

    stop = middleware.router.observe(observe)
    logs = LogCounter()
    globalLogPublisher.addObserver(logs)
    window = middleware.settings.engine.dedup_window
    started = time.perf_counter()
    if trackMemory:
        tracemalloc.start()
    try:
        perSession = max(1, frames // sessions)
        half = frames // 2
        for number in range(sessions):
            client, session = await _session(reactor, live)
            report.sessions += 1
            assert session.sessionId is not None
            factory = FrameFactory(rng, session.sessionId, maxString)
            oracle = Oracle(session.sessionId, window)
            count = perSession if number < sessions - 1 else frames - perSession * number
            sent = 0
            while sent < count:
                for _ in range(min(batch, count - sent)):
                    frame = factory.frame()
                    outcome = oracle.judge(frame)
                    if frame.expect == "invalid" and outcome != "invalid":
                        report.oracleMisses.append(frame.kind)
                    report.kinds[frame.kind] += 1
                    report.bytes += len(frame.payload)
                    assert client.factory.peer is not None
                    client.factory.peer.sendMessage(frame.payload, isBinary=frame.binary)
                    sent += 1
                # A marker proves the batch was read; it is one delivery more.
                mark = factory.envelope("capacity.update")
                mark["messageId"] = f"mark-{number}-{sent}"
                oracle.judge(Frame(dumps(mark), False, "mark"))
                client.send(mark)
                await _until(
                    reactor,
                    lambda m=mark["messageId"], c=client: m in marks or c.closed.called,
                    60,
                    "a batch",
                )
                if client.closed.called:
                    report.connectionsClosed += 1
                    break
                if trackMemory and not report.memoryHalf and sum(report.kinds.values()) >= half:
                    gc.collect()
                    report.memoryHalf = tracemalloc.get_traced_memory()[0]
            report.seenWindow = max(report.seenWindow, len(session._seen))
            report.unacked = max(report.unacked, len(session._unacked))
            report.expected.update(oracle.outcomes)
            report.invalidDropped += session.invalidDropped
            report.duplicatesDropped += session.duplicatesDropped
            # Over the limit by one byte: the defined answer is a 1009 close.
            limit = middleware.settings.server.max_message_bytes
            client.send(b'"' + b"x" * (limit - 1) + b'"')
            code, _ = await client.closed
            if code != 1009:
                report.failures.append(f"oversized frame closed with {code}, not 1009")
            await _until(reactor, lambda s=session: s.closed, 10, "the session to end")
        report.frames = sum(report.kinds.values())
        report.delivered = delivered[0]
        gc.collect()
        if trackMemory:
            report.memoryEnd, report.memoryPeak = tracemalloc.get_traced_memory()
    finally:
        if trackMemory:
            tracemalloc.stop()
        stop()
        globalLogPublisher.removeObserver(logs)
    report.seconds = time.perf_counter() - started
    report.invalidLogged = logs.count("dropped invalid envelope from RPEngine")
    report.pluginFailures = logs.count("plugin {plugin} failed") + logs.count("failed on {type}")
    report.failures += logs.failures
    return report
