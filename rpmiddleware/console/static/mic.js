// Hold to talk: record the browser's microphone with MediaRecorder (WebM/Opus)
// while the button is held, then hand the recording over as a data: URI,
// which the client protocol's `audio` message accepts as it is.

export const MAX_SECONDS = 30;
export const MIN_SECONDS = 0.3;

function pickType() {
  for (const type of ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm"]) {
    if (window.MediaRecorder && MediaRecorder.isTypeSupported(type)) return type;
  }
  return "";
}

function asDataUri(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

export class HoldToTalk {
  // onRecorded(dataUri, seconds, mimeType); onState(text); onError(text)
  constructor(button, { onRecorded, onState, onError, onStart }) {
    this.button = button;
    this.onRecorded = onRecorded;
    this.onState = onState;
    this.onError = onError;
    this.onStart = onStart || (() => {});
    this.stream = null;
    this.recorder = null;
    this.holding = false;
    this.startedAt = 0;
    this.limit = null;
    const down = (event) => { event.preventDefault(); this.press(); };
    const up = (event) => { event.preventDefault(); this.release(); };
    button.addEventListener("pointerdown", down);
    button.addEventListener("pointerup", up);
    button.addEventListener("pointerleave", () => { if (this.holding) this.release(); });
    button.addEventListener("pointercancel", () => { if (this.holding) this.release(); });
    button.addEventListener("keydown", (event) => {
      if ((event.key === " " || event.key === "Enter") && !event.repeat) { event.preventDefault(); this.press(); }
    });
    button.addEventListener("keyup", (event) => {
      if (event.key === " " || event.key === "Enter") { event.preventDefault(); this.release(); }
    });
  }

  async press() {
    if (this.holding) return;
    this.holding = true;
    this.onStart();
    if (!navigator.mediaDevices || !window.MediaRecorder) {
      this.holding = false;
      this.onError("this browser cannot record audio (no MediaRecorder)");
      return;
    }
    try {
      if (!this.stream) {
        this.stream = await navigator.mediaDevices.getUserMedia({
          audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
        });
      }
    } catch (e) {
      this.holding = false;
      this.onError(`no microphone: ${e.message || e.name}`);
      return;
    }
    if (!this.holding) return; // released while permission was asked
    const mimeType = pickType();
    const chunks = [];
    const recorder = new MediaRecorder(this.stream, mimeType ? { mimeType } : undefined);
    this.recorder = recorder;
    recorder.ondataavailable = (event) => { if (event.data && event.data.size) chunks.push(event.data); };
    recorder.onstop = async () => {
      const seconds = (performance.now() - this.startedAt) / 1000;
      this.button.classList.remove("recording");
      if (seconds < MIN_SECONDS) {
        this.onState("Hold the button while you speak.");
        return;
      }
      const blob = new Blob(chunks, { type: recorder.mimeType || mimeType || "audio/webm" });
      try {
        this.onRecorded(await asDataUri(blob), seconds, blob.type);
      } catch (e) {
        this.onError(`could not read the recording: ${e.message || e}`);
      }
    };
    recorder.start(250);
    this.startedAt = performance.now();
    this.button.classList.add("recording");
    this.onState("Recording… release to send.");
    this.limit = setTimeout(() => this.release(), MAX_SECONDS * 1000);
  }

  release() {
    if (!this.holding) return;
    this.holding = false;
    clearTimeout(this.limit);
    if (this.recorder && this.recorder.state !== "inactive") this.recorder.stop();
    this.recorder = null;
  }
}
