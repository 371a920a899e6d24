// Independent load driver for issue 20: plays RPEngine and N game clients in
// one Node process against a server (rpmiddleware, or relay.py) on 127.0.0.1.
// Shares no code with bench/ or rpmiddleware/.
//
//   node load.mjs --port P --pid PID --target product|relay [--mode load|rss]
//                 [--clients N] [--warmup S] [--window S] [--spread S]
//                 [--rounds K] [--round-seconds S] [--round-warmup S]
//                 [--output-rate 24000|44100]
//
// The load (issue 20's "heavy" load): each client plays typed turns back to
// back (a new `text` when `reply-complete` arrives), first turns spread over
// --spread seconds.  RPEngine answers each turn in real time with its own
// timer: a reply.text.delta every 50 ms (60 a turn) and, every 100 ms, a
// reply.audio.chunk of 100 ms of 44.1 kHz mono PCM16 (4410 samples, 30 a
// turn), then reply.text.completed, reply.audio.completed, reply.completed.
//
// mode load: after --warmup s, a --window s window: chunk delay (RPEngine
//   sends chunk i of request R -> the client receives its i-th tts-chunk of
//   turn R), text delay (delta i -> i-th llm-chunk), server CPU from
//   /proc/PID/stat, CPU per real-time stream = CPU s / (chunks x 0.1 s).
// mode rss: VmRSS idle (before any connection), then after each of --rounds
//   rounds of --clients clients (a fresh RPEngine connection each round;
//   everyone leaves between rounds, RSS read 0.5 s after they are gone).
//
// Prints one JSON line.

import WebSocket from "ws";
import { readFileSync } from "node:fs";
import { execSync } from "node:child_process";
import { performance } from "node:perf_hooks";
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";

const { values: opt } = parseArgs({
  options: {
    port: { type: "string" },
    pid: { type: "string" },
    target: { type: "string", default: "product" },
    mode: { type: "string", default: "load" },
    clients: { type: "string", default: "10" },
    warmup: { type: "string", default: "3" },
    window: { type: "string", default: "10" },
    spread: { type: "string", default: "3" },
    rounds: { type: "string", default: "5" },
    "round-seconds": { type: "string", default: "5" },
    "round-warmup": { type: "string", default: "1" },
    origin: { type: "string", default: "https://rpengine.gemtavern.com" },
    // The rate clients ask for: 24000 (the product resamples every chunk)
    // or 44100, RPEngine's own (nothing to resample).
    "output-rate": { type: "string", default: "24000" },
  },
});

const PORT = Number(opt.port);
const PID = Number(opt.pid);
const PRODUCT = opt.target === "product";
if (!PORT || !PID || !["product", "relay"].includes(opt.target)) {
  console.error("usage: node load.mjs --port P --pid PID --target product|relay [--mode load|rss] [--clients N]");
  process.exit(2);
}

const RATE = 44100;
const SAMPLES = 4410; // 100 ms
const CHUNKS = 30; // per turn: 3 s of speech
const TICK_MS = 50; // a text delta each tick, a chunk every second tick
const DELTAS = 2 * CHUNKS; // 60 a turn
const CLK_TCK = (() => {
  try {
    return Number(execSync("getconf CLK_TCK").toString().trim()) || 100;
  } catch {
    return 100;
  }
})();

// 100 ms of a 220 Hz tone, 44.1 kHz mono PCM16 little-endian, base64.
const PCM = (() => {
  const buf = Buffer.alloc(SAMPLES * 2);
  for (let i = 0; i < SAMPLES; i++) {
    buf.writeInt16LE(Math.round(0.3 * 32767 * Math.sin((2 * Math.PI * 220 * i) / RATE)), i * 2);
  }
  return buf.toString("base64");
})();

// A small Character Card V2 of our own.
const CARD = {
  spec: "chara_card_v2",
  spec_version: "2.0",
  data: {
    name: "Mira",
    description: "Mira keeps the ferry house on the river crossing and talks to every traveller.",
    personality: "Cheerful, direct, a little nosy.",
    scenario: "A traveller waits for the ferry in the evening.",
    first_mes: "Evening! The ferry leaves when the bell rings. Where are you headed?",
    mes_example: "<START>\n{{user}}: Is the river high?\n{{char}}: High enough that the ferryman grumbles.",
    creator_notes: "Load-test card for the independent harness.",
    system_prompt: "",
    post_history_instructions: "",
    alternate_greetings: [],
    character_book: {
      name: "River lore",
      entries: [
        {
          keys: ["bell"],
          content: "The ferry bell was cast from an old anchor.",
          extensions: {},
          enabled: true,
          insertion_order: 0,
        },
      ],
      extensions: {},
    },
    tags: ["test"],
    creator: "independent-harness",
    character_version: "1",
    extensions: {},
  },
};

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function procCpuSeconds(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // rest[0] is field 3 (state); utime is field 14, stime field 15.
  return (Number(rest[11]) + Number(rest[12])) / CLK_TCK;
}

function maxOf(values) {
  let m = null;
  for (const v of values) if (m === null || v > m) m = v;
  return m;
}

function rssMB(pid) {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const m = /VmRSS:\s+(\d+)\s+kB/.exec(status);
  return m ? Number(m[1]) / 1024 : NaN;
}

function percentile(values, p) {
  // Linear interpolation between closest ranks (numpy's default).
  if (values.length === 0) return null;
  const s = Float64Array.from(values).sort();
  const rank = (p / 100) * (s.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.min(lo + 1, s.length - 1);
  return s[lo] + (s[hi] - s[lo]) * (rank - lo);
}

const idPrefix = randomBytes(8).toString("hex");
let idCounter = 0;
const nextId = () => idPrefix + (++idCounter).toString(16).padStart(16, "0");

function closed(ws, ms = 3000) {
  if (ws.readyState === WebSocket.CLOSED) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      ws.terminate();
      resolve();
    }, ms);
    ws.once("close", () => {
      clearTimeout(timer);
      resolve();
    });
    if (ws.readyState !== WebSocket.CLOSING) ws.close(1000);
  });
}

class Engine {
  constructor() {
    this.sessionId = null;
    this.streams = new Map(); // requestId -> stream
    this.sentChunk = new Map(); // "R|i" -> ms
    this.sentText = new Map(); // "R|i" -> ms
    this.received = {}; // type -> count
    this.problems = []; // what the server said was wrong
    this.requests = 0;
  }

  start() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(`ws://127.0.0.1:${PORT}/rp-engine/socket`, {
        origin: opt.origin,
        perMessageDeflate: false,
      });
      this.ws = ws;
      ws.on("error", (e) => {
        this.problems.push(`engine socket error: ${e.message}`);
        reject(e);
      });
      ws.on("unexpected-response", (req, res) => {
        reject(new Error(`engine upgrade refused: HTTP ${res.statusCode}`));
      });
      ws.on("close", (code, reason) => {
        if (!this.stopping) this.problems.push(`engine closed by server: ${code} ${reason}`);
        this.stopAll();
      });
      ws.on("message", (data) => this.onMessage(JSON.parse(data.toString())));
      ws.on("open", () => {
        if (!PRODUCT) return resolve(); // the relay has no handshake
        this.welcomed = resolve;
        this.emit("hello", { clientVersion: "1.3.0" });
      });
    });
  }

  emit(type, fields) {
    const text = JSON.stringify({
      protocol: "gemtavern.rp_engine",
      protocolVersion: 3,
      type,
      messageId: nextId(),
      sessionId: type === "hello" ? null : this.sessionId,
      timestamp: new Date().toISOString(),
      ...fields,
    });
    const at = performance.now();
    this.ws.send(text);
    return at;
  }

  ack(message) {
    // RPEngine acknowledges every valid message but an ack, in order.
    if (PRODUCT) this.emit("ack", { acknowledgedMessageId: message.messageId });
  }

  onMessage(m) {
    const type = m.type;
    this.received[type] = (this.received[type] || 0) + 1;
    if (type === "welcome") {
      // RPEngine acks welcome before adopting the session (sessionId null).
      this.ack(m);
      this.sessionId = m.sessionId;
      this.emit("capacity.update", { acceptingRequests: true, queueDepth: 0, queueLimit: 4096 });
      if (this.welcomed) this.welcomed();
    } else if (type === "reply.request") {
      this.ack(m);
      this.begin(m);
    } else if (type === "request.cancel") {
      this.ack(m);
      const s = this.streams.get(m.requestId);
      if (s) {
        clearTimeout(s.timer);
        this.streams.delete(m.requestId);
        this.emit("reply.cancelled", { requestId: m.requestId, reason: "requested_by_game" });
      } else {
        this.emit("reply.cancelled", { requestId: m.requestId, reason: "not_active" });
      }
    } else if (type === "request.error" || type === "error") {
      if (this.problems.length < 20) this.problems.push(`engine got ${JSON.stringify(m).slice(0, 300)}`);
    } else if (type !== "ack") {
      this.ack(m);
    }
  }

  begin(req) {
    this.requests++;
    const requestId = req.requestId;
    const modalities = (req.output && req.output.modalities) || ["text", "audio"];
    const audio = modalities.includes("audio");
    this.emit("reply.accepted", {
      requestId,
      eventId: req.eventId ?? null,
      resolvedCardHash: (req.card && req.card.targetHash) || null,
      queueDepth: 0,
    });
    if (audio) {
      this.emit("reply.audio.start", { requestId, format: "pcm_s16le", sampleRate: RATE, channels: 1 });
    }
    const s = { requestId, audio, modalities, step: 0, next: performance.now(), timer: null };
    this.streams.set(requestId, s);
    this.tick(s);
  }

  // Each stream keeps its own real-time pace: an absolute 50 ms schedule;
  // a late tick is not made up with a burst (the turn grows longer instead).
  tick(s) {
    s.timer = null;
    if (this.streams.get(s.requestId) !== s) return;
    const { requestId, step } = s;
    const key = requestId + "|";
    if (step < DELTAS) {
      this.sentText.set(key + step, this.emit("reply.text.delta", { requestId, sequence: step, delta: `w${step} ` }));
      if (s.audio && step % 2 === 0) {
        const i = step / 2;
        this.sentChunk.set(
          key + i,
          this.emit("reply.audio.chunk", {
            requestId,
            sequence: i,
            segmentSequence: 0,
            segmentChunkSequence: i,
            segmentChunkCount: CHUNKS,
            data: PCM,
          }),
        );
      }
    } else {
      let text = "";
      for (let i = 0; i < DELTAS; i++) text += `w${i} `;
      this.emit("reply.text.completed", { requestId, text, tokenCount: DELTAS, elapsedMs: DELTAS * TICK_MS });
      if (s.audio) {
        this.emit("reply.audio.completed", {
          requestId,
          chunkCount: CHUNKS,
          totalBytes: CHUNKS * SAMPLES * 2,
          durationSeconds: (CHUNKS * SAMPLES) / RATE,
          elapsedMs: DELTAS * TICK_MS,
          segmentCount: 1,
        });
      }
      this.emit("reply.completed", { requestId, modalities: s.modalities });
      this.streams.delete(requestId);
      return;
    }
    s.step = step + 1;
    s.next += TICK_MS;
    const now = performance.now();
    if (s.next < now) s.next = now;
    s.timer = setTimeout(() => this.tick(s), s.next - now);
  }

  stopAll() {
    for (const s of this.streams.values()) clearTimeout(s.timer);
    this.streams.clear();
  }

  async stop() {
    this.stopping = true;
    this.stopAll();
    await closed(this.ws);
  }
}

class Player {
  constructor(engine, stats) {
    this.engine = engine;
    this.stats = stats;
    this.chunkIndex = new Map();
    this.textIndex = new Map();
    this.running = true;
  }

  start() {
    return new Promise((resolve, reject) => {
      // A native client: no Origin header.
      const ws = new WebSocket(`ws://127.0.0.1:${PORT}/client/socket`, { perMessageDeflate: false });
      this.ws = ws;
      const go = () => {
        ws.send(JSON.stringify({ type: "character", characterId: "mira", card: CARD }));
        ws.send(JSON.stringify({ type: "configure", output: { sampleRate: Number(opt["output-rate"]) } }));
        resolve();
      };
      this.onReady = go;
      ws.on("error", reject);
      ws.on("unexpected-response", (req, res) => reject(new Error(`client upgrade refused: HTTP ${res.statusCode}`)));
      ws.on("close", (code, reason) => {
        if (this.running && !this.stats.stopping) this.stats.problems.push(`client closed by server: ${code} ${reason}`);
      });
      ws.on("message", (data) => this.onMessage(JSON.parse(data.toString()), performance.now()));
      ws.on("open", () => {
        if (!PRODUCT) go(); // the relay sends no ready
      });
    });
  }

  say() {
    if (this.running && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ type: "text", text: "speak" }));
      this.stats.turnsAsked++;
    }
  }

  // The i-th message of a kind this client got in a turn is matched with
  // the i-th RPEngine sent for it: its arrival time and delay are kept.
  timeNth(counts, sentAt, turn, at, arrivals, delays) {
    const i = counts.get(turn) || 0;
    counts.set(turn, i + 1);
    const key = turn + "|" + i;
    const sent = sentAt.get(key);
    if (sent !== undefined) {
      sentAt.delete(key);
      arrivals.push(at);
      delays.push(at - sent);
    }
  }

  onMessage(m, at) {
    const st = this.stats;
    switch (m.type) {
      case "tts-chunk":
        this.timeNth(this.chunkIndex, this.engine.sentChunk, m.turnId, at, st.chunkAt, st.chunkDelay);
        break;
      case "llm-chunk":
        if (m.done) break;
        this.timeNth(this.textIndex, this.engine.sentText, m.turnId, at, st.textAt, st.textDelay);
        break;
      case "reply-complete":
        st.turnsCompleted++;
        this.chunkIndex.delete(m.turnId);
        this.textIndex.delete(m.turnId);
        this.say();
        break;
      case "tts-cancelled":
        st.cancelled++;
        if (st.problems.length < 20) st.problems.push(`tts-cancelled: ${JSON.stringify(m).slice(0, 300)}`);
        this.say();
        break;
      case "error":
        st.errors++;
        if (st.problems.length < 20) st.problems.push(`error: ${JSON.stringify(m).slice(0, 300)}`);
        break;
      case "ready":
        if (this.onReady) {
          const f = this.onReady;
          this.onReady = null;
          f();
        }
        break;
      default:
        break;
    }
  }
}

// One round of load: RPEngine and N clients connect, play for
// warmup + window seconds, and leave.  Returns the window's figures.
async function round(clients, warmup, window, spread) {
  const stats = {
    chunkAt: [],
    chunkDelay: [],
    textAt: [],
    textDelay: [],
    turnsAsked: 0,
    turnsCompleted: 0,
    cancelled: 0,
    errors: 0,
    problems: [],
    stopping: false,
  };
  const engine = new Engine();
  await engine.start();
  const players = Array.from({ length: clients }, () => new Player(engine, stats));
  const connect0 = performance.now();
  await Promise.all(players.map((p) => p.start()));
  const connectMs = performance.now() - connect0;
  const timers = players.map((p, i) => setTimeout(() => p.say(), (spread * 1000 * i) / clients));
  await sleep(warmup * 1000);
  const cpu0 = procCpuSeconds(PID);
  const drv0 = process.cpuUsage();
  const t0 = performance.now();
  await sleep(window * 1000);
  const cpu1 = procCpuSeconds(PID);
  const drv1 = process.cpuUsage();
  const t1 = performance.now();
  stats.stopping = true;
  timers.forEach(clearTimeout);
  for (const p of players) p.running = false;

  const inWindow = (ats, values) => values.filter((_, i) => ats[i] >= t0 && ats[i] <= t1);
  const chunk = inWindow(stats.chunkAt, stats.chunkDelay);
  const text = inWindow(stats.textAt, stats.textDelay);
  const wall = (t1 - t0) / 1000;
  const cpu = cpu1 - cpu0;
  const driver = (drv1.user - drv0.user + drv1.system - drv0.system) / 1e6;
  const result = {
    clients,
    windowSeconds: wall,
    chunks: chunk.length,
    chunkP50: percentile(chunk, 50),
    chunkP99: percentile(chunk, 99),
    chunkMax: maxOf(chunk),
    textDeltas: text.length,
    textP50: percentile(text, 50),
    textP99: percentile(text, 99),
    textMax: maxOf(text),
    serverCpuSeconds: cpu,
    serverCpuPercent: (100 * cpu) / wall,
    cpuPerStreamMsPerS: chunk.length ? (1000 * cpu) / (chunk.length * 0.1) : null,
    driverCpuPercent: (100 * driver) / wall,
    connectMs,
    turnsAsked: stats.turnsAsked,
    turnsCompleted: stats.turnsCompleted,
    engineRequests: engine.requests,
    cancelled: stats.cancelled,
    errors: stats.errors,
    engineReceived: engine.received,
    problems: [...stats.problems, ...engine.problems].slice(0, 20),
  };
  await Promise.all(players.map((p) => closed(p.ws)));
  await sleep(200);
  await engine.stop();
  return result;
}

async function main() {
  const clients = Number(opt.clients);
  const out = { target: opt.target, mode: opt.mode, port: PORT, pid: PID, clkTck: CLK_TCK };
  if (opt.mode === "load") {
    Object.assign(out, await round(clients, Number(opt.warmup), Number(opt.window), Number(opt.spread)));
  } else if (opt.mode === "rss") {
    await sleep(500);
    out.clients = clients;
    out.idleMB = rssMB(PID);
    out.roundsMB = [];
    out.roundChunkP99 = [];
    out.roundProblems = [];
    for (let r = 0; r < Number(opt.rounds); r++) {
      const res = await round(clients, Number(opt["round-warmup"]), Number(opt["round-seconds"]), Number(opt.spread));
      await sleep(500);
      out.roundsMB.push(rssMB(PID));
      out.roundChunkP99.push(res.chunkP99);
      out.roundProblems.push(...res.problems.slice(0, 3));
    }
  } else {
    throw new Error(`unknown mode ${opt.mode}`);
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stdout.write(JSON.stringify({ target: opt.target, mode: opt.mode, failed: String(e && e.stack || e) }) + "\n");
    process.exit(1);
  },
);
