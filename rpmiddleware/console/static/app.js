// The console page: a client of /client/socket like any game.  It subscribes
// to the `status` extension for what it shows, and tries a character with
// ordinary `character`, `text`, `audio` and `cancel` messages.

import { ConsoleSocket } from "./socket.js";
import { StatusView, formatBytes } from "./status.js";
import { CardError, characterIdFor, readCardFile, checkV2 } from "./cards.js";
import { SpeechPlayer } from "./player.js";
import { HoldToTalk } from "./mic.js";
import { Face } from "./face.js";

const $ = (id) => document.getElementById(id);

const audioContext = new AudioContext();
const player = new SpeechPlayer(audioContext);
const face = new Face(document.getElementById("face"), player);
const view = new StatusView();
const conversation = $("conversation");
const bubbles = new Map(); // turnId -> {player, character}
const cancelledTurns = new Set();

// What tests (and the curious, from the devtools console) can read.
const state = {
  ready: null,
  status: null,
  messages: [],
  card: null,          // {characterId, name, source, bytes} once the middleware took it
  cardError: null,
  replies: new Map(),  // turnId -> {text, done, outcome, speech}
  player,
  audioContext,
  face,
  // The page's own message path, as /client/socket's messages take it.
  receive: (message) => received(message),
};
window.rpConsole = state;

const socket = new ConsoleSocket(`ws://${location.host}/client/socket`, {
  onState: (s) => {
    const pill = $("socket-state");
    pill.textContent = s === "open" ? "live" : s === "connecting" ? "connecting…" : "disconnected — retrying";
    pill.className = `pill ${s === "open" ? "pill-on" : "pill-off"}`;
  },
  onOpen: (ready) => {
    state.ready = ready;
    socket.send({
      type: "configure",
      output: { modalities: ["text", "audio"], sampleRate: Math.round(audioContext.sampleRate), streaming: true },
      player: { displayName: "Console" },
      // For the face: marks (when the speech-marks plugin is in the chain) and feelings.
      speechMarks: ["sentence", "word", "viseme"],
      feelings: "text",
    });
    socket.send({ type: "status", subscribe: true });
  },
  onMessage: received,
});

function received(message) {
  state.messages.push(message.type);
  if (state.messages.length > 500) state.messages.splice(0, 100);
  const handler = HANDLERS[message.type];
  if (handler) handler(message);
}

// Waiting for the middleware to answer a `character` message: it says nothing
// when it takes a card, so a `ping` follows it, and the `pong` (messages are
// handled in order) means the card was taken unless an error came first.
let pendingCard = null;

const HANDLERS = {
  status: (m) => { state.status = m; view.render(m); },
  pong: (m) => {
    if (pendingCard && m.timestamp === pendingCard.token) {
      const card = pendingCard;
      pendingCard = null;
      state.card = card;
      state.cardError = null;
      showCard(`Playing ${card.name} (${card.characterId}) from a ${card.source} card, ${formatBytes(card.bytes)}.`);
      notice(`${card.name} is ready. Say something.`);
    }
  },
  transcript: (m) => {
    const entry = turnEntry(m.turnId);
    if (!entry.player) {
      const pending = conversation.querySelector(".bubble.player.pending");
      if (pending) pending.remove();
      entry.player = bubble("player", "You", m.text);
    } else {
      entry.player.querySelector(".text").textContent = m.text;
    }
  },
  "llm-chunk": (m) => {
    if (cancelledTurns.has(m.turnId)) return;
    const reply = replyOf(m.turnId);
    if (m.done) return;
    reply.text += m.content;
    characterBubble(m.turnId).querySelector(".text").textContent = reply.text;
    scrollDown();
  },
  llm: (m) => {
    if (cancelledTurns.has(m.turnId)) return;
    const reply = replyOf(m.turnId);
    reply.text = m.text;
    const b = characterBubble(m.turnId);
    b.querySelector(".text").textContent = m.text;
  },
  "tts-start": (m) => { if (!cancelledTurns.has(m.turnId)) player.start(m.turnId); },
  "speech-marks": (m) => { if (!cancelledTurns.has(m.turnId)) face.marks(m); },
  feeling: (m) => { if (!cancelledTurns.has(m.turnId)) face.feeling(m); },
  "tts-chunk": (m) => {
    if (cancelledTurns.has(m.turnId) || m.format !== "pcm") return;
    player.chunk(m.turnId, m.data, m.sampleRate);
  },
  "reply-complete": (m) => {
    const reply = replyOf(m.turnId);
    reply.done = true;
    reply.outcome = "completed";
    reply.speech = m.speech || null;
    const b = characterBubble(m.turnId);
    b.classList.remove("streaming");
    const seconds = m.speech ? (m.speech.samples / m.speech.sampleRate).toFixed(2) : null;
    meta(b, seconds ? `${seconds} s of speech` : "text only");
  },
  "tts-cancelled": (m) => {
    if (!m.turnId) { notice(m.reason || "A waiting turn was dropped."); return; }
    cancelledTurns.add(m.turnId);
    player.stop(m.turnId);
    const reply = replyOf(m.turnId);
    reply.done = true;
    reply.outcome = "cancelled";
    const entry = bubbles.get(m.turnId);
    if (entry && entry.character) {
      entry.character.classList.remove("streaming");
      entry.character.classList.add("cancelled");
      meta(entry.character, m.reason ? `cancelled: ${m.reason}` : "cancelled");
    } else {
      notice(m.reason ? `Turn cancelled: ${m.reason}` : "Turn cancelled.");
    }
  },
  error: (m) => {
    if (pendingCard && /^character/.test(m.message)) {
      pendingCard = null;
      showCardError(`The middleware refused the card: ${m.message}`);
      return;
    }
    if (m.turnId) {
      const reply = replyOf(m.turnId);
      reply.outcome = "failed";
      const entry = bubbles.get(m.turnId);
      if (entry && entry.character) entry.character.classList.remove("streaming");
    }
    const pending = conversation.querySelector(".bubble.player.pending");
    if (pending) pending.remove();
    const text = `${m.code}${m.engineCode ? ` (${m.engineCode})` : ""}: ${m.message}`;
    bubble("failure", null, text);
  },
  capacity: (m) => {
    if (m.message && !m.engineConnected) $("audio-state").textContent = m.message;
    else if (m.engineConnected) $("audio-state").textContent = "";
  },
  // A character's attitude to the player changed level (the memory plugin).
  "memory-event": (m) => {
    if (m.event !== "attitude") return;
    state.attitude = m.attitude;
    const moved = (m.changes || []).map((c) => `${c.axis} ${c.from} → ${c.to} (${c.value})`);
    notice(`${m.characterId}'s attitude to you: ${moved.join(", ")}, by ${m.source}.`);
  },
};

// The conversation.

function clearHint() {
  const hint = conversation.querySelector(".hint");
  if (hint) hint.remove();
}

function scrollDown() { conversation.scrollTop = conversation.scrollHeight; }

function bubble(kind, who, text) {
  clearHint();
  const node = document.createElement("div");
  node.className = `bubble ${kind}`;
  if (who) {
    const label = document.createElement("span");
    label.className = "who";
    label.textContent = who;
    node.append(label);
  }
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  node.append(body);
  conversation.append(node);
  scrollDown();
  return node;
}

function notice(text) { return bubble("notice", null, text); }

function meta(node, text) {
  let line = node.querySelector(".meta");
  if (!line) {
    line = document.createElement("span");
    line.className = "meta";
    node.append(line);
  }
  line.textContent = text;
}

function turnEntry(turnId) {
  let entry = bubbles.get(turnId);
  if (!entry) { entry = { player: null, character: null }; bubbles.set(turnId, entry); }
  return entry;
}

function replyOf(turnId) {
  let reply = state.replies.get(turnId);
  if (!reply) { reply = { text: "", done: false, outcome: null, speech: null }; state.replies.set(turnId, reply); }
  return reply;
}

function characterBubble(turnId) {
  const entry = turnEntry(turnId);
  if (!entry.character) {
    const name = state.card ? state.card.name : "Character";
    entry.character = bubble("character streaming", name, "");
    entry.character.dataset.turn = turnId;
  }
  return entry.character;
}

// Cards.

function showCard(text) {
  $("card-state").textContent = text;
  $("card-error").hidden = true;
}

function showCardError(text) {
  state.cardError = text;
  const box = $("card-error");
  box.textContent = text;
  box.hidden = false;
}

function sendCard(card, source, bytes) {
  const characterId = characterIdFor(card);
  const token = Date.now() + Math.random();
  pendingCard = { characterId, name: card.data.name || characterId, source, bytes, token };
  state.cardError = null;
  $("card-error").hidden = true;
  $("card-state").textContent = `Sending ${pendingCard.name}…`;
  if (!socket.send({ type: "character", characterId, card })) {
    pendingCard = null;
    showCardError("Not connected to the middleware; try again in a moment.");
    return;
  }
  socket.send({ type: "ping", timestamp: token });
}

$("card-file").addEventListener("change", async (event) => {
  const file = event.target.files[0];
  event.target.value = "";
  if (!file) return;
  try {
    const { card, source, bytes } = await readCardFile(file);
    sendCard(card, source, bytes);
  } catch (e) {
    const why = e instanceof CardError ? e.message : `could not read it (${e.message || e})`;
    showCardError(`${file.name}: ${why}`);
  }
});

$("card-example").addEventListener("click", async () => {
  try {
    const response = await fetch("/console/example-card.json");
    const text = await response.text();
    sendCard(checkV2(JSON.parse(text)), "JSON", text.length);
  } catch (e) {
    showCardError(`The example card could not be loaded: ${e.message || e}`);
  }
});

// Turns.

function wakeAudio() {
  if (audioContext.state !== "running") audioContext.resume();
}

function interruptSpeech() {
  // A new turn barges in: what is still playing of the last one stops.
  if (player.turnId) player.stop(player.turnId);
}

$("say-form").addEventListener("submit", (event) => {
  event.preventDefault();
  wakeAudio();
  const input = $("say-text");
  const text = input.value.trim();
  if (!text) return;
  interruptSpeech();
  if (socket.send({ type: "text", text })) input.value = "";
});

$("cancel").addEventListener("click", () => {
  socket.send({ type: "cancel" });
  if (player.turnId) player.stop(player.turnId);
});

new HoldToTalk($("talk"), {
  onStart: () => { wakeAudio(); interruptSpeech(); },
  onState: (text) => { $("mic-state").textContent = text; },
  onError: (text) => { $("mic-state").textContent = text; bubble("failure", null, text); },
  onRecorded: (dataUri, seconds) => {
    $("mic-state").textContent = `Sent ${seconds.toFixed(1)} s of speech.`;
    const pending = bubble("player pending", "You", `(${seconds.toFixed(1)} s of speech…)`);
    pending.dataset.seconds = seconds.toFixed(2);
    socket.send({ type: "audio", data: dataUri });
  },
});

player.onChange = () => {
  const remaining = player.remaining;
  $("audio-state").textContent = player.playing ? `Speaking… ${remaining.toFixed(1)} s queued` : "";
};

document.addEventListener("pointerdown", wakeAudio, { once: true });

socket.connect();
