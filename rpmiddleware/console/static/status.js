// Rendering the `status` message: RPEngine, capacity and its chart, the plugin
// chain, clients, recent turns with their timelines, errors.  Everything that
// came from elsewhere is set as text, never as HTML.

const CHART_SECONDS = 300;

function $(id) { return document.getElementById(id); }

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "style") node.style.cssText = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function formatMs(ms) {
  if (ms === undefined || ms === null) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

export function formatBytes(bytes) {
  if (typeof bytes !== "number") return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1048576) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1048576).toFixed(2)} MiB`;
}

function ago(serverMs, nowMs) {
  if (!serverMs) return "—";
  const seconds = Math.max(0, Math.round((nowMs - serverMs) / 1000));
  const clock = new Date(serverMs).toLocaleTimeString();
  if (seconds < 60) return `${clock} (${seconds} s ago)`;
  if (seconds < 3600) return `${clock} (${Math.floor(seconds / 60)} min ago)`;
  return `${clock} (${Math.floor(seconds / 3600)} h ago)`;
}

export class StatusView {
  constructor() {
    this.status = null;
    this.offset = 0; // server clock minus ours, ms
    this.chart = $("queue-chart");
    setInterval(() => this.tick(), 1000);
  }

  serverNow() { return Date.now() + this.offset; }

  render(status) {
    this.status = status;
    this.offset = status.time - Date.now();
    $("server-version").textContent = `rpmiddleware ${status.server.version} · port ${status.server.port}`;
    this.renderEngine(status);
    this.renderCapacity(status.capacity);
    this.renderChain(status.plugins);
    this.renderClients(status.clients);
    this.renderTurns(status.turns);
    this.renderErrors(status.errors);
    this.drawChart();
  }

  tick() {
    if (!this.status) return;
    this.drawChart();
    const engine = this.status.engine;
    if (engine.connected) $("engine-since").textContent = ago(engine.connectedAt, this.serverNow());
  }

  renderEngine(status) {
    const engine = status.engine;
    const state = $("engine-state");
    // engine.problem says why it is not connected, when the middleware knows
    // (file mode: RPEngine's tab stopped reading the folder).
    state.textContent = engine.connected
      ? "Connected"
      : engine.problem
        ? "Stopped reading the folder"
        : "Not connected";
    state.className = `badge ${engine.connected ? "badge-on" : "badge-off"}`;
    state.title = engine.problem || "";
    const link = $("engine-link");
    link.href = engine.link;
    link.textContent = engine.connected ? "Open RPEngine" : "Open RPEngine to connect it";
    link.title = engine.link;
    $("engine-session").textContent = engine.sessionId || "—";
    $("engine-peer").textContent = engine.peer || "—";
    // RPEngine's file mailbox, when served: the folder to select in RPEngine
    // (Settings, Game transport: Filesystem mailbox, Choose mailbox folder).
    const mailbox = Boolean(engine.mailbox);
    $("engine-mailbox-label").hidden = !mailbox;
    $("engine-mailbox").hidden = !mailbox;
    if (mailbox) {
      const through = engine.transport === "mailbox" ? " (connected through it)" : "";
      const problem = engine.problem ? ` (${engine.problem})` : "";
      $("engine-mailbox").textContent = engine.mailbox + through + problem;
      $("engine-mailbox").title =
        "In RPEngine: Settings, Game transport: Filesystem mailbox, Choose mailbox folder, then this folder";
    }
    $("engine-since").textContent = engine.connected ? ago(engine.connectedAt, this.serverNow()) : "—";
  }

  renderCapacity(capacity) {
    $("capacity-accepting").textContent = capacity.acceptingRequests ? "yes" : "no";
    $("capacity-accepting").style.color = capacity.acceptingRequests ? "var(--ok)" : "var(--bad)";
    $("capacity-depth").textContent = String(capacity.queueDepth);
    $("capacity-limit").textContent = String(capacity.queueLimit);
    $("capacity-waiting").textContent = String(capacity.waitingForEngine + capacity.heldLocally);
  }

  renderChain(plugins) {
    const list = $("plugins");
    list.replaceChildren(el("li", { class: "end", text: "game" }));
    for (const name of plugins) {
      list.append(el("li", { class: "arrow", text: "→" }), el("li", { text: name }));
    }
    list.append(el("li", { class: "arrow", text: "→" }), el("li", { class: "end", text: "RPEngine" }));
  }

  renderClients(clients) {
    $("client-count").textContent = `(${clients.length})`;
    const body = $("clients").tBodies[0];
    body.replaceChildren(...clients.map((c) => el(
      "tr", { class: c.you ? "you" : null },
      el("td", {}, el("code", { text: c.id }), c.you ? " (this page)" : (c.subscribed ? " (console)" : "")),
      el("td", { class: "mono", text: c.peer }),
      el("td", { text: c.characterId || "—" }),
      el("td", {}, c.turn ? el("span", { class: "tag running", text: c.turn.kind }) : "idle"),
    )));
  }

  renderTurns(turns) {
    const body = $("turns").tBodies[0];
    $("turns-empty").hidden = turns.length > 0;
    const ends = turns.map((t) => endOf(t.marks) || 0);
    const scale = Math.max(1000, ...ends);
    body.replaceChildren(...turns.map((turn) => this.turnRow(turn, scale)));
  }

  turnRow(turn, scale) {
    const m = turn.marks;
    const end = endOf(m);
    const outcome = turn.outcome || "running";
    const error = turn.error;
    const bar = el("div", { class: `bar ${outcome}`, title: barTitle(m) });
    const pct = (ms) => `${(100 * ms) / scale}%`;
    const accepted = m.accepted ?? (end ?? null);
    if (accepted !== null) bar.append(el("span", { class: "seg-wait", style: `left:0;width:${pct(accepted)}` }));
    if (m.accepted !== undefined) {
      const think = m.firstText ?? end ?? m.accepted;
      bar.append(el("span", { class: "seg-think", style: `left:${pct(m.accepted)};width:${pct(think - m.accepted)}` }));
      if (m.firstText !== undefined) {
        const stop = end ?? m.firstAudio ?? m.firstText;
        bar.append(el("span", { class: "seg-reply", style: `left:${pct(m.firstText)};width:${pct(Math.max(0, stop - m.firstText))}` }));
      }
    }
    if (m.firstAudio !== undefined) bar.append(el("span", { class: "mark-audio", style: `left:${pct(m.firstAudio)}` }));
    const card = turn.cardMode
      ? el("span", {}, el("span", { class: "tag", text: turn.cardMode }), " ", formatBytes(turn.cardBytes))
      : "—";
    const result = error
      ? el("span", { class: "tag failed", title: error.message, text: `${error.code} · ${error.engineCode}` })
      : el("span", { class: `tag ${outcome}`, text: outcome });
    return el(
      "tr", { "data-request": turn.requestId },
      el("td", {}, el("code", { text: turn.requestId.slice(0, 8), title: turn.requestId })),
      el("td", { text: turn.characterId || "—" }),
      el("td", { class: "stage-cell" }, stageCell(turn)),
      el("td", {}, turn.client ? el("code", { text: turn.client }) : el("span", { class: "muted", text: "api" })),
      el("td", {}, bar),
      el("td", { class: "num", text: formatMs(m.firstText) }),
      el("td", { class: "num", text: formatMs(m.firstAudio) }),
      el("td", { class: "num", text: formatMs(end) }),
      el("td", { class: "card-cell" }, card),
      el("td", { class: "prompt-cell" }, promptCell(turn.memory)),
      el("td", { class: "outcome-cell" }, result),
    );
  }

  renderErrors(errors) {
    $("errors-empty").hidden = errors.length > 0;
    $("errors").replaceChildren(...errors.map((e) => el(
      "li", {},
      el("span", { class: "when", text: new Date(e.time).toLocaleTimeString() }),
      el("span", { class: "tag error", text: e.code }),
      el("code", { text: e.engineCode }),
      el("span", { text: e.message }),
      e.retryable ? el("span", { class: "muted", text: "(retryable)" }) : null,
      e.requestId ? el("code", { class: "muted", text: e.requestId.slice(0, 8), title: e.requestId }) : null,
    )));
  }

  drawChart() {
    const canvas = this.chart;
    const status = this.status;
    if (!canvas || !status) return;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.width;
    const height = canvas.clientHeight || canvas.height;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    const now = this.serverNow();
    const start = now - CHART_SECONDS * 1000;
    const points = status.queueHistory; // [t, depth, limit, waiting]
    const top = Math.max(1, ...points.map((p) => Math.max(p[1], p[2], p[3]))) + 1;
    const left = 22, bottom = height - 16, plotW = width - left - 4, plotH = bottom - 6;
    const x = (t) => left + (plotW * (Math.max(t, start) - start)) / (now - start);
    const y = (v) => bottom - (plotH * v) / top;
    g.font = "10px system-ui, sans-serif";
    g.fillStyle = "#6a7787";
    g.strokeStyle = "#e1e6ec";
    g.lineWidth = 1;
    for (let v = 0; v <= top; v += Math.max(1, Math.ceil(top / 4))) {
      g.beginPath(); g.moveTo(left, y(v) + 0.5); g.lineTo(left + plotW, y(v) + 0.5); g.stroke();
      g.fillText(String(v), 4, y(v) + 3);
    }
    for (let m = 0; m <= 5; m++) {
      const label = m === 0 ? "now" : `-${m}m`;
      g.fillText(label, left + plotW - (plotW * m) / 5 - (m === 0 ? 18 : 8), height - 3);
    }
    const step = (index, color, fill, dashed) => {
      g.beginPath();
      let last = null;
      for (const p of points) {
        if (p[0] > now) break;
        if (last === null) { g.moveTo(x(p[0]), y(p[index])); } else { g.lineTo(x(p[0]), y(last)); g.lineTo(x(p[0]), y(p[index])); }
        last = p[index];
      }
      if (last === null) return;
      g.lineTo(x(now), y(last));
      g.setLineDash(dashed ? [4, 3] : []);
      g.strokeStyle = color;
      g.lineWidth = 2;
      g.stroke();
      g.setLineDash([]);
      if (fill) {
        g.lineTo(x(now), y(0));
        g.lineTo(x(points[0][0]), y(0));
        g.closePath();
        g.fillStyle = fill;
        g.fill();
      }
    };
    step(2, "#b42318", null, true);
    step(1, "#3b82f6", "rgba(59,130,246,.15)", false);
    step(3, "#f59e0b", "rgba(245,158,11,.15)", false);
  }
}

function endOf(marks) {
  return marks.completed ?? marks.cancelled ?? marks.failed;
}

function barTitle(m) {
  const parts = [];
  for (const [name, label] of [["accepted", "accepted"], ["firstText", "first text"], ["firstAudio", "first audio"], ["completed", "completed"], ["cancelled", "cancelled"], ["failed", "failed"]]) {
    if (m[name] !== undefined) parts.push(`${label} ${formatMs(m[name])}`);
  }
  return parts.join(" · ") || "waiting";
}

// What the model was given (the memory plugin's plan): tokens against
// RPEngine's limit, history kept and dropped; the parts in the tooltip.
function promptCell(memory) {
  if (!memory) return "—";
  if (memory.skipped) return el("span", { class: "muted", title: memory.skipped, text: "as sent" });
  const h = memory.history || {};
  const parts = (memory.blocks || []).map((b) => `${b.id} ${b.estimatedTokens}`);
  parts.push(`history ${h.estimatedTokens} (${h.kept} kept, ${h.dropped} dropped, ${h.summarized} summarized)`);
  if (memory.summaryTokens) parts.push(`summary ${memory.summaryTokens}`);
  if ((memory.lore || []).length) parts.push(`lore: ${memory.lore.join(", ")}`);
  if ((memory.loreLeft || []).length) parts.push(`lore left out: ${memory.loreLeft.join(", ")}`);
  // The character's attitude to the player, as the model was told it.
  const attitude = Object.entries(memory.attitude || {}).map(([axis, level]) => `${axis} ${level}`);
  if (attitude.length) parts.push(`attitude: ${attitude.join(", ")}`);
  return el("span", { title: parts.join("\n") },
    el("span", { class: "tag", text: `${memory.estimatedTokens}/${memory.limit}` }),
    ` ${h.kept} kept · ${h.dropped} dropped`,
    attitude.length ? el("span", { class: "tag attitude", text: attitude.join(" · ") }) : "");
}

// The playbook stage a turn ran in and the tools it called, if any.
function stageCell(turn) {
  const tools = (turn.tools || []).map((call) => el("span", {
    class: `tag tool ${call.outcome === "success" ? "completed" : call.outcome === "running" ? "running" : "failed"}`,
    title: call.error || `${call.runBy || ""} ${formatMs(call.durationMs)}`,
    text: call.name,
  }));
  const scene = turn.scene ? el("span", {
    class: "tag scene",
    title: `scene ${turn.scene.sceneId}: ${(turn.scene.cast || []).join(", ")}`,
    text: (turn.scene.speakers || []).join(" → ") || turn.scene.sceneId,
  }) : "";
  if (!turn.stage && !tools.length && !scene) return "—";
  return el("span", {}, scene, " ", turn.stage ? el("code", { text: turn.stage }) : "", " ", ...tools);
}
