"""
Run in a child process by tests/test_startup_imports.py (C{python -m
tests.idle_daemon}): start the daemon as C{twistd rpmiddleware --port 0}
does, say which of the libraries an idle daemon should not load are loaded,
then play one spoken turn through it (a client's 48 kHz stereo WAV in, the
reply's speech out at the client's 24 kHz) with a simulated RPEngine, and
say what the audio became.

Each report is a line of JSON on stdout.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from array import array
from collections import defaultdict
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from rpmiddleware.tap import Options, makeService

#: What the idle daemon does without: loaded by the first audio conversion
#: (numpy, soxr and the module that uses them), the first WebRTC offer
#: (aiortc), the first action declared (jsonschema) and a remote moderation
#: service (treq).
LAZY = ("numpy", "soxr", "rpmiddleware.audio.pcm", "aiortc", "jsonschema", "treq")


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def loaded() -> list[str]:
    return [name for name in LAZY if name in sys.modules]


def stereoWav(rate: int, seconds: float) -> str:
    """
    A 440 Hz tone as a base64 PCM16 stereo WAV, made without numpy.
    """
    from rpmiddleware.audio.format import encodeBase64, pcm16Wav

    samples = array("h")
    for n in range(int(rate * seconds)):
        value = int(16000 * math.sin(2 * math.pi * 440 * n / rate))
        samples.extend((value, value))
    return encodeBase64(pcm16Wav(samples.tobytes(), rate, channels=2))


async def idleThenSpokenTurn(reactor: Any, port: int) -> None:
    # Once the reactor runs (start-up's own calls made), before anything of
    # the test is imported: the simulated RPEngine's modules use numpy.
    report(atStart=loaded())
    from rpmiddleware.audio.format import exactLength
    from rpmiddleware.testing.kit import exampleCard
    from rpmiddleware.testing.live import connectClient
    from rpmiddleware.testing.simmailbox import spokenChunks
    from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator

    client = connectClient(reactor, f"ws://127.0.0.1:{port}/client/socket")
    await client.opened
    report(beforeEngine=loaded())
    engine = await connectSimulator(
        reactor,
        port,
        SimulatorOptions(tokensPerSecond=None, audioRealtime=False, captureSpeechSeconds=0.0),
    )
    # The session's start imports the audio libraries a reactor turn later.
    await deferLater(reactor, 0.05, lambda: None)
    report(afterEngine=loaded())
    client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
    client.send({"type": "audio", "data": stereoWav(48000, 1.0)})
    messages: list[dict[str, Any]] = []
    while not messages or messages[-1]["type"] not in ("reply-complete", "error"):
        messages.append(await client.next())
    [request] = [m for m in engine.receivedMessages if m.get("type") == "reply.request"]
    audio = request["event"]["audio"]
    segments: dict[int, int] = defaultdict(int)
    for chunk in spokenChunks(engine, requestId=request["requestId"]):
        segments[chunk["segmentSequence"]] += len(base64.b64decode(chunk["data"])) // 2
    speech = [m for m in messages if m["type"] == "tts-chunk"]
    report(
        ended=messages[-1]["type"],
        toEngine=[audio["format"], audio["sampleRate"], audio["channels"]],
        rates=sorted({m["sampleRate"] for m in speech}),
        samples=sum(len(base64.b64decode(m["data"])) // 2 for m in speech),
        expected=sum(exactLength(n, 44100, 24000) for n in segments.values()),
        afterTurn=loaded(),
    )
    client.drop()
    engine.disconnect()


def main() -> None:
    options = Options()
    options.parseOptions(["--port", "0"])
    # What twistd does with the options: the reactor is chosen, the chain
    # built, the listener started.
    top = makeService(options)
    top.privilegedStartService()
    top.startService()
    from twisted.internet import reactor

    port = top.getServiceNamed("listener").port.getHost().port  # type: ignore[attr-defined]

    def run() -> None:
        turn = Deferred.fromCoroutine(idleThenSpokenTurn(reactor, port))
        turn.addErrback(lambda failure: report(failed=failure.getTraceback()))
        turn.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(run)
    reactor.run()


if __name__ == "__main__":
    main()
