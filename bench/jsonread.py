"""
Per-frame JSON reading: L{rpmiddleware.protocol.envelope.loadJson} (msgspec first,
json's reader for what msgspec refuses) against json's reader alone (what
loadJson was before), on the frames the hot path reads most: RPEngine's
C{reply.text.delta}, a C{reply.audio.chunk} carrying 32 KiB of PCM16 in
base64, and a C{reply.text.completed}, as the bytes of a WebSocket text
frame.  Both readers are timed alternately, best of several rounds.

Run: C{python -m bench.jsonread [rounds]}.
"""

from __future__ import annotations

import base64
import functools
import sys
import timeit
from collections.abc import Callable
from typing import Any

from rpmiddleware.protocol.envelope import Envelope, loadJson, loadJsonStdlib


def frames() -> dict[str, bytes]:
    """
    The frames, as RPEngine sends them.
    """
    common = {"sessionId": "s" * 32, "requestId": "r" * 32}
    pcm = bytes(range(256)) * 128  # 32 KiB
    text = "The innkeeper leans over the bar and lowers his voice. " * 12
    return {
        "text delta": Envelope.build(
            "reply.text.delta", sequence=17, delta="innkeeper ", **common
        ).toBytes(),
        "32 KiB audio chunk": Envelope.build(
            "reply.audio.chunk",
            sequence=17,
            segmentSequence=0,
            segmentChunkSequence=17,
            segmentChunkCount=2**31 - 1,
            data=base64.b64encode(pcm).decode("ascii"),
            **common,
        ).toBytes(),
        "completed text": Envelope.build(
            "reply.text.completed", text=text, tokenCount=160, elapsedMs=2345.6, **common
        ).toBytes(),
    }


def best(function: Callable[[], Any], rounds: int) -> float:
    timer = timeit.Timer(function)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=1, number=number)[0] / number for _ in range(rounds))


def measure(rounds: int) -> list[tuple[str, float, float]]:
    """
    Per frame: microseconds with json's reader, with loadJson.
    """
    rows = []
    for name, payload in frames().items():
        assert loadJson(payload) == loadJsonStdlib(payload)
        old: list[float] = []
        new: list[float] = []
        for _ in range(rounds):
            old.append(best(functools.partial(loadJsonStdlib, payload), 1))
            new.append(best(functools.partial(loadJson, payload), 1))
        rows.append((name, min(old) * 1e6, min(new) * 1e6))
    return rows


def main(argv: list[str]) -> None:
    rounds = int(argv[0]) if argv else 7
    print("| frame | bytes | json reader (us) | loadJson (us) | speed-up |")
    print("|---|---|---|---|---|")
    sizes = {name: len(payload) for name, payload in frames().items()}
    for name, old, new in measure(rounds):
        print(f"| {name} | {sizes[name]} | {old:.2f} | {new:.2f} | {old / new:.1f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
