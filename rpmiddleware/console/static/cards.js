// Character cards from files: Character Card V2 JSON, or a PNG character card
// (the card as base64 JSON in a tEXt chunk with the keyword "chara", as the
// character-card ecosystem ships them).  Only V2 is taken; other versions get
// an error that says which version they are.  The middleware checks every
// required field again when the card is sent: the page only finds the card.

export class CardError extends Error {}

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
// A card is text; anything this big is not one.
const MAX_CARD_FILE = 32 * 1024 * 1024;

export function isPng(bytes) {
  return bytes.length >= 8 && PNG_SIGNATURE.every((b, i) => bytes[i] === b);
}

// The tEXt chunks of a PNG, as a Map from keyword to the raw Latin-1 text.
export function pngTextChunks(bytes) {
  if (!isPng(bytes)) throw new CardError("not a PNG file (wrong signature)");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const found = new Map();
  let offset = 8;
  let sawEnd = false;
  while (offset + 8 <= bytes.length) {
    const length = view.getUint32(offset);
    const type = String.fromCharCode(...bytes.subarray(offset + 4, offset + 8));
    const start = offset + 8;
    const end = start + length;
    if (end + 4 > bytes.length) throw new CardError(`the PNG is truncated (in its ${type} chunk)`);
    if (type === "tEXt") {
      const data = bytes.subarray(start, end);
      const zero = data.indexOf(0);
      if (zero > 0) {
        const keyword = latin1(data.subarray(0, zero));
        if (!found.has(keyword)) found.set(keyword, latin1(data.subarray(zero + 1)));
      }
    }
    offset = end + 4; // past the CRC
    if (type === "IEND") { sawEnd = true; break; }
  }
  if (!sawEnd && found.size === 0) throw new CardError("the PNG is truncated (no IEND chunk)");
  return found;
}

function latin1(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return text;
}

function base64ToText(encoded, what) {
  let binary;
  try {
    binary = atob(encoded.replace(/\s+/g, ""));
  } catch (e) {
    throw new CardError(`${what} is not valid base64`);
  }
  const bytes = Uint8Array.from(binary, (c) => c.charCodeAt(0));
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch (e) {
    throw new CardError(`${what} is not UTF-8 text`);
  }
}

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new CardError(`${what} is not valid JSON (${e.message})`);
  }
}

// Refuse anything but a Character Card V2, naming what it is instead.
export function checkV2(card) {
  if (card === null || typeof card !== "object" || Array.isArray(card)) {
    throw new CardError("a character card is a JSON object");
  }
  const spec = card.spec;
  if (spec === "chara_card_v2") {
    if (card.spec_version !== "2.0") {
      throw new CardError(`a Character Card V2 with spec_version ${JSON.stringify(card.spec_version)}; only "2.0" is supported`);
    }
    if (card.data === null || typeof card.data !== "object" || Array.isArray(card.data)) {
      throw new CardError("this Character Card V2 has no data object");
    }
    return card;
  }
  if (spec === "chara_card_v3") {
    throw new CardError("this is a Character Card V3; only Character Card V2 is supported (export it as V2)");
  }
  if (spec === undefined && ("name" in card || "char_name" in card) && !("data" in card)) {
    throw new CardError("this is a V1 character card (no spec field); only Character Card V2 is supported");
  }
  throw new CardError(`not a Character Card V2 (spec is ${spec === undefined ? "missing" : JSON.stringify(spec)}); only Character Card V2 is supported`);
}

export function cardFromPng(bytes) {
  const chunks = pngTextChunks(bytes);
  if (!chunks.has("chara")) {
    if (chunks.has("ccv3")) {
      throw new CardError("this PNG holds only a Character Card V3 (ccv3 chunk); only Character Card V2 is supported");
    }
    throw new CardError("this PNG has no character card in it (no tEXt chunk named chara)");
  }
  const text = base64ToText(chunks.get("chara"), "the PNG's chara chunk");
  return checkV2(parseJson(text, "the PNG's chara chunk"));
}

export function cardFromJsonText(text) {
  return checkV2(parseJson(text, "the file"));
}

// Read a File from an <input type=file>: {card, source, bytes}.
export async function readCardFile(file) {
  if (file.size > MAX_CARD_FILE) throw new CardError(`the file is ${Math.round(file.size / 1048576)} MiB; a card file is far smaller`);
  const bytes = new Uint8Array(await file.arrayBuffer());
  if (isPng(bytes)) return { card: cardFromPng(bytes), source: "PNG", bytes: bytes.length };
  const looksJson = /^\s*[{[]/.test(new TextDecoder().decode(bytes.subarray(0, 64)));
  if (!looksJson) throw new CardError("not a character card: expected a JSON file or a PNG image");
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch (e) {
    throw new CardError("the file is not UTF-8 text");
  }
  return { card: cardFromJsonText(text), source: "JSON", bytes: bytes.length };
}

// A characterId for the card: its name as a slug.
export function characterIdFor(card) {
  const name = String(card?.data?.name ?? "").normalize("NFKD").toLowerCase();
  const slug = name.replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 48);
  return slug || "console-character";
}
