"""
The console in a real browser: C{twistd rpmiddleware --demo} in a child
process, Debian's headless Chromium driven by Playwright's sync API, and a
page on another loopback port for the origin checks.

Run by C{tests/test_console_browser.py} in a child process of its own (so
that nothing of Playwright or the browser touches trial's reactor), or by
hand to remake the screenshots in docs/:

    python -m tests.console_browser --screenshots docs

It prints one JSON object per check (C{{"check", "ok", "detail"}}) and, last,
C{{"done": true}}.  A check that fails does not stop the others unless they
need what it made.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import wave
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOP = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
]
#: Every wait in the page, in milliseconds.
WAIT_MS = 20_000

#: Records what the page's AudioContext is given (every buffer started and
#: when, every stop) and how the text of each reply grew on screen,
#: independently of the page's own bookkeeping.
PROBES = """
(() => {
  const texts = window.__textProbe = {};
  new MutationObserver((records) => {
    for (const record of records) {
      const node = record.target.nodeType === 3 ? record.target.parentElement : record.target;
      const bubble = node && node.closest ? node.closest(".bubble.character") : null;
      if (bubble && bubble.dataset.turn) {
        const length = bubble.querySelector(".text").textContent.length;
        const seen = texts[bubble.dataset.turn] || (texts[bubble.dataset.turn] = []);
        if (seen[seen.length - 1] !== length) seen.push(length);
      }
    }
  }).observe(document, { subtree: true, childList: true, characterData: true });
  const probe = window.__audioProbe = { starts: [], stops: 0 };
  const start = AudioBufferSourceNode.prototype.start;
  AudioBufferSourceNode.prototype.start = function (when = 0, ...rest) {
    const b = this.buffer;
    probe.starts.push({ when, length: b ? b.length : 0, sampleRate: b ? b.sampleRate : 0,
                        duration: b ? b.duration : 0, at: this.context.currentTime });
    return start.call(this, when, ...rest);
  };
  const stop = AudioScheduledSourceNode.prototype.stop;
  AudioScheduledSourceNode.prototype.stop = function (...args) {
    probe.stops += 1;
    return stop.apply(this, args);
  };
})();
"""

#: A page of another origin that tries both WebSocket endpoints.
PROBE_SCRIPT = """
async (port) => {
  const attempt = (path) => new Promise((resolve) => {
    const result = { path, opened: false, code: null };
    let ws;
    try { ws = new WebSocket(`ws://127.0.0.1:${port}${path}`); }
    catch (e) { resolve({ ...result, thrown: String(e) }); return; }
    const timer = setTimeout(() => resolve({ ...result, timeout: true }), 8000);
    ws.onopen = () => { result.opened = true; ws.close(); };
    ws.onclose = (event) => { clearTimeout(timer); result.code = event.code; resolve(result); };
  });
  return [await attempt("/client/socket"), await attempt("/rp-engine/socket")];
}
"""


#: A game of this page's origin: a scene of two, and one line to the guard.
SCENE_SCRIPT = """
async ({port, cast}) => {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/client/socket`);
  const result = {completed: false, lines: []};
  await new Promise((resolve) => { ws.onopen = resolve; });
  const done = new Promise((resolve) => {
    const timer = setTimeout(resolve, 20000);
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "reply-complete") {
        result.completed = true;
        result.lines = (message.lines || []).map((line) => line.speaker.name);
        clearTimeout(timer);
        resolve();
      }
    };
  });
  ws.send(JSON.stringify({type: "character", characterId: "garrick", card: cast[0].card}));
  ws.send(JSON.stringify({type: "configure", output: {modalities: ["text"]}}));
  ws.send(JSON.stringify({type: "scene", op: "open", sceneId: "north-gate", cast}));
  ws.send(JSON.stringify({type: "text", text: "Garrick, may I pass?"}));
  await done;
  ws.close();
  return result;
}
"""


# Fixtures, made here so no binary files are checked in.


def v2Card(name: str, **data: Any) -> dict[str, Any]:
    card = json.loads((TOP / "rpmiddleware" / "data" / "example_character.json").read_text())
    card["data"]["name"] = name
    card["data"].update(data)
    return card


def pngChunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pngCard(card: dict[str, Any] | None, keyword: bytes = b"chara") -> bytes:
    """
    A 1x1 PNG carrying C{card} as base64 JSON in a tEXt chunk, as
    character-card tools write them (or no card, for C{None}).
    """
    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x1f\x3b\x57\xff")
    chunks = [pngChunk(b"IHDR", header)]
    if card is not None:
        text = base64.b64encode(json.dumps(card).encode("utf-8"))
        chunks.append(pngChunk(b"tEXt", keyword + b"\x00" + text))
    chunks += [pngChunk(b"IDAT", pixels), pngChunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


def speechLikeWav(seconds: float = 3.0, rate: int = 48000) -> bytes:
    """
    A voiced-sounding tone with a syllable rhythm, for the fake microphone.
    """
    frames = bytearray()
    for i in range(int(seconds * rate)):
        t = i / rate
        envelope = 0.5 + 0.5 * math.sin(2 * math.pi * 3.0 * t)
        value = envelope * (
            0.5 * math.sin(2 * math.pi * 180 * t) + 0.2 * math.sin(2 * math.pi * 360 * t)
        )
        frames += struct.pack("<h", int(value * 12000))
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(bytes(frames))
    return out.getvalue()


# The daemon.


class Daemon:
    """
    C{twistd -n rpmiddleware --demo --port 0} in a child process.
    """

    def __init__(self, config: str | None = None) -> None:
        args = [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile=", "--logfile=-", "rpmiddleware", "--demo", "--port", "0",
        ]  # fmt: skip
        # In a folder of its own: the daemon makes its memory store at start-up.
        self.folder = tempfile.TemporaryDirectory(prefix="console-daemon-")
        if config is not None:
            # A configuration (TOML text) for this daemon, in its folder.
            path = Path(self.folder.name) / "rpmiddleware.toml"
            path.write_text(config, encoding="utf-8")
            args += ["--config", str(path)]
        self.process = subprocess.Popen(
            args,
            cwd=self.folder.name,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
        self.output: list[str] = []
        self.port: int | None = None
        self.listening = threading.Event()
        self.demoDone = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace")
            self.output.append(line)
            found = re.search(r"listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found and self.port is None:
                self.port = int(found.group(1))
                self.listening.set()
            if "the turn is complete" in line:
                self.demoDone.set()
        # Ended: nobody waits for what will not come.
        self.listening.set()
        self.demoDone.set()

    def log(self) -> str:
        return "".join(self.output[-80:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._reader.join(5)
        self.folder.cleanup()


class OtherOrigin:
    """
    A page served from another loopback port: another origin.
    """

    def __init__(self) -> None:
        page = b"<!doctype html><title>elsewhere</title><p>another origin</p>"

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# The checks.


class Checks:
    def __init__(self, page: Any, daemon: Daemon, fixtures: dict[str, Path]) -> None:
        self.page = page
        self.daemon = daemon
        self.fixtures = fixtures
        assert daemon.port is not None
        self.port: int = daemon.port
        self.url = f"http://127.0.0.1:{self.port}/"

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(expression, arg)

    def waitFor(self, expression: str, arg: Any = None, timeout: int = WAIT_MS) -> Any:
        """
        Wait until C{expression} (a function, or an expression made into
        one: the console's CSP forbids eval, rightly) is truthy.
        """
        if not re.match(r"^\s*(async\s*)?(\(|[A-Za-z_]+\s*=>)", expression):
            expression = f"() => ({expression})"
        return self.page.wait_for_function(expression, arg=arg, timeout=timeout).json_value()

    def status(self) -> dict[str, Any]:
        self.page.goto(self.url)
        self.waitFor("document.getElementById('engine-state').textContent === 'Connected'")
        self.waitFor("window.rpConsole.status && window.rpConsole.status.capacity.queueLimit > 0")
        shown = self.js(
            """() => ({
              engine: document.getElementById('engine-state').textContent,
              depth: document.getElementById('capacity-depth').textContent,
              limit: document.getElementById('capacity-limit').textContent,
              accepting: document.getElementById('capacity-accepting').textContent,
              link: document.getElementById('engine-link').href,
              plugins: [...document.querySelectorAll('#plugins li:not(.arrow):not(.end)')]
                .map((li) => li.textContent),
              clients: document.querySelectorAll('#clients tbody tr').length,
              status: window.rpConsole.status,
            })"""
        )
        capacity = shown["status"]["capacity"]
        assert shown["engine"] == "Connected", shown["engine"]
        assert shown["limit"] == str(capacity["queueLimit"]) == "20", shown
        assert shown["depth"] == str(capacity["queueDepth"]), shown
        assert shown["link"] == f"https://rpengine.gemtavern.com/#port={self.port}", shown["link"]
        assert shown["plugins"] == shown["status"]["plugins"] and shown["plugins"], shown
        assert shown["clients"] >= 1
        return {k: v for k, v in shown.items() if k != "status"}

    def localhostOrigin(self) -> dict[str, Any]:
        """
        The console also works at http://localhost:PORT (another name, the
        same listener: its origin is admitted too).
        """
        self.page.goto(f"http://localhost:{self.port}/")
        self.waitFor("document.getElementById('engine-state').textContent === 'Connected'")
        return {"ok": True}

    def loadCard(self, fixture: str, source: str, name: str) -> dict[str, Any]:
        self.page.set_input_files("#card-file", str(self.fixtures[fixture]))
        self.waitFor(
            "([name, source]) => window.rpConsole.card && window.rpConsole.card.name === name "
            "&& window.rpConsole.card.source === source",
            [name, source],
        )
        text = self.page.inner_text("#card-state")
        assert f"from a {source} card" in text and name in text, text
        assert self.js("document.getElementById('card-error').hidden"), "no error is shown"
        return {"cardState": text}

    def brokenCard(self, fixture: str, words: str) -> dict[str, Any]:
        before = self.js("window.rpConsole.card && window.rpConsole.card.name")
        self.js(
            "() => { const e = document.getElementById('card-error'); "
            "e.hidden = true; e.textContent = ''; }"
        )
        self.page.set_input_files("#card-file", str(self.fixtures[fixture]))
        self.waitFor("!document.getElementById('card-error').hidden")
        text = self.page.inner_text("#card-error")
        assert words in text, text
        after = self.js("window.rpConsole.card && window.rpConsole.card.name")
        assert after == before, (before, after)
        return {"error": text}

    def _newTurn(self, known: list[str]) -> str:
        return str(
            self.waitFor(
                "(known) => [...window.rpConsole.replies.keys()].find((id) => !known.includes(id))",
                known,
            )
        )

    def _turnIds(self) -> list[str]:
        return list(self.js("[...window.rpConsole.replies.keys()]"))

    def typedTurn(self, screenshots: Path | None) -> dict[str, Any]:
        self.daemon.demoDone.wait(20)
        self.js("() => { window.__audioProbe.starts = []; window.__audioProbe.stops = 0; }")
        known = self._turnIds()
        self.page.fill("#say-text", "Hello there, is the road to Eastwatch open?")
        self.page.click("#say-send")
        turnId = self._newTurn(known)
        self.waitFor("(id) => window.rpConsole.replies.get(id).done", turnId)
        reply = self.js(
            """(id) => {
              const r = window.rpConsole.replies.get(id);
              const b = document.querySelector(`.bubble.character[data-turn="${id}"] .text`);
              return { outcome: r.outcome, text: r.text, shown: b.textContent, speech: r.speech,
                       rate: window.rpConsole.audioContext.sampleRate };
            }""",
            turnId,
        )
        assert reply["outcome"] == "completed", reply
        assert "Eastwatch" in reply["shown"] and reply["shown"] == reply["text"], reply
        # The text grew on screen piece by piece as it streamed in.
        grew = self.js("(id) => window.__textProbe[id]", turnId)
        assert len(grew) >= 3 and grew == sorted(grew), grew
        assert grew[-1] == len(reply["shown"]), (grew, reply)
        speech = reply["speech"]
        assert speech and speech["samples"] > 0, reply
        # Everything is scheduled on arrival; the last chunk came with the end.
        starts = self.js("window.__audioProbe.starts")
        total = sum(s["length"] for s in starts)
        assert total == speech["samples"], (total, speech)
        assert {s["sampleRate"] for s in starts} == {speech["sampleRate"]}, starts[:3]
        seconds = sum(s["duration"] for s in starts)
        expected = speech["samples"] / speech["sampleRate"]
        assert abs(seconds - expected) < 1e-6, (seconds, expected)
        gaps = [
            b["when"] - (a["when"] + a["duration"])
            for a, b in zip(starts, starts[1:], strict=False)
            if abs(b["when"] - (a["when"] + a["duration"])) > 1e-6
        ]
        underruns = self.js("(id) => window.rpConsole.player.turns.get(id).underruns", turnId)
        assert len(gaps) == underruns, (gaps, underruns)
        # The status's turns table shows it with its timeline and card.
        self.waitFor(
            r"""(id) => {
              const row = document.querySelector(`#turns tr[data-request="${id}"]`);
              return row && row.querySelector('.outcome-cell').textContent === 'completed'
                && row.querySelector('.bar .seg-reply') !== null
                && /snapshot|patch|reference/.test(row.querySelector('.card-cell').textContent)
                && /^\d+\/6000 \d+ kept · 0 dropped$/
                  .test(row.querySelector('.prompt-cell').textContent);
            }""",
            turnId,
        )
        if screenshots is not None:
            self.page.wait_for_timeout(1200)
            self.page.screenshot(path=str(screenshots / "console.png"), full_page=True)
        return {
            "turnId": turnId,
            "chunks": len(starts),
            "seconds": round(seconds, 4),
            "expected": round(expected, 4),
            "gaps": len(gaps),
        }

    def cancel(self) -> dict[str, Any]:
        self.js("() => { window.__audioProbe.starts = []; window.__audioProbe.stops = 0; }")
        known = self._turnIds()
        self.page.fill(
            "#say-text",
            "Tell me everything about the inn, the bridge, the miller and the lights in the "
            "forest, and take your time about it?",
        )
        self.page.click("#say-send")
        turnId = self._newTurn(known)
        self.waitFor("() => window.__audioProbe.starts.length >= 2")
        self.page.click("#cancel")
        self.waitFor("(id) => window.rpConsole.replies.get(id).outcome === 'cancelled'", turnId)
        before = self.js(
            """(id) => ({ text: window.rpConsole.replies.get(id).text,
                         starts: window.__audioProbe.starts.length,
                         stops: window.__audioProbe.stops,
                         sources: window.rpConsole.player.sources.size,
                         messages: window.rpConsole.messages.slice(-5) })""",
            turnId,
        )
        assert before["sources"] == 0, before
        assert before["stops"] >= 1, before
        self.page.wait_for_timeout(1500)
        after = self.js(
            """(id) => ({ text: window.rpConsole.replies.get(id).text,
                         starts: window.__audioProbe.starts.length })""",
            turnId,
        )
        assert after["text"] == before["text"], "no more text after cancel"
        assert after["starts"] == before["starts"], "no more audio after cancel"
        bubble = self.page.inner_text(f'.bubble.character[data-turn="{turnId}"]')
        assert "cancelled" in bubble, bubble
        self.waitFor(
            """(id) => {
              const row = document.querySelector(`#turns tr[data-request="${id}"]`);
              return row && row.querySelector('.outcome-cell').textContent === 'cancelled';
            }""",
            turnId,
        )
        return {"turnId": turnId, "starts": before["starts"], "stops": before["stops"]}

    def microphone(self, screenshots: Path | None) -> dict[str, Any]:
        known = self._turnIds()
        button = self.page.locator("#talk")
        button.hover()
        self.page.mouse.down()
        self.waitFor("document.getElementById('talk').classList.contains('recording')")
        self.page.wait_for_timeout(1500)
        self.page.mouse.up()
        turnId = self._newTurn(known)
        self.waitFor("(id) => window.rpConsole.replies.get(id).done", turnId, timeout=30_000)
        result = self.js(
            """(id) => {
              const r = window.rpConsole.replies.get(id);
              const bubbles = [...document.querySelectorAll('.bubble.player .text')];
              return { outcome: r.outcome, text: r.text, speech: r.speech,
                       player: bubbles[bubbles.length - 1].textContent,
                       mic: document.getElementById('mic-state').textContent };
            }""",
            turnId,
        )
        assert result["outcome"] == "completed", result
        # RPEngine does not tell the words of a recording (app.rs stt_completed): the
        # player's bubble says how much speech was sent, and the simulated RPEngine's reply
        # quotes how much it heard.
        sent = re.search(r"\(([0-9.]+) s of speech", result["player"])
        assert sent and 1.0 <= float(sent.group(1)) <= 3.0, result
        heard = re.search(r"simulated transcript of ([0-9.]+) s", result["text"])
        assert heard and 1.0 <= float(heard.group(1)) <= 3.0, result
        assert result["speech"] and result["speech"]["samples"] > 0, result
        if screenshots is not None:
            self.page.wait_for_timeout(1200)
            self.page.screenshot(path=str(screenshots / "console-microphone.png"))
        return result

    def otherOrigin(self, other: OtherOrigin) -> dict[str, Any]:
        self.page.goto(f"http://127.0.0.1:{other.port}/")
        refused = self.js(PROBE_SCRIPT, self.port)
        for attempt in refused:
            assert not attempt["opened"] and attempt["code"] == 1006, attempt
        # The console's own origin opens /client/socket (and still not RPEngine's).
        self.page.goto(self.url)
        own = self.js(PROBE_SCRIPT, self.port)
        assert own[0]["opened"], own
        assert not own[1]["opened"], own
        return {"elsewhere": refused, "console": own}

    def scene(self) -> dict[str, Any]:
        """
        A game client of this page's origin opens a scene (a guard and an
        innkeeper) and says a line to the guard: the console's turns table
        shows the scene's turn with who spoke, in order, and the cast.
        """
        self.page.goto(self.url)
        self.waitFor("document.getElementById('engine-state').textContent === 'Connected'")
        cast = [
            {"characterId": "garrick", "card": v2Card("Garrick"), "voice": "M2"},
            {"characterId": "mara", "card": v2Card("Mara"), "voice": "F3"},
        ]
        sent = self.js(SCENE_SCRIPT, {"port": self.port, "cast": cast})
        assert sent["completed"], sent
        cell = self.waitFor(
            "[...document.querySelectorAll('.tag.scene')]"
            ".map((t) => ({text: t.textContent, title: t.title}))"
            ".find((t) => t.text === 'Garrick → Mara')"
        )
        return {"cell": cell, "lines": sent["lines"]}

    def metrics(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode("utf-8")
            contentType = r.headers["content-type"]
        assert contentType.startswith("text/plain"), contentType
        assert "rpmiddleware_engine_connected 1.0" in text, text[:2000]
        for name in (
            'rpmiddleware_envelopes_total{direction="to_game",outcome="delivered",'
            'type="reply.completed"}',
            "rpmiddleware_time_to_first_text_seconds_count",
            "rpmiddleware_time_to_first_audio_seconds_count",
            'rpmiddleware_card_transfer_bytes_total{mode="snapshot"}',
            'rpmiddleware_resample_seconds_count{direction="to_engine"}',
            'rpmiddleware_active_clients{endpoint="/client/socket"}',
        ):
            assert name in text, name
        return {"bytes": len(text)}


def makeFixtures(folder: Path) -> dict[str, Path]:
    files = {
        "card.json": json.dumps(v2Card("Ada the Cartographer")).encode("utf-8"),
        "card.png": pngCard(v2Card("Bram the Ferryman")),
        "nochara.png": pngCard(None),
        "v3.png": pngCard({"spec": "chara_card_v3", "data": {"name": "Cy"}}, b"ccv3"),
        "v1.json": json.dumps({"name": "Old", "description": "a V1 card"}).encode("utf-8"),
        "missing.json": json.dumps(v2Card("Dee", first_mes=None)).encode("utf-8"),
        "speech.wav": speechLikeWav(),
    }
    missing = json.loads(files["missing.json"])
    del missing["data"]["first_mes"]
    files["missing.json"] = json.dumps(missing).encode("utf-8")
    paths = {}
    for name, data in files.items():
        path = folder / name
        path.write_bytes(data)
        paths[name] = path
    return paths


def run(screenshots: Path | None, report: Callable[[dict[str, Any]], None]) -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as temp:
        fixtures = makeFixtures(Path(temp))
        from tests.face_browser import ASTRAL, PLAIN, FaceChecks

        # The default chain, as a user runs it: speech-marks and feelings in it.
        daemon = Daemon()
        other = OtherOrigin()
        try:
            if not daemon.listening.wait(30) or daemon.port is None:
                report({"check": "daemon", "ok": False, "detail": daemon.log()})
                return
            flags = [*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={fixtures['speech.wav']}"]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=flags)
                try:
                    context = browser.new_context(viewport={"width": 1360, "height": 1000})
                    context.add_init_script(PROBES)
                    page = context.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    checks = Checks(page, daemon, fixtures)
                    needed = True

                    def check(name: str, f: Callable[[], Any], required: bool = False) -> None:
                        nonlocal needed
                        if not needed:
                            report({"check": name, "ok": False, "detail": "not run"})
                            return
                        started = time.monotonic()
                        try:
                            detail = f()
                            report({"check": name, "ok": True, "detail": detail,
                                    "seconds": round(time.monotonic() - started, 2)})  # fmt: skip
                        except Exception:
                            report({"check": name, "ok": False,
                                    "detail": traceback.format_exc(), "pageErrors": errors,
                                    "daemon": daemon.log()[-4000:]})  # fmt: skip
                            if required:
                                needed = False

                    check("localhost", checks.localhostOrigin)
                    check("status", checks.status, required=True)
                    check(
                        "json card",
                        lambda: checks.loadCard("card.json", "JSON", "Ada the Cartographer"),
                    )
                    check(
                        "broken cards",
                        lambda: [
                            checks.brokenCard("nochara.png", "no character card"),
                            checks.brokenCard("v3.png", "Character Card V3"),
                            checks.brokenCard("v1.json", "V1 character card"),
                            checks.brokenCard("missing.json", "data.first_mes"),
                        ],
                    )
                    check(
                        "png card",
                        lambda: checks.loadCard("card.png", "PNG", "Bram the Ferryman"),
                        required=True,
                    )
                    check("typed turn", lambda: checks.typedTurn(screenshots))
                    check("cancel", checks.cancel)
                    check("microphone", lambda: checks.microphone(screenshots))
                    check("scene", checks.scene)
                    check("metrics", checks.metrics)
                    check("other origin", lambda: checks.otherOrigin(other))
                    face = FaceChecks(page, daemon)
                    check("face in step", lambda: face.inStep(PLAIN, "wolves", screenshots))
                    check("face in step, astral", lambda: face.inStep(ASTRAL, "took"))
                    check("face by loudness", face.byLoudness)
                    check("face turn", face.turn)
                    report({"check": "page errors", "ok": not errors, "detail": errors})
                finally:
                    browser.close()
        finally:
            other.stop()
            daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--screenshots", type=Path, help="write the console's screenshots here")
    options = parser.parse_args()

    def report(result: dict[str, Any]) -> None:
        print(json.dumps(result), flush=True)

    run(options.screenshots, report)
    report({"done": True})


if __name__ == "__main__":
    main()
