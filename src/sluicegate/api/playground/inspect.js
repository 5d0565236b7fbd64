// The inspector: the last request as curl and as official openai-SDK Python, and the raw answer with headers.
import { bus, key } from "./api.js";

const $ = (id) => document.getElementById(id);

function shellQuote(s) { return `'${s.replaceAll("'", "'\\''")}'`; }

// JSON -> a Python literal (True/False/None), indented like json.dumps(indent=4).
function py(v, indent = "") {
  const inner = indent + "    ";
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (Array.isArray(v)) {
    if (!v.length) return "[]";
    return `[\n${v.map((x) => inner + py(x, inner)).join(",\n")},\n${indent}]`;
  }
  if (typeof v === "object") {
    const keys = Object.keys(v);
    if (!keys.length) return "{}";
    return `{\n${keys.map((k) => `${inner}${JSON.stringify(k)}: ${py(v[k], inner)}`).join(",\n")},\n${indent}}`;
  }
  return JSON.stringify(v);
}

export function asCurl(method, path, body) {
  const url = new URL(path, location.href).href;
  const lines = [`curl ${method === "GET" ? "" : `-X ${method} `}${url}`];
  if (key()) lines.push(`-H "Authorization: Bearer $SLUICEGATE_API_KEY"`);
  if (body instanceof FormData) {
    for (const [k, v] of body.entries()) lines.push(`-F ${shellQuote(typeof v === "string" ? `${k}=${v}` : `${k}=@${v.name}`)}`);
  } else if (body !== undefined) {
    lines.push(`-H "Content-Type: application/json"`, `-d ${shellQuote(JSON.stringify(body))}`);
  }
  if (body && body.stream) lines.splice(1, 0, "-N");
  return lines.join(" \\\n  ");
}

const SDK_CALLS = { "/v1/chat/completions": "client.chat.completions.create",
  "/v1/completions": "client.completions.create", "/v1/batches": "client.batches.create",
  "/v1/models": "client.models.list" };

export function asPython(method, path, body) {
  const head = ["import os", "", "from openai import OpenAI", "",
    `client = OpenAI(base_url=${JSON.stringify(new URL("/v1", location.href).href)}, ` +
    `api_key=os.environ.get("SLUICEGATE_API_KEY", "none"))`, ""];
  const fn = SDK_CALLS[path.split("?")[0]];
  if (path === "/v1/files" && body instanceof FormData) {
    return [...head, `f = client.files.create(file=open(${JSON.stringify(body.get("file").name)}, "rb"), purpose="batch")`, "print(f)"].join("\n");
  }
  const cancel = path.match(/^\/v1\/batches\/([\w-]+)\/cancel$/);
  if (cancel) return [...head, `print(client.batches.cancel(${JSON.stringify(cancel[1])}))`].join("\n");
  if (!fn || (method === "GET") !== (fn === "client.models.list")) {
    return "# the openai SDK has no method for this route: the curl above is the request";
  }
  if (!body) return [...head, `print(${fn}())`].join("\n");
  const args = Object.entries(body).map(([k, v]) => `    ${k}=${py(v, "    ")},`).join("\n");
  const out = body.stream
    ? ["for chunk in stream:", "    print(chunk.choices[0].delta.content if chunk.choices else chunk.usage, end=\"\")"]
    : ["print(response)"];
  return [...head, `${body.stream ? "stream" : "response"} = ${fn}(\n${args}\n)`, ...out].join("\n");
}

export function initInspector() {
  bus.addEventListener("exchange", (e) => {
    const d = e.detail;
    $("inspect-empty").hidden = true;
    $("as-curl").textContent = asCurl(d.method, d.path, d.body);
    $("as-python").textContent = asPython(d.method, d.path, d.body);
    $("resp-status").textContent = `${d.status} (${d.method} ${d.path})`;
    $("resp-headers").textContent = d.headers;
    let text = d.text;
    try { if (!text.startsWith("data:")) text = JSON.stringify(JSON.parse(text), null, 2); } catch { /* as sent */ }
    $("resp-body").textContent = text;
  });
}
