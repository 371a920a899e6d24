// The character's face: a mouth that follows the line's viseme marks, an
// expression that follows its feelings, and the subtitle with the spoken word
// highlighted, all read from the audio's own clock.
//
// What it is given is what any game gets: `speech-marks` messages ({turnId,
// speaker, marks: [{time, type: sentence|word|viseme, start, end, value,
// duration?, mouth?}]}, time in ms from the line's first audio sample, start
// and end in Unicode code points of the line's display text) and `feeling`
// messages ({turnId, speaker, feeling, intensity?, start, end}).  Where in a
// line the voice is comes from the player (SpeechPlayer.position), which knows
// when each chunk of PCM was scheduled on the AudioContext: so the face is in
// step with what is heard however the chunks arrived, and holds still when
// the AudioContext is suspended.

// Polly's visemes: how wide the lips are (0..1), how round, and how open the
// jaw is when a mark gives no `mouth` of its own.
const SHAPES = {
  sil: { wide: 0.55, round: 0.0, open: 0.0 },
  p: { wide: 0.5, round: 0.0, open: 0.0 },
  t: { wide: 0.6, round: 0.0, open: 0.25 },
  S: { wide: 0.45, round: 0.6, open: 0.3 },
  T: { wide: 0.6, round: 0.0, open: 0.2 },
  f: { wide: 0.6, round: 0.0, open: 0.1 },
  k: { wide: 0.6, round: 0.0, open: 0.35 },
  i: { wide: 0.85, round: 0.0, open: 0.3 },
  r: { wide: 0.45, round: 0.5, open: 0.3 },
  s: { wide: 0.75, round: 0.0, open: 0.15 },
  u: { wide: 0.3, round: 1.0, open: 0.35 },
  "@": { wide: 0.6, round: 0.2, open: 0.45 },
  a: { wide: 0.7, round: 0.1, open: 1.0 },
  e: { wide: 0.75, round: 0.0, open: 0.6 },
  E: { wide: 0.6, round: 0.3, open: 0.5 },
  o: { wide: 0.4, round: 0.9, open: 0.7 },
  O: { wide: 0.5, round: 0.7, open: 0.85 },
};

// Each feeling's face: brows (raise, inner tilt), eyes (open), mouth corners
// (smile: up > 0, down < 0), and a tint.
const EXPRESSIONS = {
  neutral: { brow: 0, tilt: 0, eyes: 1, smile: 0, tint: "#f2d2b6" },
  joy: { brow: 2, tilt: 0, eyes: 0.8, smile: 1, tint: "#f6d3b3" },
  sadness: { brow: 1, tilt: 6, eyes: 0.75, smile: -0.8, tint: "#e6d3c6" },
  anger: { brow: -5, tilt: -7, eyes: 0.85, smile: -0.5, tint: "#f2b9a4" },
  fear: { brow: 6, tilt: 5, eyes: 1.35, smile: -0.4, tint: "#ecdcd0" },
  disgust: { brow: -3, tilt: -3, eyes: 0.7, smile: -0.6, tint: "#dcd6b0" },
  surprise: { brow: 8, tilt: 0, eyes: 1.45, smile: 0, tint: "#f4d6bb" },
};

const SVG = "http://www.w3.org/2000/svg";

function el(name, attributes = {}) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  return node;
}

// Code points of `text` from `start` to `end` (JavaScript indexes UTF-16).
export function codePoints(text, start, end) {
  return Array.from(text).slice(start, end).join("");
}

// The mouth's outline for a shape: width, openness and roundness, with the
// corners lifted by `smile`.
export function mouthPath(wide, open, round, smile) {
  // A quadratic curve reaches half way to its control point: the controls
  // sit twice as far as the lips should go.
  const half = 10 + 16 * wide * (1 - 0.35 * round);
  const drop = 2 + 30 * open;
  const lift = 5 * smile;
  const cx = 60;
  const cy = 84;
  const left = cx - half;
  const right = cx + half;
  const upper = cy - 2 - 6 * open - 6 * round;
  const lower = cy + drop;
  return (
    `M ${left} ${cy - lift} ` +
    `Q ${cx} ${upper - lift * 0.2} ${right} ${cy - lift} ` +
    `Q ${cx} ${lower + lift * 0.6} ${left} ${cy - lift} Z`
  );
}

// What marks say at `ms` into a line: the sentence, the word highlighted
// (the last word mark whose time has come within that sentence) and the
// viseme (the one whose [time, time + duration) holds `ms`, else sil).
export function marksAt(marks, ms) {
  let sentence = null;
  for (const mark of marks) {
    if (mark.type === "sentence" && mark.time <= ms) sentence = mark;
  }
  let word = null;
  let viseme = null;
  for (const mark of marks) {
    if (mark.time > ms) continue;
    if (mark.type === "word") {
      if (!sentence || sentence.start === undefined || mark.start >= sentence.start) word = mark;
    } else if (mark.type === "viseme") {
      const end = mark.time + (mark.duration ?? 0);
      if (ms < end) viseme = mark;
    }
  }
  if (word && sentence && sentence.end !== undefined && word.start >= sentence.end) word = null;
  return { sentence, word, viseme };
}

export class Face {
  // root: the element to draw in; player: the SpeechPlayer whose clock it follows.
  constructor(root, player) {
    this.root = root;
    this.player = player;
    this.turns = new Map(); // turnId -> [{speaker, marks: [], feelings: []}]
    this.state = null; // what was drawn last (for tests and the curious)
    // For a line without viseme marks (no speech-marks plugin in the chain):
    // the jaw follows how loud the voice is now.
    this.analyser = player.context.createAnalyser();
    this.analyser.fftSize = 1024;
    player.gain.connect(this.analyser);
    this._samples = new Float32Array(this.analyser.fftSize);
    this._build();
    this._frame = this._frame.bind(this);
    requestAnimationFrame(this._frame);
  }

  _build() {
    const svg = el("svg", { viewBox: "0 0 120 120", class: "face-svg", role: "img" });
    svg.append(el("ellipse", { cx: 60, cy: 62, rx: 44, ry: 52, class: "face-skin" }));
    this.skin = svg.lastChild;
    const eyes = el("g", { class: "face-eyes" });
    this.eyes = [38, 82].map((x) => {
      const eye = el("ellipse", { cx: x, cy: 52, rx: 6, ry: 6, class: "face-eye" });
      eyes.append(eye);
      return eye;
    });
    this.brows = [38, 82].map((x, i) => {
      const brow = el("line", { x1: x - 9, x2: x + 9, y1: 38, y2: 38, class: "face-brow" });
      brow.dataset.side = i === 0 ? "left" : "right";
      eyes.append(brow);
      return brow;
    });
    svg.append(eyes);
    this.mouth = el("path", { class: "face-mouth", d: mouthPath(0.55, 0, 0, 0) });
    this.mouth.dataset.viseme = "sil";
    svg.append(this.mouth);
    this.svg = svg;
    this.label = document.createElement("div");
    this.label.className = "face-feeling";
    this.subtitle = document.createElement("p");
    this.subtitle.className = "face-subtitle";
    this.root.replaceChildren(svg, this.label, this.subtitle);
    this._shown = { sentence: null, words: [] };
    this._expression("neutral", 0);
  }

  _line(turnId, speaker) {
    let lines = this.turns.get(turnId);
    if (!lines) {
      lines = [];
      this.turns.set(turnId, lines);
      if (this.turns.size > 20) this.turns.delete(this.turns.keys().next().value);
    }
    const id = speaker && speaker.characterId;
    const last = lines[lines.length - 1];
    if (last && (!id || !last.speaker || last.speaker === id)) {
      if (id) last.speaker = id;
      return last;
    }
    const line = { speaker: id || null, marks: [], feelings: [] };
    lines.push(line);
    return line;
  }

  // A speech-marks message.
  marks(message) {
    const line = this._line(message.turnId, message.speaker);
    for (const mark of message.marks || []) line.marks.push(mark);
    line.marks.sort((a, b) => a.time - b.time);
  }

  // A feeling message.
  feeling(message) {
    this._line(message.turnId, message.speaker).feelings.push(message);
  }

  // What the face shows at the player's present moment (or null).
  stateNow() {
    const at = this.player.position();
    if (!at) return null;
    const lines = this.turns.get(at.turnId);
    const line = lines ? lines[Math.min(at.line, lines.length - 1)] : null;
    const ms = at.seconds * 1000;
    const found = line ? marksAt(line.marks, ms) : { sentence: null, word: null, viseme: null };
    let feeling = null;
    if (line) {
      const where = found.word ? found.word.start : found.sentence ? found.sentence.start : null;
      for (const f of line.feelings) {
        if (where === null ? feeling === null : f.start <= where) feeling = f;
      }
    }
    const visemes = Boolean(line && line.marks.some((m) => m.type === "viseme"));
    return { turnId: at.turnId, line: at.line, ms, ...found, feeling, visemes };
  }

  // How open the jaw is for the sound playing now, 0..1, from its loudness.
  loudness() {
    this.analyser.getFloatTimeDomainData(this._samples);
    let sum = 0;
    for (const x of this._samples) sum += x * x;
    return Math.min(1, 6 * Math.sqrt(sum / this._samples.length));
  }

  _frame() {
    try {
      this.render(this.stateNow());
    } finally {
      requestAnimationFrame(this._frame);
    }
  }

  render(state) {
    this.state = state;
    // Without viseme marks the mouth opens with the voice's loudness ("level").
    const byLevel = Boolean(state && !state.visemes);
    const viseme = byLevel ? "level" : state && state.viseme ? state.viseme.value : "sil";
    const shape = SHAPES[viseme] || SHAPES["@"];
    let open = state && state.viseme && typeof state.viseme.mouth === "number" ? state.viseme.mouth : shape.open;
    if (byLevel) open = this.loudness();
    const name = state && state.feeling ? state.feeling.feeling : "neutral";
    const intensity = state && state.feeling ? state.feeling.intensity ?? 0.7 : 0;
    const face = EXPRESSIONS[name] || EXPRESSIONS.neutral;
    this._expression(name, intensity);
    this.mouth.setAttribute("d", mouthPath(shape.wide, open, shape.round, face.smile * (0.4 + 0.6 * intensity)));
    this.mouth.dataset.viseme = viseme;
    this.mouth.dataset.open = open.toFixed(3);
    this._subtitle(state);
  }

  _expression(name, intensity) {
    if (this.svg.dataset.feeling === name && this._intensity === intensity) return;
    this._intensity = intensity;
    const face = EXPRESSIONS[name] || EXPRESSIONS.neutral;
    const k = name === "neutral" ? 0 : 0.4 + 0.6 * intensity;
    this.svg.dataset.feeling = name;
    this.skin.setAttribute("fill", face.tint);
    this.eyes.forEach((eye) => eye.setAttribute("ry", String(6 * (1 + (face.eyes - 1) * k))));
    this.brows.forEach((brow, i) => {
      // tilt > 0 raises the inner ends (sadness, fear), < 0 lowers them (anger).
      const base = 38 - face.brow * k;
      const inner = String(base - face.tilt * k * 0.5);
      const outer = String(base + face.tilt * k * 0.5);
      brow.setAttribute("y1", i === 0 ? outer : inner);
      brow.setAttribute("y2", i === 0 ? inner : outer);
    });
    this.label.textContent = name === "neutral" ? "" : `${name}${intensity ? ` ${Math.round(intensity * 100)}%` : ""}`;
  }

  _subtitle(state) {
    const sentence = state ? state.sentence : null;
    if (sentence !== this._shown.sentence) {
      this._shown = { sentence, words: [] };
      this.subtitle.replaceChildren();
      if (sentence && typeof sentence.value === "string") {
        // Words as spans, by the word marks of this sentence (code points).
        const lines = this.turns.get(state.turnId) || [];
        const line = lines[Math.min(state.line, lines.length - 1)];
        const words = line ? line.marks.filter((m) => m.type === "word" && m.start >= sentence.start && m.end <= sentence.end) : [];
        let at = sentence.start;
        for (const word of words) {
          if (word.start > at) this.subtitle.append(codePoints(sentence.value, at - sentence.start, word.start - sentence.start));
          const span = document.createElement("span");
          span.className = "word";
          span.dataset.start = word.start;
          span.dataset.end = word.end;
          span.textContent = codePoints(sentence.value, word.start - sentence.start, word.end - sentence.start);
          this.subtitle.append(span);
          this._shown.words.push(span);
          at = Math.max(at, word.end);
        }
        this.subtitle.append(codePoints(sentence.value, at - sentence.start));
      }
    }
    const current = state && state.word ? String(state.word.start) : null;
    for (const span of this._shown.words) span.classList.toggle("spoken", span.dataset.start === current);
  }
}
