"""
The console's face in a real browser (issue 35, part 4): checks run in the
console's browser session (C{tests/console_browser.py}, whose daemon runs the
default chain, speech-marks and feelings included); C{python -m
tests.console_browser --screenshots docs} remakes docs/console-face.png.

The checks:

  - C{face in step}: a line whose marks are known (made here) is given to
    the page through its own message path (C{rpConsole.receive}: the
    messages the middleware sends, in its order), its audio plays, and the
    AudioContext is suspended mid-sentence; the page's subtitle, mouth and
    expression are then compared with what the marks say for the moment the
    clock stopped at, computed here from the marks and from the audio
    clock as the probe saw the chunks scheduled, not from the page's own
    bookkeeping.  Whatever moment the clock stops at, the expected state is
    computed for that moment, so no wall-clock luck is involved.
  - C{face by loudness}: a line without viseme marks opens the mouth with
    the voice's loudness (a console on the default chain, where the
    speech-marks plugin is not).
  - C{face turn}: a typed turn through the daemon: the page gets speech
    marks and feelings for the reply from the middleware, before its audio.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from pathlib import Path
from typing import Any

#: Every wait in the page, in milliseconds (as the console's checks).
WAIT_MS = 20_000

#: The daemon's chain: the default one and the speech-marks plugin.
RATE = 24000
#: The lines the checks play: two sentences, two feelings; in the second, a
#: character outside the BMP (so code points and UTF-16 differ) before a
#: word (a plain one for the screenshot: headless Chromium has no emoji font).
PLAIN = ("Ah — I’m so glad you came!", "But the wolves took my sheep last night.")
ASTRAL = ("Ah — I’m so glad you came!", "But 🐺 wolves took my sheep last night.")
#: Each word's sound, and the silence between words (ms).
WORD_MS = 200
GAP_MS = 40
SENTENCE_GAP_MS = 300
#: Visemes cycled through each word (Polly's names) and their jaw openings.
VISEMES = [("p", 0.0), ("a", 1.0), ("i", 0.3), ("u", 0.35), ("O", 0.85), ("s", 0.15)]
FEELINGS = [("joy", 0.8), ("fear", 0.7)]


def wordsOf(text: str) -> list[tuple[str, int, int]]:
    """The words of C{text} with their code-point offsets."""
    return [(m[0], m.start(), m.end()) for m in re.finditer(r"[^\W_]+(?:['’][^\W_]+)*", text)]


def knownLine(sentences: tuple[str, ...]) -> tuple[str, list[dict[str, Any]], int]:
    """
    The line's display text, its marks (as the speech-marks plugin sends
    them: sentence, word and viseme marks, times in ms from the line's
    first sample), and its length in samples.
    """
    text = " ".join(sentences)
    marks: list[dict[str, Any]] = []
    at = 0
    offset = 0
    cycle = 0
    for sentence in sentences:
        start = text.index(sentence, offset)
        end = start + len(sentence)
        offset = end
        sentenceAt = at
        for word, wStart, wEnd in wordsOf(sentence):
            marks.append(
                {
                    "time": at,
                    "type": "word",
                    "start": start + wStart,
                    "end": start + wEnd,
                    "value": word,
                    "duration": WORD_MS,
                }
            )
            step = WORD_MS // 3
            for k in range(3):
                value, mouth = VISEMES[cycle % len(VISEMES)]
                cycle += 1
                marks.append(
                    {
                        "time": at + k * step,
                        "type": "viseme",
                        "start": start + wStart,
                        "end": start + wEnd,
                        "value": value,
                        "duration": step,
                        "mouth": mouth,
                    }
                )
            at += WORD_MS + GAP_MS
        samples = (at - sentenceAt) * RATE // 1000
        marks.append(
            {
                "time": sentenceAt,
                "type": "sentence",
                "start": start,
                "end": end,
                "value": sentence,
                "sample": sentenceAt * RATE // 1000,
                "samples": samples,
                "matched": True,
            }
        )
        at += SENTENCE_GAP_MS
    marks.sort(key=lambda m: (m["time"], m["type"] != "sentence"))
    return text, marks, at * RATE // 1000


def pcmChunks(samples: int, chunk: int = 8192) -> list[str]:
    """A voiced tone of C{samples} samples, as base64 PCM16 tts-chunk data."""
    out = []
    for first in range(0, samples, chunk):
        count = min(chunk, samples - first)
        frames = b"".join(
            struct.pack("<h", int(6000 * math.sin(2 * math.pi * 160 * (first + i) / RATE)))
            for i in range(count)
        )
        out.append(base64.b64encode(frames).decode("ascii"))
    return out


def expectedAt(
    marks: list[dict[str, Any]], ms: float, sentences: tuple[str, ...]
) -> dict[str, Any]:
    """
    What the marks say at C{ms} into the line, by the rules docs/animation.md
    gives a face: the sentence whose time has come; the last word of it
    whose time has come; the viseme whose [time, time + duration) holds the
    moment (else sil); the feeling of the sentence.
    """
    sentence = None
    for mark in marks:
        if mark["type"] == "sentence" and mark["time"] <= ms:
            sentence = mark
    word = None
    viseme = None
    for mark in marks:
        if mark["time"] > ms:
            continue
        if mark["type"] == "word" and sentence is not None and mark["start"] >= sentence["start"]:
            word = mark
        if mark["type"] == "viseme" and ms < mark["time"] + mark["duration"]:
            viseme = mark
    assert sentence is not None
    index = sentences.index(sentence["value"])
    return {
        "sentence": sentence["value"],
        "word": word["value"] if word else None,
        "wordStart": word["start"] if word else None,
        "viseme": viseme["value"] if viseme else "sil",
        "mouth": viseme["mouth"] if viseme else 0.0,
        "feeling": FEELINGS[index][0],
    }


class FaceChecks:
    def __init__(self, page: Any, daemon: Any) -> None:
        self.page = page
        self.daemon = daemon
        assert daemon.port is not None
        self.url = f"http://127.0.0.1:{daemon.port}/"

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(expression, arg)

    def waitFor(self, expression: str, arg: Any = None, timeout: int = WAIT_MS) -> Any:
        return self.page.wait_for_function(expression, arg=arg, timeout=timeout).json_value()

    def open(self) -> None:
        self.page.goto(self.url)
        self.waitFor("() => document.getElementById('engine-state').textContent === 'Connected'")
        self.js("() => window.rpConsole.audioContext.resume()")
        self.waitFor("() => window.rpConsole.audioContext.state === 'running'")

    def inStep(
        self, sentences: tuple[str, ...], target: str, screenshots: Path | None = None
    ) -> dict[str, Any]:
        """
        Play the known line and stop the audio clock in the middle of the
        word C{target} of its second sentence; check what the page shows.
        """
        self.open()
        self.daemon.demoDone.wait(20)
        text, marks, samples = knownLine(sentences)
        turnId = "face-check"
        word = next(m for m in marks if m["type"] == "word" and m["value"] == target)
        feelings = []
        for index, (sentence, (feeling, intensity)) in enumerate(
            zip(sentences, FEELINGS, strict=True)
        ):
            start = text.index(sentence)
            feelings.append(
                {
                    "type": "feeling",
                    "turnId": turnId,
                    "speaker": {"characterId": "mira", "name": "Mira"},
                    "feeling": feeling,
                    "intensity": intensity,
                    "start": start,
                    "end": start + len(sentence),
                    "sentence": index,
                    "source": "text",
                }
            )
        self.js("() => { window.__audioProbe.starts = []; }")
        messages: list[dict[str, Any]] = [
            {"type": "llm", "turnId": turnId, "text": text},
            feelings[0],
            feelings[1],
            {"type": "tts-start", "turnId": turnId},
            {
                "type": "speech-marks",
                "turnId": turnId,
                "speaker": {"characterId": "mira", "name": "Mira"},
                "sampleRate": RATE,
                "marks": marks,
            },
        ]
        messages += [
            {"type": "tts-chunk", "turnId": turnId, "format": "pcm", "sampleRate": RATE, "data": d}
            for d in pcmChunks(samples)
        ]
        # Through the page's own message path, in the middleware's order.
        self.js("(ms) => { for (const m of ms) window.rpConsole.receive(m); }", messages)
        # Wait for the middle of the target word, then stop the clock.
        middle = word["time"] + word["duration"] / 2
        self.waitFor(
            """([turnId, ms]) => {
              const at = window.rpConsole.player.position();
              return at && at.turnId === turnId && at.seconds * 1000 >= ms;
            }""",
            [turnId, middle],
        )
        shown = self.js(
            """async () => {
              const context = window.rpConsole.audioContext;
              await context.suspend();
              // Two frames of the page's own drawing loop at the stopped clock.
              await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
              const spoken = [...document.querySelectorAll('#face .word.spoken')];
              const mouth = document.querySelector('#face .face-mouth');
              return {
                now: context.currentTime,
                starts: window.__audioProbe.starts,
                spoken: spoken.map((s) => ({text: s.textContent, start: +s.dataset.start})),
                subtitle: document.querySelector('#face .face-subtitle').textContent,
                viseme: mouth.dataset.viseme,
                open: Number(mouth.dataset.open),
                d: mouth.getAttribute('d'),
                feeling: document.querySelector('#face .face-svg').dataset.feeling,
              };
            }"""
        )
        # Where the voice is, from the probe: the line's chunks, scheduled
        # back to back from the first one's start (the probe saw each).
        starts = [s for s in shown["starts"] if s["sampleRate"] == RATE]
        assert sum(s["length"] for s in starts) == samples, (len(starts), samples)
        for a, b in zip(starts, starts[1:], strict=False):
            assert abs(b["when"] - (a["when"] + a["duration"])) < 1e-6, "a gap in the line"
        ms = (shown["now"] - starts[0]["when"]) * 1000
        expected = expectedAt(marks, ms, sentences)
        problems = []
        if shown["subtitle"] != expected["sentence"]:
            problems.append(f"subtitle {shown['subtitle']!r} != {expected['sentence']!r}")
        wanted = (
            [{"text": expected["word"], "start": expected["wordStart"]}] if expected["word"] else []
        )
        if shown["spoken"] != wanted:
            problems.append(f"highlighted {shown['spoken']} != {wanted}")
        if shown["viseme"] != expected["viseme"]:
            problems.append(f"viseme {shown['viseme']} != {expected['viseme']}")
        if abs(shown["open"] - expected["mouth"]) > 1e-3:
            problems.append(f"mouth open {shown['open']} != {expected['mouth']}")
        if shown["feeling"] != expected["feeling"]:
            problems.append(f"feeling {shown['feeling']} != {expected['feeling']}")
        assert not problems, (problems, ms, shown)
        if screenshots is not None:
            self.page.locator("#try-card").screenshot(path=str(screenshots / "console-face.png"))
        self.js("() => window.rpConsole.audioContext.resume()")
        return {"ms": round(ms, 1), "expected": expected, "shown": shown["spoken"]}

    def byLoudness(self) -> dict[str, Any]:
        """
        A line with no viseme marks (no speech-marks plugin): its mouth
        opens with the voice's loudness, and shuts in a pause.  The line is
        a second of voice, a second of silence, and a second of voice; the
        clock is stopped in the middle of the voice, then of the silence.
        """
        self.open()
        turnId = "face-loudness"
        second = RATE
        voice = pcmChunks(second)
        silence = base64.b64encode(bytes(2 * second)).decode("ascii")
        chunks = [*voice, silence, *voice]
        messages: list[dict[str, Any]] = [{"type": "tts-start", "turnId": turnId}] + [
            {"type": "tts-chunk", "turnId": turnId, "format": "pcm", "sampleRate": RATE, "data": d}
            for d in chunks
        ]
        self.js("(ms) => { for (const m of ms) window.rpConsole.receive(m); }", messages)
        shown = []
        for at in (0.5, 1.5):
            self.waitFor(
                """([turnId, s]) => {
                  const at = window.rpConsole.player.position();
                  return at && at.turnId === turnId && at.seconds >= s;
                }""",
                [turnId, at],
            )
            shown.append(
                self.js(
                    """async () => {
                      const context = window.rpConsole.audioContext;
                      await context.suspend();
                      const frame = () => new Promise((r) => requestAnimationFrame(r));
                      await frame();
                      await frame();
                      const mouth = document.querySelector('#face .face-mouth');
                      const result = {viseme: mouth.dataset.viseme, open: +mouth.dataset.open,
                                      at: window.rpConsole.player.position().seconds};
                      await context.resume();
                      return result;
                    }"""
                )
            )
        voiced, silent = shown
        assert voiced["viseme"] == "level" and voiced["open"] > 0.3, shown
        assert silent["viseme"] == "level" and silent["open"] < 0.05, shown
        return {"voiced": voiced, "silent": silent}

    def turn(self) -> dict[str, Any]:
        """
        A typed turn: the middleware sends the page speech marks (the
        speech-marks plugin is in the chain) and feelings (the page asks
        for them), each sentence's before its audio.
        """
        self.open()
        self.page.click("#card-example")
        self.waitFor("() => window.rpConsole.card && window.rpConsole.card.name")
        known = list(self.js("() => [...window.rpConsole.replies.keys()]"))
        base = self.js("() => window.rpConsole.messages.length")
        self.page.fill("#say-text", "Hello! Are the wolves still about?")
        self.page.click("#say-send")
        turnId = self.waitFor(
            """(known) => [...window.rpConsole.replies.keys()].find((id) => !known.includes(id))""",
            known,
        )
        self.waitFor("(id) => window.rpConsole.replies.get(id).done", turnId)
        got = self.js(
            """([id, base]) => {
              const lines = window.rpConsole.face.turns.get(id) || [];
              const messages = window.rpConsole.messages;
              return {
                lines: lines.map((l) => ({
                  kinds: [...new Set(l.marks.map((m) => m.type))].sort(),
                  feelings: l.feelings.map((f) => f.feeling),
                })),
                order: messages.slice(base)
                  .filter((t) => ['speech-marks', 'feeling', 'tts-chunk'].includes(t)),
                text: window.rpConsole.replies.get(id).text,
              };
            }""",
            [turnId, base],
        )
        assert got["lines"], got
        line = got["lines"][0]
        assert line["kinds"] == ["sentence", "viseme", "word"], got
        assert line["feelings"], got
        order = got["order"]
        first = order.index("tts-chunk")
        assert "speech-marks" in order[:first] and "feeling" in order[:first], order[:20]
        return {"turnId": turnId, **line, "text": got["text"]}
