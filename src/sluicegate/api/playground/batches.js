// The batches panel: this key's /v1/batches with progress and ETA (polled while the panel shows and a batch is
// live), upload a JSONL and start it, cancel, download the results.
import { call, key, Refused } from "./api.js";

const $ = (id) => document.getElementById(id);
const LIVE = new Set(["validating", "in_progress", "finalizing", "cancelling"]);
let timer = null;
let visible = false;

function eta(b) {
  const { total, completed, failed } = b.request_counts;
  const done = completed + failed;
  if (!LIVE.has(b.status) || !b.in_progress_at || !done || done >= total) return LIVE.has(b.status) ? "…" : "";
  const rate = done / Math.max(1, Date.now() / 1000 - b.in_progress_at);
  return `${Math.ceil((total - done) / rate)} s`;
}

async function download(fileId, name) {
  const res = await fetch(`/v1/files/${encodeURIComponent(fileId)}/content`,
    { headers: key() ? { Authorization: `Bearer ${key()}` } : {} });
  if (!res.ok) { $("batch-message").textContent = `download refused: HTTP ${res.status}`; return; }
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await res.blob());
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

function button(text, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.addEventListener("click", onClick);
  return b;
}

function render(batches) {
  const rows = batches.map((b) => {
    const tr = document.createElement("tr");
    tr.dataset.id = b.id;
    tr.dataset.status = b.status;
    const { total, completed, failed } = b.request_counts;
    const cells = [b.id, b.status].map((t) => { const td = document.createElement("td"); td.textContent = t; return td; });
    const prog = document.createElement("td");
    const bar = document.createElement("progress");
    bar.max = Math.max(1, total);
    bar.value = completed + failed;
    bar.setAttribute("aria-label", `${b.id} progress`);
    const pct = total ? Math.round((100 * (completed + failed)) / total) : 0;
    bar.dataset.percent = String(pct);
    const label = document.createElement("span");
    label.textContent = ` ${completed + failed}/${total} (${pct}%)${failed ? `, ${failed} failed` : ""}`;
    prog.append(bar, label);
    const etaCell = document.createElement("td");
    etaCell.textContent = eta(b);
    const actions = document.createElement("td");
    if (LIVE.has(b.status) && b.status !== "cancelling") {
      actions.append(button("cancel", async () => {
        try { await call("POST", `/v1/batches/${b.id}/cancel`, undefined, { record: true }); } catch (e) {
          $("batch-message").textContent = e instanceof Refused && e.error ? e.error.message : String(e);
        }
        refresh();
      }));
    }
    if (b.output_file_id) actions.append(button("results", () => download(b.output_file_id, `${b.id}-output.jsonl`)));
    if (b.error_file_id) actions.append(button("errors", () => download(b.error_file_id, `${b.id}-errors.jsonl`)));
    tr.append(...cells, prog, etaCell, actions);
    return tr;
  });
  $("batches").tBodies[0].replaceChildren(...rows);
}

export async function refresh() {
  clearTimeout(timer);
  try {
    const list = await call("GET", "/v1/batches?limit=20");
    render(list.data);
    if (visible && list.data.some((b) => LIVE.has(b.status))) timer = setTimeout(refresh, 1000);
  } catch (e) {
    $("batch-message").textContent = e instanceof Refused && e.error
      ? `batches: ${e.error.message}` : `batches: ${e.message}`;
  }
}

export function sample(model, endpoint) {
  const lines = ["a river", "a mountain", "the sea", "a city"].map((topic, i) => JSON.stringify({
    custom_id: `req-${i + 1}`, method: "POST", url: endpoint,
    body: endpoint === "/v1/completions"
      ? { model, prompt: `A short line about ${topic}:`, max_tokens: 16 }
      : { model, messages: [{ role: "user", content: `One sentence about ${topic}.` }], max_completion_tokens: 16 },
  }));
  return lines.join("\n") + "\n";
}

export function initBatches(modelOf) {
  $("batch-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const file = $("batch-file").files[0];
    const msg = $("batch-message");
    if (!file) { msg.textContent = "choose a JSONL file first"; return; }
    const form = new FormData();
    form.append("purpose", "batch");
    form.append("file", file, file.name);
    try {
      msg.textContent = "uploading…";
      const f = await call("POST", "/v1/files", form, { record: true });
      const b = await call("POST", "/v1/batches", { input_file_id: f.id, endpoint: $("batch-endpoint").value,
        completion_window: "24h" }, { record: true });
      msg.textContent = `started ${b.id} (${b.request_counts.total} requests)`;
    } catch (err) {
      msg.textContent = err instanceof Refused && err.error
        ? `refused: ${err.error.message}${err.error.param ? ` (${err.error.param})` : ""}` : String(err);
    }
    refresh();
  });
  $("batch-sample").addEventListener("click", () => {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([sample(modelOf(), $("batch-endpoint").value)], { type: "application/jsonl" }));
    a.download = "sample-batch.jsonl";
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  });
}

export function showBatches(on) {
  visible = on;
  if (on) refresh(); else clearTimeout(timer);
}
