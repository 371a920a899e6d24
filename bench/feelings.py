"""
What the feelings' sources cost in time to first audio, and whether each
sentence's feeling reaches the client before its speech, against a running
daemon with an RPEngine connected (RPEngine's real core through its driver,
docs/checking-against-rpengine.md; or the browser app).

    twistd -n rpmiddleware --port 39171 --config marks.toml   # marks.toml: optional,
        # [chain] plugins = { speech-marks = 150 } adds the order check
    rpcore-driver --port 39171 --reply-file reply.txt          # a reply ending in <fear>
    python -m bench.feelings --port 39171 --turns 8

One client plays the example character; the turns alternate the sources
C{off}, C{text} and C{model} (a turn's C{options.feelings}) and time, from
the client's C{text} to its first C{llm-chunk} or C{llm}, its first
C{tts-chunk} and its C{reply-complete}.  With the speech-marks plugin in the
chain it also asks for sentence marks and checks that each sentence's
C{feeling} came before that sentence's C{speech-marks} (which come before its
audio), at the same offset.  Not a section of C{python -m bench}: it needs
an RPEngine from outside the repository.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from twisted.internet import task
from twisted.internet.defer import inlineCallbacks

from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import TestClient, connectClient

SOURCES = ("off", "text", "model")
ENDS = ("reply-complete", "tts-cancelled", "error")


@inlineCallbacks
def turn(reactor: Any, client: TestClient, source: str, text: str):  # type: ignore[no-untyped-def]
    """
    One turn with feelings from C{source}: its times (ms) and whether every
    sentence's feeling came before its speech marks (None without marks).
    """
    started = reactor.seconds()
    client.send({"type": "text", "text": text, "options": {"feelings": source}})
    times: dict[str, float] = {}
    seen: list[tuple[str, Any]] = []
    while True:
        message = yield client.next()
        kind = message.get("type")
        at = (reactor.seconds() - started) * 1000
        name = "text" if kind in ("llm-chunk", "llm") else kind
        if name in ("text", "tts-chunk", "feeling") and name not in times:
            times[name] = at
        if kind == "feeling":
            seen.append(("feeling", message["start"]))
        elif kind == "speech-marks":
            sentence: dict[str, Any] = next(
                (m for m in message["marks"] if m["type"] == "sentence"), {}
            )
            seen.append(("marks", sentence.get("start") if sentence.get("matched") else None))
        if kind in ENDS:
            times["end"] = at
            break
    marks = [i for i, (k, _) in enumerate(seen) if k == "marks"]
    feelings = [i for i, (k, _) in enumerate(seen) if k == "feeling"]
    inOrder = None
    if marks and source != "off":
        inOrder = len(marks) == len(feelings) and all(
            f < m and seen[f][1] == seen[m][1] for f, m in zip(feelings, marks, strict=True)
        )
    return times, inOrder


@inlineCallbacks
def run(reactor: Any, options: argparse.Namespace):  # type: ignore[no-untyped-def]
    client = connectClient(reactor, f"ws://127.0.0.1:{options.port}/client/socket")
    yield client.opened
    client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
    client.send(
        {
            "type": "configure",
            "output": {"modalities": ["text", "audio"], "language": "en", "voice": "F3"},
            "speechMarks": ["sentence"],
        }
    )
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in SOURCES}
    checked = ordered = 0
    for n in range(options.turns):
        order = SOURCES if n % 2 == 0 else tuple(reversed(SOURCES))
        for source in order:
            times, inOrder = yield turn(reactor, client, source, f"Any news from the farm, {n}?")
            rows[source].append(times)
            if inOrder is not None:
                checked += 1
                ordered += inOrder
    yield client.close()
    report: dict[str, Any] = {}
    for source, turns in rows.items():
        audio = [t["tts-chunk"] for t in turns if "tts-chunk" in t]
        report[source] = {
            "turns": len(turns),
            "firstTextP50": round(statistics.median(t["text"] for t in turns if "text" in t)),
            "firstAudioP50": round(statistics.median(audio)) if audio else None,
            "firstAudioRange": [round(min(audio)), round(max(audio))] if audio else None,
            "endP50": round(statistics.median(t["end"] for t in turns)),
        }
    report["feelingBeforeItsMarks"] = f"{ordered}/{checked} turns" if checked else "no marks"
    print(json.dumps(report, indent=2))
    if checked and ordered != checked:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=38471)
    parser.add_argument("--turns", type=int, default=8, help="turns of each source")
    options = parser.parse_args()
    task.react(lambda reactor: run(reactor, options))


if __name__ == "__main__":
    main()
