// The playground's entry point: tabs, the API key, the served models; each panel lives in its own module.
import { call, key, setKey, Refused } from "./api.js";
import { initChat } from "./chat.js";
import { initInspector } from "./inspect.js";
import { initBatches, showBatches } from "./batches.js";
import { startMetrics, showMetrics } from "./plots.js";

const $ = (id) => document.getElementById(id);
const models = new Map(); // name -> {ref, digest, context_window}
let retry = null;

function select(tab) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t === tab;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).hidden = !on;
  }
  showBatches(tab.id === "tab-batches");
  if (tab.id === "tab-metrics") showMetrics();
}

function initTabs() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  tabs.forEach((t, i) => {
    t.addEventListener("click", () => select(t));
    t.addEventListener("keydown", (e) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
      if (!step) return;
      const next = tabs[(i + step + tabs.length) % tabs.length];
      next.focus();
      select(next);
    });
  });
}

function askForKey(reason) {
  $("key-panel").hidden = false;
  $("key-reason").textContent = reason;
  document.body.dataset.auth = "needed";
  $("key-input").focus();
}

async function loadModels() {
  let list;
  try {
    list = await call("GET", "/v1/models", undefined, { record: true });
  } catch (e) {
    if (e instanceof Refused && e.status === 401) {
      askForKey(key()
        ? `The server refused this key: ${e.error ? e.error.message : "HTTP 401"}. Enter another.`
        : "This server requires an API key (it holds keys: docs/keys.md). Enter one to use the playground.");
      return false;
    }
    if (e instanceof Refused && e.status === 503) { // loading (or draining): say so, and look again
      const wait = Math.min(10, Math.max(1, Number(e.retryAfter) || 2));
      $("identity").textContent = `${e.error ? e.error.message : "the server is not ready"}; trying again in ${wait} s`;
      document.body.dataset.auth = "waiting";
      retry = setTimeout(start, wait * 1000);
      return false;
    }
    $("identity").textContent = e instanceof Refused && e.error ? e.error.message : `cannot list models: ${e.message}`;
    return false;
  }
  if (!list.data.length) { $("identity").textContent = "this server serves no model"; return false; }
  $("key-panel").hidden = true;
  document.body.dataset.auth = key() ? "key" : "open";
  $("key-state").textContent = key() ? "using your key" : "";
  $("forget-key").hidden = !key();
  const sel = $("model");
  sel.replaceChildren();
  for (const m of list.data) {
    const info = await call("GET", `/v1/models/${encodeURIComponent(m.id)}`).catch(() => ({}));
    models.set(m.id, { ref: info.ref || m.id, digest: info.digest || "", window: info.context_window });
    const opt = document.createElement("option");
    opt.value = m.id;
    opt.textContent = info.ref || m.id;
    sel.append(opt);
  }
  showIdentity();
  document.body.dataset.ready = "true";
  return true;
}

function showIdentity() {
  const info = models.get($("model").value);
  $("identity").textContent = info ? `${info.ref} · ${info.digest.slice(0, 19)}… · ${info.window} tokens` : "";
}

async function start() {
  clearTimeout(retry);
  if (await loadModels()) startMetrics();
}

initTabs();
initInspector();
initChat(models);
initBatches(() => $("model").value);
$("model").addEventListener("change", showIdentity);
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setKey($("key-input").value.trim());
  $("key-input").value = "";
  start();
});
$("forget-key").addEventListener("click", () => { setKey(""); location.reload(); });
start();
