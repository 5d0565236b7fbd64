// Live plots from /metrics (Prometheus text): scraped every 2 s, the last 5 minutes kept, drawn on canvases by
// hand. Latency percentiles come from the histograms' bucket counts over the last 30 s (as Prometheus'
// histogram_quantile over a rate would); tokens/s from the generated-tokens counter between scrapes.
import { call, Refused } from "./api.js";

const $ = (id) => document.getElementById(id);
const EVERY_MS = 2000, KEEP_S = 300, WINDOW_S = 30;
const samples = []; // {t, m: Map(series -> value)}
const points = []; // {t, ttft50, ttft95, itl50, itl95, tps, waiting, shed, expired}
let timer = null;
let stopped = false;

// One entry per series, labels other than model_name kept; the same series of several models summed.
export function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/);
    if (!match) continue;
    const labels = [...(match[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)]
      .filter((l) => l[1] !== "model_name").map((l) => `${l[1]}="${l[2]}"`).sort();
    const k = labels.length ? `${match[1]}{${labels.join(",")}}` : match[1];
    m.set(k, (m.get(k) || 0) + Number(match[4]));
  }
  return m;
}

function buckets(m, name) {
  const out = [];
  for (const [k, v] of m) {
    const b = k.match(new RegExp(`^${name}_bucket\\{le="([^"]+)"\\}$`));
    if (b) out.push([b[1] === "+Inf" ? Infinity : Number(b[1]), v]);
  }
  return out.sort((a, b) => a[0] - b[0]);
}

// The q-quantile of the observations between two scrapes, interpolated inside its bucket; null when none.
export function quantile(q, now, then, name) {
  const a = buckets(now, name), b = new Map(buckets(then, name));
  const d = a.map(([le, c]) => [le, c - (b.get(le) || 0)]);
  const total = d.length ? d[d.length - 1][1] : 0;
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0, prevC = 0;
  for (const [le, c] of d) {
    if (c >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + ((le - prevLe) * (rank - prevC)) / Math.max(1e-9, c - prevC);
    }
    prevLe = le; prevC = c;
  }
  return prevLe;
}

const sum = (m, prefix) => [...m].filter(([k]) => k === prefix || k.startsWith(prefix + "{")).reduce((s, [, v]) => s + v, 0);

function stat(id, v) { $(id).textContent = Number.isFinite(v) ? String(Math.round(v)) : "-"; }

function record(m, t) {
  samples.push({ t, m });
  while (samples.length && samples[0].t < t - KEEP_S - WINDOW_S) samples.shift();
  const prev = samples.length > 1 ? samples[samples.length - 2] : null;
  const base = samples.find((s) => s.t >= t - WINDOW_S) || samples[0];
  const P = "sluicegate_";
  const gen = m.get(`${P}generated_tokens_total`) || 0;
  points.push({
    t,
    ttft50: base === samples[samples.length - 1] ? null : quantile(0.5, m, base.m, `${P}time_to_first_token_seconds`),
    ttft95: base === samples[samples.length - 1] ? null : quantile(0.95, m, base.m, `${P}time_to_first_token_seconds`),
    itl50: base === samples[samples.length - 1] ? null : quantile(0.5, m, base.m, `${P}inter_token_latency_seconds`),
    itl95: base === samples[samples.length - 1] ? null : quantile(0.95, m, base.m, `${P}inter_token_latency_seconds`),
    tps: prev ? Math.max(0, gen - (prev.m.get(`${P}generated_tokens_total`) || 0)) / Math.max(1e-3, t - prev.t) : null,
    waiting: m.get(`${P}waiting`) || 0,
    shed: m.get(`${P}requests_shed_total`) || 0,
    expired: sum(m, `${P}requests_expired_total`),
  });
  while (points.length && points[0].t < t - KEEP_S) points.shift();
  stat("stat-running", m.get(`${P}running`));
  stat("stat-waiting", m.get(`${P}waiting`));
  stat("stat-generated", gen);
  stat("stat-cancelled", m.get(`${P}requests_finished_total{finish_reason="cancelled"}`) || 0);
  stat("stat-shed", m.get(`${P}requests_shed_total`) || 0);
  stat("stat-expired", sum(m, `${P}requests_expired_total`));
}

const COLORS = ["#1d5fa8", "#c0392b", "#2f9e6a"];

export function draw(canvas, lines, now) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
  canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  const left = 44, right = 8, top = 8, bottom = 18;
  let max = 0;
  for (const l of lines) for (const p of points) if (p[l.field] != null) max = Math.max(max, p[l.field]);
  max = max > 0 ? max * 1.1 : 1;
  g.strokeStyle = "#d6dadf"; g.fillStyle = "#5a6570"; g.font = "11px system-ui, sans-serif"; g.lineWidth = 1;
  g.beginPath(); g.moveTo(left, top); g.lineTo(left, h - bottom); g.lineTo(w - right, h - bottom); g.stroke();
  g.fillText(max < 10 ? max.toPrecision(2) : String(Math.round(max)), 2, top + 9);
  g.fillText("0", 2, h - bottom);
  // the axis spans what has been seen, up to KEEP_S: a fresh page does not squeeze its first points to the edge
  const span = Math.min(KEEP_S, Math.max(20, points.length ? now - points[0].t : 0));
  g.fillText(span >= 120 ? `-${Math.round(span / 60)} min` : `-${Math.round(span)} s`, left, h - 4);
  g.fillText("now", w - right - 22, h - 4);
  const x = (t) => left + ((w - left - right) * (t - (now - span))) / span;
  const y = (v) => h - bottom - ((h - top - bottom) * v) / max;
  let drawn = 0;
  lines.forEach((l, i) => {
    g.strokeStyle = COLORS[i % COLORS.length]; g.lineWidth = 1.5;
    g.beginPath();
    let pen = false;
    for (const p of points) {
      const v = p[l.field];
      if (v == null) { pen = false; continue; }
      if (pen) g.lineTo(x(p.t), y(v)); else { g.moveTo(x(p.t) - 1.5, y(v)); g.lineTo(x(p.t) + 1.5, y(v)); }
      pen = true;
      drawn += 1;
    }
    g.stroke();
    g.fillStyle = COLORS[i % COLORS.length];
    g.fillText(l.label, left + 6 + i * 60, top + 10);
  });
  canvas.dataset.points = String(drawn);
}

function drawAll() {
  const now = points.length ? points[points.length - 1].t : Date.now() / 1000;
  draw($("plot-ttft"), [{ field: "ttft50", label: "p50" }, { field: "ttft95", label: "p95" }], now);
  draw($("plot-itl"), [{ field: "itl50", label: "p50" }, { field: "itl95", label: "p95" }], now);
  draw($("plot-tps"), [{ field: "tps", label: "tokens/s" }], now);
  draw($("plot-queue"), [{ field: "waiting", label: "waiting" }, { field: "shed", label: "shed" },
    { field: "expired", label: "expired" }], now);
}

async function scrape() {
  try {
    const { text } = await call("GET", "/metrics", undefined, { raw: true });
    record(parseMetrics(text), Date.now() / 1000);
    if (!$("panel-metrics").hidden) drawAll();
    $("metrics-message").textContent = `Scraping /metrics every ${EVERY_MS / 1000} s; the last ${KEEP_S / 60} minutes.`;
  } catch (e) {
    $("metrics-message").textContent = e instanceof Refused && e.error
      ? `/metrics refused: ${e.error.message} (docs/playground.md)` : `/metrics: ${e.message}`;
    if (e instanceof Refused && (e.status === 401 || e.status === 403)) { stopped = true; return; }
  }
  if (!stopped) timer = setTimeout(scrape, EVERY_MS);
}

export function startMetrics() { stopped = false; clearTimeout(timer); scrape(); }
export function showMetrics() { drawAll(); }
