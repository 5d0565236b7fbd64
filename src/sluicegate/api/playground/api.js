// The one place the page talks to the server: the key (sessionStorage only), every request, and an
// `exchange` event per request for the inspector (what was sent, what came back, headers included).
const KEY = "sluicegate.key";
export const bus = new EventTarget();

export const key = () => sessionStorage.getItem(KEY) || "";
export function setKey(value) {
  if (value) sessionStorage.setItem(KEY, value); else sessionStorage.removeItem(KEY);
}

function headersFor(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const k = key();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

export function headerList(res) {
  return [...res.headers.entries()].map(([k, v]) => `${k}: ${v}`).join("\n");
}

// The error envelope of a refusal, or null when the body is not one.
export function envelopeOf(text) {
  try {
    const body = JSON.parse(text);
    return body && typeof body.error === "object" && body.error ? body.error : null;
  } catch { return null; }
}

export class Refused extends Error {
  constructor(status, error, retryAfter = null) {
    super(error ? error.message : `HTTP ${status}`);
    this.status = status;
    this.error = error;
    this.retryAfter = retryAfter; // the Retry-After header, seconds, when the server sent one
  }
}

function announce(detail) { bus.dispatchEvent(new CustomEvent("exchange", { detail })); }

// A JSON (or multipart) request; resolves to the parsed body, throws Refused with the envelope.
export async function call(method, path, body, { record = false, raw = false } = {}) {
  const multipart = body instanceof FormData;
  const init = { method, headers: headersFor(body !== undefined && !multipart) };
  if (body !== undefined) init.body = multipart ? body : JSON.stringify(body);
  const res = await fetch(path, init);
  const text = await res.text();
  if (record) announce({ method, path, body, status: res.status, headers: headerList(res), text });
  if (!res.ok) throw new Refused(res.status, envelopeOf(text), res.headers.get("retry-after"));
  return raw ? { text, res } : (text ? JSON.parse(text) : null);
}

// A streamed POST: calls onEvent(data) per SSE `data:` line (JSON parsed; "[DONE]" as is), records every event.
export async function stream(path, body, { signal, onOpen, onEvent }) {
  const res = await fetch(path, { method: "POST", headers: headersFor(true), body: JSON.stringify(body), signal });
  const detail = { method: "POST", path, body, status: res.status, headers: headerList(res), text: "" };
  onOpen(res);
  if (!res.ok || !(res.headers.get("content-type") || "").startsWith("text/event-stream")) {
    detail.text = await res.text();
    announce(detail);
    if (!res.ok) throw new Refused(res.status, envelopeOf(detail.text));
    return detail;
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let event = "message";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line) detail.text += line + "\n";
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) {
          const data = line.slice(5).trim();
          const parsed = data === "[DONE]" ? data : JSON.parse(data);
          if (event === "error") { announce(detail); throw new Refused(res.status, parsed.error || null); }
          onEvent(parsed);
        } else if (!line) event = "message";
      }
    }
  } finally {
    announce(detail);
  }
  return detail;
}
