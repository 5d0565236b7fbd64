// The chat panel: builds one /v1/chat/completions request from the form, streams or waits for the answer,
// and shows the model identity, the usage (cached tokens included), the timing bar and, on demand, token ids.
import { call, stream, Refused } from "./api.js";

const $ = (id) => document.getElementById(id);
const SCHEMA = { type: "object", properties: { city: { type: "string" }, population: { type: "integer" } },
  required: ["city", "population"] };
const TOOLS = [{ type: "function", function: { name: "get_weather", description: "The weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
let controller = null;

function num(id) { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); }

export function buildRequest(model) {
  const messages = [];
  if ($("system").value.trim()) messages.push({ role: "system", content: $("system").value });
  messages.push({ role: "user", content: $("prompt").value });
  const body = { model, messages };
  for (const [id, name] of [["temperature", "temperature"], ["top_p", "top_p"], ["seed", "seed"],
    ["max_tokens", "max_completion_tokens"]]) {
    const v = num(id);
    if (v !== undefined) body[name] = v;
  }
  const stops = $("stop").value.split(",").map((s) => s.trim()).filter(Boolean);
  if (stops.length) body.stop = stops;
  const mode = $("mode").value;
  const spec = $("schema").value.trim();
  if (mode === "json_schema") {
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema: JSON.parse(spec) } };
  } else if (mode === "tools") {
    body.tools = JSON.parse(spec);
    body.tool_choice = "required";
  }
  if ($("extra").value.trim()) Object.assign(body, JSON.parse($("extra").value));
  if ($("stream").checked) { body.stream = true; body.stream_options = { include_usage: true }; }
  return body;
}

// Server-Timing's stages, in ms.
function serverTiming(header) {
  const out = {};
  for (const part of (header || "").split(",")) {
    const m = part.trim().match(/^([\w-]+);dur=([\d.]+)/);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

function showTiming(stages, source) {
  const bar = $("timing");
  bar.replaceChildren();
  const total = ["queue", "prefill", "decode"].reduce((s, k) => s + (stages[k] || 0), 0);
  if (!total) return;
  for (const k of ["queue", "prefill", "decode"]) {
    const span = document.createElement("span");
    span.className = k;
    span.style.flexGrow = String(stages[k] || 0);
    span.textContent = `${k} ${(stages[k] || 0).toFixed(0)} ms`;
    span.title = span.textContent;
    bar.append(span);
  }
  bar.title = source;
  bar.dataset.source = source;
}

function row(dl, name, value) {
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  dd.textContent = value;
  dd.dataset.field = name;
  dl.append(dt, dd);
}

export function showRefusal(el, status, error) {
  el.hidden = false;
  el.replaceChildren();
  const title = document.createElement("strong");
  title.textContent = `${status} ${error ? error.type : "error"}`;
  const pre = document.createElement("pre");
  pre.textContent = JSON.stringify({ error }, null, 2);
  el.append(title);
  if (error && error.param) {
    const p = document.createElement("p");
    p.className = "param";
    p.textContent = `parameter: ${error.param}`;
    el.append(p);
  }
  el.append(pre);
}

// The prompt's ids exactly as the server templates and tokenizes the messages; the answer's ids by tokenizing
// its text (chat answers carry no ids; the sampled ids re-tokenize to the same in most cases, not all).
async function showIds(body, text) {
  const box = $("token-ids");
  if (!$("show-ids").checked || !text) { box.hidden = true; return; }
  const answer = await call("POST", "/tokenize", { model: body.model, prompt: text, add_special_tokens: false });
  let lines = `answer token ids (${answer.count}, its text tokenized): ${answer.tokens.join(" ")}`;
  if (!body.tools) { // /tokenize renders messages, not tools: with tools the prompt's ids would be wrong
    const prompt = await call("POST", "/tokenize", { model: body.model, messages: body.messages });
    box.dataset.promptCount = String(prompt.count);
    lines = `prompt token ids (${prompt.count}): ${prompt.tokens.join(" ")}\n${lines}`;
  }
  box.hidden = false;
  box.textContent = lines;
}

export async function send(models) {
  const model = $("model").value;
  const answer = $("answer");
  const meta = $("meta");
  answer.textContent = "";
  answer.dataset.chunks = "0";
  answer.dataset.state = "waiting";
  delete answer.dataset.ttftMs;
  meta.replaceChildren();
  $("timing").replaceChildren();
  $("refusal").hidden = true;
  $("token-ids").hidden = true;
  delete $("token-ids").dataset.promptCount;
  let body;
  try { body = buildRequest(model); } catch (e) {
    answer.dataset.state = "error";
    answer.textContent = `the JSON in the form does not parse: ${e.message}`;
    return;
  }
  controller = new AbortController();
  $("send").disabled = true;
  $("stop-btn").disabled = false;
  const t0 = performance.now();
  let opened = 0, first = 0, last = 0, usage = null, served = "", fingerprint = "", finish = "", timing = {};
  const calls = new Map();
  try {
    if (body.stream) {
      await stream("/v1/chat/completions", body, {
        signal: controller.signal,
        onOpen: (res) => { opened = performance.now(); answer.dataset.state = "streaming"; timing = serverTiming(res.headers.get("server-timing")); },
        onEvent: (ev) => {
          if (ev === "[DONE]") return;
          served = ev.model; fingerprint = ev.system_fingerprint;
          if (ev.usage) usage = ev.usage;
          for (const c of ev.choices || []) {
            const d = c.delta || {};
            if (c.finish_reason) finish = c.finish_reason;
            for (const tc of d.tool_calls || []) {
              const cur = calls.get(tc.index) || { name: "", arguments: "" };
              if (tc.function && tc.function.name) cur.name = tc.function.name;
              if (tc.function && tc.function.arguments) cur.arguments += tc.function.arguments;
              calls.set(tc.index, cur);
            }
            const piece = d.content || "";
            if (piece || d.tool_calls) {
              if (!first) { first = performance.now(); answer.dataset.ttftMs = (first - t0).toFixed(1); }
              last = performance.now();
              answer.textContent += piece;
              if (calls.size) answer.textContent = [...calls.values()].map((x) => `${x.name}(${x.arguments})`).join("\n");
              answer.dataset.chunks = String(Number(answer.dataset.chunks) + 1);
            }
          }
        },
      });
      showTiming({ queue: opened - t0, prefill: (first || opened) - opened, decode: (last || first) - first },
        "measured in the browser: request to headers, headers to first token, first to last token");
    } else {
      const { text, res } = await call("POST", "/v1/chat/completions", body, { record: true, raw: true });
      const r = JSON.parse(text);
      const msg = r.choices[0].message;
      served = r.model; fingerprint = r.system_fingerprint; usage = r.usage; finish = r.choices[0].finish_reason;
      answer.textContent = msg.tool_calls
        ? msg.tool_calls.map((c) => `${c.function.name}(${c.function.arguments})`).join("\n") : msg.content;
      answer.dataset.chunks = "1";
      timing = serverTiming(res.headers.get("server-timing"));
      showTiming(timing, "Server-Timing: the engine's queue, prefill and decode");
    }
    answer.dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      answer.dataset.state = "stopped";
      finish = "stopped by you (the server aborts the run)";
    } else if (e instanceof Refused) {
      answer.dataset.state = "refused";
      showRefusal($("refusal"), e.status, e.error);
    } else {
      answer.dataset.state = "error";
      answer.textContent = `request failed: ${e.message}`;
    }
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop-btn").disabled = true;
  }
  if (served) {
    const info = models.get(served.split("@")[0]) || {};
    row(meta, "model", served);
    row(meta, "digest", info.digest || "unknown");
    row(meta, "fingerprint", fingerprint || "");
  }
  if (finish) row(meta, "finish", finish);
  if (first) row(meta, "first token", `${(first - t0).toFixed(0)} ms after Send (measured in the browser)`);
  if (usage) {
    const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    row(meta, "usage", `${usage.prompt_tokens} prompt (${cached} cached) + ${usage.completion_tokens} completion = ${usage.total_tokens}`);
  }
  if (answer.dataset.state === "done") await showIds(body, answer.textContent).catch(() => {});
}

export function stop() { if (controller) controller.abort(); }

export function initChat(models) {
  const modeChanged = () => {
    const mode = $("mode").value;
    $("schema-label").hidden = mode === "text";
    if (mode === "json_schema") $("schema").value = JSON.stringify(SCHEMA, null, 2);
    if (mode === "tools") $("schema").value = JSON.stringify(TOOLS, null, 2);
  };
  $("mode").addEventListener("change", modeChanged);
  $("chat-form").addEventListener("submit", (e) => { e.preventDefault(); send(models); });
  $("stop-btn").addEventListener("click", stop);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); $("chat-form").requestSubmit(); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") stop(); });
}
