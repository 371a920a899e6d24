// Speech out: tts-chunk messages (base64 mono 16-bit little-endian PCM) played
// through WebAudio, each chunk scheduled to start exactly where the previous
// one ends, so a reply plays without gaps or clicks however its chunks were
// cut.  A small lead absorbs network jitter; if chunks still arrive late the
// player starts again from "now plus the lead" and counts an underrun.
//
// Each chunk's place is kept (when it starts on the AudioContext's clock, and
// which samples of its line it holds), so position() can say where in which
// line the voice is at any moment: the face (face.js) reads speech marks,
// timed from a line's first sample, against it.

export const LEAD_SECONDS = 0.3;

export function decodePcm16(base64) {
  const binary = atob(base64);
  const count = binary.length >> 1;
  const samples = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    let value = binary.charCodeAt(2 * i) | (binary.charCodeAt(2 * i + 1) << 8);
    if (value >= 0x8000) value -= 0x10000;
    samples[i] = value / 32768;
  }
  return samples;
}

export class SpeechPlayer {
  constructor(context, lead = LEAD_SECONDS) {
    this.context = context;
    this.lead = lead;
    this.gain = context.createGain();
    this.gain.connect(context.destination);
    this.nextTime = 0;
    this.sources = new Set();
    this.turnId = null;
    this.turns = new Map(); // turnId -> {chunks, samples, seconds, underruns, stopped}
    this.onChange = () => {};
  }

  _turn(turnId) {
    let stats = this.turns.get(turnId);
    if (!stats) {
      stats = {
        chunks: 0, samples: 0, seconds: 0, underruns: 0, stopped: false, sampleRate: 0,
        // Each line's chunks: [{when, first (sample of the line), count, rate}].
        lines: [], lineOpen: true,
      };
      this.turns.set(turnId, stats);
      if (this.turns.size > 50) this.turns.delete(this.turns.keys().next().value);
    }
    return stats;
  }

  // A new reply's speech begins.
  start(turnId) {
    this.turnId = turnId;
    this._turn(turnId).lineOpen = true;
  }

  // One tts-chunk: schedule it right after what is already scheduled.
  chunk(turnId, base64, sampleRate) {
    const stats = this._turn(turnId);
    if (stats.stopped) return;
    this.turnId = turnId;
    const samples = decodePcm16(base64);
    if (samples.length === 0) return;
    const buffer = this.context.createBuffer(1, samples.length, sampleRate);
    buffer.copyToChannel(samples, 0);
    const now = this.context.currentTime;
    if (this.nextTime < now + 0.02) {
      if (stats.chunks > 0) stats.underruns += 1;
      this.nextTime = now + this.lead;
    }
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.gain);
    source.onended = () => { this.sources.delete(source); this.onChange(); };
    source.start(this.nextTime);
    this.sources.add(source);
    if (stats.lineOpen || stats.lines.length === 0) {
      stats.lines.push({ chunks: [], samples: 0 });
      stats.lineOpen = false;
    }
    const line = stats.lines[stats.lines.length - 1];
    line.chunks.push({ when: this.nextTime, first: line.samples, count: samples.length, rate: sampleRate });
    line.samples += samples.length;
    if (line.chunks.length > 4000) line.chunks.splice(0, 1000);
    this.nextTime += buffer.duration;
    stats.chunks += 1;
    stats.samples += samples.length;
    stats.sampleRate = sampleRate;
    stats.seconds += buffer.duration;
    this.onChange();
  }

  // Stop everything scheduled (cancel, barge-in); later chunks of that turn are ignored.
  stop(turnId = this.turnId) {
    if (turnId) this._turn(turnId).stopped = true;
    for (const source of this.sources) {
      try { source.stop(); } catch (e) { /* not started yet in some engines */ }
    }
    this.sources.clear();
    this.nextTime = 0;
    this.onChange();
  }

  // Where the voice is now (or at `time` on the AudioContext's clock): the
  // turn, its line (0 for the first tts-start's), and the seconds from that
  // line's first sample; null when nothing of a kept turn sounds.  In a gap
  // (an underrun) it stays at the end of the chunk before.
  position(time = this.context.currentTime) {
    let found = null;
    for (const [turnId, stats] of this.turns) {
      if (stats.stopped) continue;
      stats.lines.forEach((line, index) => {
        const last = line.chunks[line.chunks.length - 1];
        // A line long over (most of the kept ones) is not walked.
        if (!last || last.when + last.count / last.rate < time - 0.05) return;
        for (const chunk of line.chunks) {
          if (chunk.when > time) break;
          const into = Math.min(chunk.count, (time - chunk.when) * chunk.rate);
          const end = chunk.when + chunk.count / chunk.rate;
          const candidate = { turnId, line: index, seconds: (chunk.first + into) / chunk.rate, end, when: chunk.when };
          if (!found || chunk.when >= found.when) found = candidate;
        }
      });
    }
    if (!found) return null;
    // Past the end of the last chunk heard: the line is over.
    const line = this.turns.get(found.turnId).lines[found.line];
    const last = line.chunks[line.chunks.length - 1];
    if (time > last.when + last.count / last.rate + 0.05 && found.end <= time) return null;
    return { turnId: found.turnId, line: found.line, seconds: found.seconds };
  }

  // Seconds of speech scheduled and not yet played.
  get remaining() {
    return Math.max(0, this.nextTime - this.context.currentTime);
  }

  get playing() {
    return this.sources.size > 0;
  }
}
