"""
A fuzzer for the client endpoint: random and malformed voice-client messages
over a real loopback WebSocket, each with the answer the protocol defines.

L{ClientFrameFactory} makes frames (every client message type, well formed
and not, oversized, binary, not JSON); L{fuzzClient} sends them on one
connection in batches, a C{ping} marking the end of each, and compares every
answer with the defined one: nothing malformed gets anything but its defined
error, and the session lives.  The engine endpoint's fuzzer, and the frame
helpers both use, are in L{bench.fuzzing}.

The trial suite runs about 2000 frames (tests/test_reliability_client.py);
C{python -m bench stress} runs more.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from twisted.logger import globalLogPublisher

from bench.fuzzing import LogCounter, dumps, randomText
from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import LiveMiddleware, connectClient

#: Frame kinds the fuzzer found answered INTERNAL_ERROR where the protocol
#: says INVALID_MESSAGE (reported to the client endpoint's owner, not yet
#: fixed): JSON nested past the recursion limit, and a list or object given
#: as a voice or language in configure (unhashable in a frozenset lookup).
#: Skipped by the fuzz runs until fixed; tests hold them as expected failures.
KNOWN_CLIENT_FAULTS: frozenset[str] = frozenset()

#: What the client endpoint must answer: a list of (type, code) pairs, code
#: None for messages that are not errors.
Answer = list[tuple[str, str | None]]
INVALID: Answer = [("error", "INVALID_MESSAGE")]


@dataclass
class ClientFrame:
    payload: bytes
    binary: bool
    kind: str
    answer: Answer


class ClientFrameFactory:
    """
    Frames for the client endpoint, each with the answer the voice-client
    protocol defines for it.  No frame starts a turn (no RPEngine is needed):
    the point is that nothing malformed gets anything but its defined error,
    and the session lives.
    """

    def __init__(self, rng: random.Random, maxString: int = 64 * 1024) -> None:
        self.rng = rng
        self.maxString = maxString
        self.pings = 0

    def ping(self, **extra: Any) -> ClientFrame:
        self.pings += 1
        message: dict[str, Any] = {"type": "ping", "timestamp": self.pings + self.rng.random()}
        message.update(extra)
        return ClientFrame(dumps(message), False, "ping", [("pong", None)])

    def frame(self) -> ClientFrame:
        rng = self.rng

        def pick(options: list[Any]) -> Any:
            return rng.choice(options)

        message: dict[str, Any]
        answer: Answer
        choice = rng.randrange(24)
        text = randomText(rng, rng.randrange(1, 30))
        if choice == 0:
            return ClientFrame(rng.randbytes(rng.randrange(0, 300)), True, "binary", INVALID)
        if choice == 1:
            cut = dumps({"type": "ping", "timestamp": 1.5, "x": text}).decode("utf-8")
            cut = cut[: rng.randrange(0, len(cut))]
            return ClientFrame(cut.encode("utf-8"), False, "truncated", INVALID)
        if choice == 2:
            value = pick([[], "ping", 7, None, True, [{"type": "ping"}]])
            return ClientFrame(json.dumps(value).encode(), False, "not-an-object", INVALID)
        if choice == 3:
            kind = pick([None, 7, "", [], {"a": 1}, "PING", "tts-chunk", "hello", "status "])
            message = {"type": kind, "timestamp": 1} if kind is not None else {"timestamp": 1}
            return ClientFrame(dumps(message), False, "bad-type", INVALID)
        if choice == 4:
            stamp = pick([None, "1", True, [], {"t": 1}])
            message = {"type": "ping"}
            if stamp is not None or rng.random() < 0.5:
                message["timestamp"] = stamp
            return ClientFrame(dumps(message), False, "ping-bad-timestamp", INVALID)
        if choice == 5:
            size = pick([100, 4096, rng.randrange(1, self.maxString + 1)])
            frame = self.ping(padding="p" * size)
            frame.kind = "ping-huge-field"
            return frame
        if choice == 6:
            value = pick([None, 7, "   ", "", [], {"t": "x"}])
            message = {"type": "text"} if value is None else {"type": "text", "text": value}
            return ClientFrame(dumps(message), False, "text-bad", INVALID)
        if choice == 7:
            card = pick([None, "card", [], {}, {"spec": "chara_card_v2"}, {"data": {}}])
            message = {"type": "character", "characterId": "mira", "card": card}
            if rng.random() < 0.3:
                message = {"type": "character", "characterId": pick([None, 5, "", "x" * 300])}
            return ClientFrame(dumps(message), False, "character-bad", INVALID)
        if choice == 8:
            bad = pick(
                [
                    {"output": {"voice": "Z9"}},
                    {"output": {"voice": []}},
                    {"output": {"voice": {"a": 1}}},
                    {"output": {"language": ["en"]}},
                    {"output": {"language": "xx"}},
                    {"output": {"sampleRate": 7999}},
                    {"output": {"sampleRate": 44100.0}},
                    {"output": {"sampleRate": True}},
                    {"output": {"modalities": ["audio"]}},
                    {"output": {"modalities": {"a": 1}}},
                    {"output": {"streaming": "yes"}},
                    {"output": {"colour": "red"}},
                    {"output": []},
                    {"inputLanguage": ["en"]},
                    {"inputLanguage": {"en": 1}},
                    {"inputLanguage": "fr"},
                    {"bargeIn": "no"},
                    {"player": "Ada"},
                    {"interactionMode": ""},
                    {"volume": 11},
                ]
            )
            return ClientFrame(dumps({"type": "configure", **bad}), False, "configure-bad", INVALID)
        if choice == 9:
            good = pick(
                [
                    {"output": {"voice": "F3", "sampleRate": 16000}},
                    {"player": {"displayName": text}},
                    {"bargeIn": None},
                    {},
                ]
            )
            return ClientFrame(dumps({"type": "configure", **good}), False, "configure-ok", [])
        if choice == 10:
            action = pick([None, 3, "", "begin", "START", "stop", "cancel"])
            message = {"type": "voice-capture"}
            if action is not None:
                message["action"] = action
            return ClientFrame(dumps(message), False, "voice-capture-bad", INVALID)
        if choice == 11:
            attached = pick([None, "img", [1], [{"data": ""}], [{"data": "x", "alt": 5}]])
            message = {"type": "attachments"}
            if attached is not None:
                message["attachments"] = attached
            return ClientFrame(dumps(message), False, "attachments-bad", INVALID)
        if choice == 12:
            attached = [{"data": "data:image/png;base64,AAAA", "alt": text}]
            message = {"type": "attachments", "attachments": attached}
            return ClientFrame(dumps(message), False, "attachments-ok", [("attachments-ack", None)])
        if choice == 13:
            data = pick([None, 5, [], {"a": 1}, ""])
            message = {"type": "audio"} if data is None else {"type": "audio", "data": data}
            return ClientFrame(dumps(message), False, "audio-bad-field", INVALID)
        if choice == 14:
            data = pick(["not base64!", "%%%%", "AAA", "data:audio/wav;base64,*"])
            message = {"type": "audio", "data": data}
            answer = [("error", "INVALID_AUDIO_FORMAT")]
            return ClientFrame(dumps(message), False, "audio-not-base64", answer)
        if choice == 15:
            junk = base64.b64encode(b"JUNK" + rng.randbytes(rng.randrange(0, 200))).decode()
            message = {"type": "audio", "data": junk}
            answer = [("error", "INVALID_AUDIO_FORMAT")]
            return ClientFrame(dumps(message), False, "audio-not-a-container", answer)
        if choice == 16:
            sessionId = pick([None, 5, "", "s" * 300])
            message = {"type": "reconnect"}
            if sessionId is not None:
                message["sessionId"] = sessionId
            return ClientFrame(dumps(message), False, "reconnect-bad", INVALID)
        if choice == 17:
            message = {"type": "reconnect", "sessionId": f"nobody-{rng.getrandbits(40):x}"}
            answer = [("error", "SESSION_NOT_FOUND"), ("reconnect-ack", None)]
            return ClientFrame(dumps(message), False, "reconnect-unknown", answer)
        if choice == 18:
            return ClientFrame(dumps({"type": "cancel"}), False, "cancel-idle", [])
        if choice == 19:
            depth = pick([50, 200_000])
            text_ = '{"type":"ping","timestamp":2,"deep":' + "[" * depth + "]" * depth + "}"
            answer = [("pong", None)] if depth < 10_000 else INVALID
            kind = "deep-nesting" if depth < 10_000 else "deep-nesting-huge"
            return ClientFrame(text_.encode(), False, kind, answer)
        if choice == 20:
            lone = pick(["\\ud800", "\\udfff", "a\\ud83d"])
            payload = ('{"type":"ping","timestamp":3,"x":"' + lone + '"}').encode()
            # Not valid Unicode: refused where it enters, naming the field (issue 32).
            return ClientFrame(payload, False, "escaped-surrogate", INVALID)
        if choice == 21:
            number = pick(["1e400", "NaN", "-Infinity", "9" * 5000, "1.5e-400"])
            payload = ('{"type":"ping","timestamp":' + number + "}").encode()
            # Only what the client's own JSON reader could read back is echoed.
            answer = [("pong", None)] if number == "1.5e-400" else INVALID
            return ClientFrame(payload, False, "odd-number", answer)
        if choice == 22:
            return ClientFrame(randomText(rng, 40).encode("utf-8"), False, "garbage", INVALID)
        return self.ping(**{f"x-{i}": text for i in range(rng.randrange(0, 10))})


@dataclass
class ClientFuzzReport:
    frames: int = 0
    bytes: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    answered: Counter[str] = field(default_factory=Counter)
    #: (kind, expected, got) for every frame answered otherwise than defined.
    wrong: list[tuple[str, Answer, Answer]] = field(default_factory=list)
    closed: bool = False
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = []
        if self.wrong:
            found.append(f"{len(self.wrong)} frames answered wrongly, e.g. {self.wrong[:3]}")
        if self.closed:
            found.append("the server closed the client's connection")
        if self.failures:
            found.append(f"{len(self.failures)} logged failures: {self.failures[:1]}")
        return found

    def summary(self) -> str:
        return (
            f"{self.frames} frames ({self.bytes / 1e6:.1f} MB) in {self.seconds:.1f} s: "
            f"{self.answered['error']} errors, {self.answered['pong']} pongs, "
            f"{len(self.wrong)} wrong answers"
        )


async def fuzzClient(
    reactor: Any,
    live: LiveMiddleware,
    frames: int,
    seed: int = 1,
    batch: int = 100,
    maxString: int = 64 * 1024,
    skip: frozenset[str] | set[str] = frozenset(),
) -> ClientFuzzReport:
    """
    Send C{frames} fuzz frames to C{live}'s client endpoint on one
    connection, reading the answers after each batch, and compare every
    answer with the one the protocol defines.  Frames of a kind in C{skip}
    are not sent (known, reported faults a test must not trip over).
    """
    report = ClientFuzzReport()
    rng = random.Random(seed)
    factory = ClientFrameFactory(rng, maxString)
    logs = LogCounter()
    globalLogPublisher.addObserver(logs)
    started = time.perf_counter()
    client = connectClient(reactor, live.url("/client/socket"))
    try:
        await client.opened
        ready = await client.next()
        assert ready["type"] == "ready", ready
        # A character, so that audio reaches the decoder.
        client.send({"type": "character", "characterId": "fuzz", "card": exampleCard()})
        sent = 0
        while sent < frames and not client.closed.called:
            expected: list[tuple[ClientFrame, Answer]] = []
            for _ in range(min(batch, frames - sent)):
                frame = factory.frame()
                while frame.kind in skip:
                    frame = factory.frame()
                report.kinds[frame.kind] += 1
                report.bytes += len(frame.payload)
                assert client.factory.peer is not None
                client.factory.peer.sendMessage(frame.payload, isBinary=frame.binary)
                expected.append((frame, frame.answer))
                sent += 1
            marker = factory.ping(marker=True)
            client.send(json.loads(marker.payload))
            got: Answer = []
            while True:
                message = await client.next()
                if message.get("type") in ("capacity", "ready"):
                    continue
                if (
                    message.get("type") == "pong"
                    and message.get("timestamp") == json.loads(marker.payload)["timestamp"]
                ):
                    break
                got.append((message["type"], message.get("code")))
                report.answered[message["type"]] += 1
            cursor = 0
            for frame, answer in expected:
                mine = got[cursor : cursor + len(answer)]
                if mine != answer:
                    report.wrong.append((frame.kind, answer, mine))
                    # Resynchronise on the next answer that fits, if any.
                    cursor += max(1, len(mine))
                else:
                    cursor += len(answer)
            if cursor < len(got):
                report.wrong.append(("(surplus)", [], got[cursor:]))
        report.closed = client.closed.called
        report.frames = sent
    finally:
        globalLogPublisher.removeObserver(logs)
        client.drop()
    report.seconds = time.perf_counter() - started
    report.failures = logs.failures
    return report
