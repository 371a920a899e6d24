"""
Run the independent load harness (issue 20) and write its report.

    python bench/independent/run.py            # full run, writes docs/benchmarks/independent.md
    python bench/independent/run.py --smoke    # a few clients for a few seconds, report to /tmp

Starts the servers as users start them -- the product with
`twistd -n --pidfile= rpmiddleware --config FILE --port P` (a temporary TOML
file raising server.max_connections above N), the bare relay with
`python relay.py` -- each pinned to CPU 0, and the Node driver (load.mjs,
RPEngine and all the clients in one process) pinned to CPU 1.  Relay and
product runs are interleaved at each level; each run gets a fresh server.
Then RSS: one server of each kind, idle, then after each of several rounds
of clients.

Standard library only; shares no code with bench/ or rpmiddleware/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SERVER_CPU = "0"
DRIVER_CPU = "1"


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def freePort() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def sh(*argv: str, cwd: Path | None = None) -> str:
    try:
        return subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def productEnv() -> tuple[dict[str, str], str]:
    """
    The environment twistd runs in.  A user's install makes the plugin
    visible to twistd; if this environment's does not (an editable install
    pointing at a missing folder), the checkout goes on PYTHONPATH, which is
    what an editable install's .pth adds.
    """
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as empty:
        probe = subprocess.run(
            ["twistd", "rpmiddleware", "--help"], cwd=empty, env=env, capture_output=True, text=True
        )
    if probe.returncode == 0 and "--config" in probe.stdout:
        return env, ""
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return env, (
        f"`twistd rpmiddleware` was not found by this environment's install, so "
        f"`PYTHONPATH={REPO}` was set for twistd (what an editable install's .pth adds)."
    )


class Server:
    #: Set by start(): the relay is read as text (its "PORT n" line); the
    #: product's output goes straight to the log file.
    proc: subprocess.Popen[str] | subprocess.Popen[bytes]

    def __init__(self, kind: str, clients: int, env: dict[str, str], webrtc: bool) -> None:
        #: Whether the product serves WebRTC (and so runs on the asyncio
        #: reactor when the webrtc extra is installed); off is how
        #: `pip install .` runs.
        self.webrtc = webrtc
        self.kind = kind
        self.clients = clients
        self.env = env
        self.dir = Path(tempfile.mkdtemp(prefix=f"independent-{kind}-"))
        self.logPath = self.dir / "server.log"

    def start(self) -> None:
        logFile = open(self.logPath, "w")
        if self.kind == "product":
            config = self.dir / "rpmiddleware.toml"
            text = f"[server]\nmax_connections = {self.clients + 16}\n"
            if not self.webrtc:
                text += "\n[webrtc]\nenabled = false\n"
            config.write_text(text)
            self.port = freePort()
            self.argv = [
                "taskset",
                "-c",
                SERVER_CPU,
                "twistd",
                "-n",
                "--pidfile=",
                "rpmiddleware",
                "--config",
                str(config),
                "--port",
                str(self.port),
            ]
            self.proc = subprocess.Popen(
                self.argv, cwd=self.dir, env=self.env, stdout=logFile, stderr=subprocess.STDOUT
            )
            self._waitFor(lambda: "rpmiddleware listening on" in self.logPath.read_text())
        else:
            # As a user starts it: `python relay.py`.
            python = "python" if shutil.which("python") else sys.executable
            self.argv = ["taskset", "-c", SERVER_CPU, python, str(HERE / "relay.py")]
            proc = subprocess.Popen(
                self.argv,
                cwd=self.dir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=logFile,
                text=True,
            )
            self.proc = proc
            assert proc.stdout is not None  # stdout=PIPE
            line = proc.stdout.readline()
            if not line.startswith("PORT "):
                raise RuntimeError(
                    f"relay did not start: {line!r} {self.logPath.read_text()[-2000:]}"
                )
            self.port = int(line.split()[1])
        self.pid = self.proc.pid
        comm = Path(f"/proc/{self.pid}/comm").read_text().strip()
        if comm in ("taskset", "bash", "sh"):
            raise RuntimeError(f"server pid {self.pid} is {comm}, not the server process")

    def _waitFor(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.logPath.read_text()[-3000:]}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} did not start in {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logProblems(self) -> list[str]:
        """Warnings and errors the server logged (the product's log levels)."""
        lines = self.logPath.read_text(errors="replace").splitlines()
        bad = [
            line
            for line in lines
            if any(f"#{lvl}]" in line for lvl in ("warn", "error", "critical", "failure"))
        ]
        bad += [line for line in lines if "Traceback" in line]
        return bad


#: The product with clients taking RPEngine's own rate (no resampling).
UNCONVERTED = "product-44k"


def drive(server: Server, mode: str, extra: list[str]) -> dict:
    argv = [
        "taskset",
        "-c",
        DRIVER_CPU,
        "node",
        str(HERE / "load.mjs"),
        "--port",
        str(server.port),
        "--pid",
        str(server.pid),
        "--target",
        server.kind,
        "--mode",
        mode,
        *extra,
    ]
    out = subprocess.run(argv, cwd=HERE, capture_output=True, text=True, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"driver printed no result (rc {out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if "failed" in result:
        raise RuntimeError(f"driver failed: {result['failed']}")
    return result


def runServer(
    kind: str, clients: int, env: dict[str, str], mode: str, extra: list[str], webrtc: bool
) -> dict:
    server = Server(kind, clients, env, webrtc)
    server.start()
    try:
        result = drive(server, mode, extra)
    finally:
        server.stop()
    result["serverCommand"] = shlex.join(server.argv)
    result["serverLogProblems"] = server.logProblems()[:10]
    shutil.rmtree(server.dir, ignore_errors=True)
    return result


def f(value, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}{suffix}"


def ratio(a, b) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{b / a:.2f}x"


def report(
    args, runs, rss, env_note, before, after, started, commit, dirty, elapsed, command
) -> str:
    machine = sh("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    versions = sh(
        sys.executable,
        "-c",
        "import twisted, autobahn; "
        "print(f'Twisted {twisted.__version__}, Autobahn {autobahn.__version__}')",
    )
    node = sh("node", "--version")
    wsVersion = json.loads((HERE / "node_modules" / "ws" / "package.json").read_text())["version"]
    out = []
    out.append("# Independent load run (issue 20)\n")
    out.append(
        f"Generated by `bench/independent/run.py` on {started} UTC in {elapsed:.0f} s. "
        "The harness shares no code with `bench/`: its relay (`bench/independent/relay.py`) is a "
        "bare Autobahn-on-Twisted relay with default options, and RPEngine and every client are "
        "played by one Node process (`bench/independent/load.mjs`, the `ws` package).\n"
    )
    out.append(f"- Command: `{command}`")
    differs = f" (working tree differs from it: {dirty})" if dirty else ""
    out.append(f"- Commit measured: `{commit}`{differs}")
    out.append(
        f"- Machine: {os.cpu_count()} CPUs ({machine}), Linux {platform.release()}, "
        f"CPython {platform.python_version()}, {versions}, Node {node}, ws {wsVersion}"
    )
    out.append(f"- Load average before: {before}; after: {after}")
    out.append(
        "- Servers pinned to CPU 0, the driver to CPU 1 (`taskset`); a fresh server for every run; "
        "runs interleaved relay, product at each level."
    )
    out.append(
        "- Product started as `twistd -n --pidfile= rpmiddleware --config FILE --port P` "
        "(FILE: `[server] max_connections = N + 16`"
        + ("" if args.webrtc == "on" else ", `[webrtc] enabled = false`")
        + ", nothing else); relay as `python relay.py`."
    )
    out.append(
        "- WebRTC: "
        + (
            "on (with the webrtc extra installed, twistd runs the asyncio reactor)."
            if args.webrtc == "on"
            else "off, so twistd runs its default (epoll) reactor, as after `pip install .` "
            "without the webrtc extra."
        )
    )
    if env_note:
        out.append(f"- {env_note}")
    for note in args.note:
        out.append(f"- **Note:** {note}")
    out.append("")
    out.append("## The load\n")
    out.append(
        "Each client connects to `/client/socket`, waits for `ready` (the product), sends "
        "`character` (a small Character Card V2) and `configure {output: {sampleRate: 24000}}`, "
        "then plays `text` turns back to back (the next when `reply-complete` arrives), first "
        f"turns spread over {args.spread:g} s. RPEngine (over `/rp-engine/socket`, Origin "
        "`https://rpengine.gemtavern.com`, protocol v3: hello/welcome, ack of every message, "
        "`capacity.update` with queueLimit 4096) answers each `reply.request` with "
        "`reply.accepted`, `reply.audio.start` (pcm_s16le, 44100 Hz), then on its own 50 ms timer "
        "a `reply.text.delta` each tick (60 a turn) and a `reply.audio.chunk` every second tick "
        "(4410 samples = 100 ms of 44.1 kHz PCM16, 30 a turn, one segment), then "
        "`reply.text.completed`, `reply.audio.completed`, `reply.completed`. The relay gets the "
        "same stream without the handshake and acks.\n"
    )
    out.append(
        f"Measured over a {args.window:g} s window after {args.warmup:g} s of warm-up. "
        "Chunk delay: RPEngine sends chunk i of request R -> the client receives its i-th "
        "`tts-chunk` of turn R (one process, one clock); text delay: delta i -> the i-th "
        "`llm-chunk`. Percentiles interpolate linearly. Server CPU: utime+stime from "
        "`/proc/PID/stat` over the window (100% = one core); CPU per real-time stream = server "
        "CPU seconds / (chunks delivered x 0.1 s), in ms of CPU per second of speech.\n"
    )
    out.append("## Heavy load, relay vs product\n")
    out.append(
        "| streams | relay CPU | product CPU | CPU per stream relay / product (ms/s) | ratio "
        "| chunks relay / product | chunk p50 relay / product (ms) "
        "| chunk p99 relay / product (ms) "
        "| chunk max relay / product (ms) | text p99 relay / product (ms) "
        "| driver CPU relay / product |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    problems = []
    for level in args.levels:
        r = runs.get(("relay", level))
        p = runs.get(("product", level))
        if r is None or p is None:
            continue
        out.append(
            f"| {level} | {f(r['serverCpuPercent'], 0, '%')} | {f(p['serverCpuPercent'], 0, '%')} "
            f"| {f(r['cpuPerStreamMsPerS'], 2)} / {f(p['cpuPerStreamMsPerS'], 2)} "
            f"| {ratio(r['cpuPerStreamMsPerS'], p['cpuPerStreamMsPerS'])} "
            f"| {r['chunks']} / {p['chunks']} "
            f"| {f(r['chunkP50'], 2)} / {f(p['chunkP50'], 2)} "
            f"| {f(r['chunkP99'], 1)} / {f(p['chunkP99'], 1)} "
            f"| {f(r['chunkMax'], 1)} / {f(p['chunkMax'], 1)} "
            f"| {f(r['textP99'], 1)} / {f(p['textP99'], 1)} "
            f"| {f(r['driverCpuPercent'], 0, '%')} / {f(p['driverCpuPercent'], 0, '%')} |"
        )
        for res in (r, p):
            for line in res.get("problems", []) + res.get("serverLogProblems", []):
                problems.append(f"{res['target']} N={level}: {line}")
    out.append("")
    out.append(
        "Turns completed in each run (relay / product): "
        + ", ".join(
            f"N={lv}: {runs[('relay', lv)]['turnsCompleted']} "
            f"/ {runs[('product', lv)]['turnsCompleted']}"
            for lv in args.levels
            if ("relay", lv) in runs and ("product", lv) in runs
        )
        + ". A chunk count below N x 10 x window means the streams ran slower than real time "
        "(a saturated server or driver).\n"
    )
    if any(kind == UNCONVERTED for kind, _ in runs):
        out.append("## The product without resampling\n")
        out.append(
            "The same load, the product's clients asking for 44.1 kHz (`configure {output: "
            "{sampleRate: 44100}}`), RPEngine's own rate: the product converts nothing, as the "
            "relay never does. Its runs were interleaved with the two above at each level; the "
            "difference to the product's row is what resampling every chunk to 24 kHz costs "
            "(the product's CPU per stream less this one's).\n"
        )
        out.append(
            "| streams | relay CPU | product CPU (44.1 kHz out) | CPU per stream relay / "
            "product 44.1 kHz (ms/s) | ratio | resampling's cost (ms/s) "
            "| chunk p50 / p99 / max (ms) | driver CPU |"
        )
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for level in args.levels:
            r = runs.get(("relay", level))
            u = runs.get((UNCONVERTED, level))
            p = runs.get(("product", level))
            if r is None or u is None:
                continue
            cost = (
                p["cpuPerStreamMsPerS"] - u["cpuPerStreamMsPerS"]
                if p and p["cpuPerStreamMsPerS"] and u["cpuPerStreamMsPerS"]
                else None
            )
            out.append(
                f"| {level} | {f(r['serverCpuPercent'], 0, '%')} "
                f"| {f(u['serverCpuPercent'], 0, '%')} "
                f"| {f(r['cpuPerStreamMsPerS'], 2)} / {f(u['cpuPerStreamMsPerS'], 2)} "
                f"| {ratio(r['cpuPerStreamMsPerS'], u['cpuPerStreamMsPerS'])} "
                f"| {f(cost, 2)} "
                f"| {f(u['chunkP50'], 2)} / {f(u['chunkP99'], 1)} / {f(u['chunkMax'], 1)} "
                f"| {f(u['driverCpuPercent'], 0, '%')} |"
            )
            for line in u.get("problems", []) + u.get("serverLogProblems", []):
                problems.append(f"{UNCONVERTED} N={level}: {line}")
        out.append("")
    if rss:
        out.append("## Memory (VmRSS, MB)\n")
        out.append(
            "One server of each kind: idle (started, nothing connected, 0.5 s), then after each "
            f"of {args.rss_rounds} rounds of {args.rss_clients} clients of the same load "
            f"({args.rss_warmup:g} s + {args.rss_seconds:g} s a round, a fresh RPEngine "
            "connection each round); everyone leaves at the end of a round and RSS is read 0.5 s "
            "after. The product runs with its defaults (a departed client's session is kept for "
            "`client.session_ttl`).\n"
        )
        head = (
            "| server | idle | "
            + " | ".join(f"after round {i + 1}" for i in range(args.rss_rounds))
            + " | growth round 1 to last |"
        )
        out.append(head)
        out.append("|---|" + "---:|" * (args.rss_rounds + 2))
        for kind in ("relay", "product"):
            res = rss.get(kind)
            if res is None:
                continue
            sizes = res["roundsMB"]
            growth = sizes[-1] - sizes[0] if sizes else None
            out.append(
                f"| {kind} | {f(res['idleMB'])} | "
                + " | ".join(f(s) for s in sizes)
                + f" | {f(growth, 1)} |"
            )
            for line in res.get("roundProblems", []) + res.get("serverLogProblems", []):
                problems.append(f"{kind} RSS rounds: {line}")
        out.append("")
        if "relay" in rss and "product" in rss:
            idle = ratio(rss["relay"]["idleMB"], rss["product"]["idleMB"])
            last = ratio(rss["relay"]["roundsMB"][-1], rss["product"]["roundsMB"][-1])
            out.append(f"Idle RSS product / relay: {idle}; after the last round: {last}.\n")
    out.append("## Problems seen\n")
    if problems:
        out.append(
            "What the driver was told and what the servers logged as warnings or errors "
            "(first few):\n"
        )
        out.extend(f"- `{p[:400]}`" for p in problems[:30])
    else:
        out.append(
            "None: no `error` or unexpected `tts-cancelled` reached a client, the servers logged "
            "no warning or error, and no connection was closed by a server."
        )
    out.append("")
    out.append("## Raw results\n")
    out.append("```json")
    for (kind, _level), res in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        out.append(json.dumps({**res, "run": kind}, sort_keys=True))
    for res in rss.values():
        out.append(json.dumps(res, sort_keys=True))
    out.append("```\n")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke", action="store_true", help="5 and 10 clients, short windows, report to /tmp"
    )
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--warmup", type=float, default=None)
    parser.add_argument("--window", type=float, default=None)
    parser.add_argument("--spread", type=float, default=3.0)
    parser.add_argument("--rss-clients", type=int, default=None)
    parser.add_argument("--rss-rounds", type=int, default=None)
    parser.add_argument("--rss-seconds", type=float, default=None)
    parser.add_argument("--rss-warmup", type=float, default=1.0)
    parser.add_argument("--no-rss", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--note", action="append", default=[], help="a line for the report")
    parser.add_argument(
        "--unconverted",
        action="store_true",
        help="also run the product with clients that take RPEngine's 44.1 kHz, so that it "
        "resamples nothing (the relay never does): what the resampling costs",
    )
    parser.add_argument(
        "--webrtc",
        choices=("off", "on"),
        default="off",
        help="the product's [webrtc] enabled: off (the default; the epoll reactor, as "
        "`pip install .` runs it) or on (the asyncio reactor when the webrtc extra is installed)",
    )
    args = parser.parse_args()
    webrtc = args.webrtc == "on"
    smoke = args.smoke
    args.levels = args.levels or ([5, 10] if smoke else [100, 200, 250])
    args.warmup = args.warmup if args.warmup is not None else (2.0 if smoke else 3.0)
    args.window = args.window if args.window is not None else (3.0 if smoke else 10.0)
    args.rss_clients = args.rss_clients or (10 if smoke else 200)
    args.rss_rounds = args.rss_rounds or (2 if smoke else 5)
    args.rss_seconds = args.rss_seconds if args.rss_seconds is not None else (2.0 if smoke else 5.0)
    out = (
        Path(args.out)
        if args.out
        else (
            Path(tempfile.gettempdir()) / "independent-smoke.md"
            if smoke
            else REPO / "docs" / "benchmarks" / "independent.md"
        )
    )
    command = shlex.join(["python", *sys.argv])

    if not (HERE / "node_modules" / "ws").is_dir():
        log(f"run `npm install` in {HERE} first")
        return 2
    for tool in ("node", "taskset", "twistd"):
        if shutil.which(tool) is None:
            log(f"{tool} not found on PATH")
            return 2

    env, env_note = productEnv()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    commit = sh("git", "rev-parse", "HEAD", cwd=REPO)
    dirty = sh(
        "git",
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "rpmiddleware",
        "plugins",
        "twisted",
        cwd=REPO,
    )
    dirty = ", ".join(line[3:] for line in dirty.splitlines()) if dirty and dirty != "?" else ""
    before = loadavg()
    t0 = time.monotonic()
    runs: dict[tuple[str, int], dict] = {}
    kinds = ("relay", "product", UNCONVERTED) if args.unconverted else ("relay", "product")
    for level in args.levels:
        for kind in kinds:
            log(f"{kind} N={level} ...")
            res = runServer(
                "product" if kind == UNCONVERTED else kind,
                level,
                env,
                "load",
                [
                    "--output-rate",
                    "44100" if kind == UNCONVERTED else "24000",
                    "--clients",
                    str(level),
                    "--warmup",
                    str(args.warmup),
                    "--window",
                    str(args.window),
                    "--spread",
                    str(args.spread),
                ],
                webrtc,
            )
            runs[(kind, level)] = res
            problemCount = len(res["problems"]) + len(res["serverLogProblems"])
            log(
                f"  cpu {res['serverCpuPercent']:.0f}%  "
                f"per stream {res['cpuPerStreamMsPerS'] or 0:.2f} ms/s  "
                f"chunks {res['chunks']}  p99 {res['chunkP99'] or 0:.1f} ms  "
                f"max {res['chunkMax'] or 0:.1f} ms  "
                f"text p99 {res['textP99'] or 0:.1f} ms  driver {res['driverCpuPercent']:.0f}%  "
                f"problems {problemCount}"
            )
            time.sleep(1.0)
    rss: dict[str, dict] = {}
    if not args.no_rss:
        for kind in ("relay", "product"):
            log(f"{kind} RSS rounds ...")
            res = runServer(
                kind,
                args.rss_clients,
                env,
                "rss",
                [
                    "--clients",
                    str(args.rss_clients),
                    "--rounds",
                    str(args.rss_rounds),
                    "--round-seconds",
                    str(args.rss_seconds),
                    "--round-warmup",
                    str(args.rss_warmup),
                    "--spread",
                    str(args.spread),
                ],
                webrtc,
            )
            rss[kind] = res
            log(f"  idle {res['idleMB']:.1f} MB, rounds {[round(x, 1) for x in res['roundsMB']]}")
            time.sleep(1.0)
    after = loadavg()
    elapsed = time.monotonic() - t0
    text = report(
        args, runs, rss, env_note, before, after, started, commit, dirty, elapsed, command
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
