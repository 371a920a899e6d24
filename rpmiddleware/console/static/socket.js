// The page's connection to /client/socket: JSON messages in and out, and
// coming back after a drop (with `reconnect`, so the character and history
// of the session survive a restart of the page's socket).

export class ConsoleSocket {
  constructor(url, { onMessage, onState, onOpen }) {
    this.url = url;
    this.onMessage = onMessage;
    this.onState = onState;
    this.onOpen = onOpen;
    this.ws = null;
    this.sessionId = null;
    this.delay = 500;
    this.closedByUs = false;
  }

  connect() {
    this.onState("connecting");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.onopen = () => {
      this.delay = 500;
      this.onState("open");
    };
    ws.onmessage = (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      if (message.type === "ready") {
        const previous = this.sessionId;
        this.sessionId = message.id;
        if (previous && previous !== message.id) this.send({ type: "reconnect", sessionId: previous });
        this.onOpen(message, Boolean(previous));
      } else if (message.type === "reconnect-ack" && message.success) {
        this.sessionId = message.sessionId;
      }
      this.onMessage(message);
    };
    ws.onclose = (event) => {
      this.onState("closed", event.code);
      if (this.closedByUs) return;
      setTimeout(() => this.connect(), this.delay);
      this.delay = Math.min(this.delay * 2, 8000);
    };
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  send(message) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }
}
