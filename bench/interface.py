"""Interface cost and refusals: what the boundary costs, how fast it says no, and what a huge body costs.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/interface.py [--runs 300] [--write]

For the reference backend (a subprocess, `sluicegate.testing.refserver`) and the real model (`sluicegate
serve`, SmolLM2 on llama.cpp), over a socket on 127.0.0.1, one request at a time on a keep-alive connection:

1. a one-token request: medians of the stages the server reports in Server-Timing (read, parse, validate,
   tokenize, serialize; their sum is the interface cost), of the server's total minus the engine's stages
   (queue, prefill, decode), and of the client's wall time minus the engine's stages;
2. refusals: client wall time and server total for a request over the window (small prompt, huge
   max_new_tokens), a prompt just over the prompt limit (tokenised), a 300 KB prompt (refused by its byte
   length, untokenised), and a schema refusal for reference;
3. server RSS (VmRSS of the server process) before and after bodies of 1, 20 and 100 MiB, declared
   (Content-Length) and chunked.

`--write` replaces the "## Interface cost and refusals" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import free_port, fresh_data_dir, launch, serve_command  # noqa: E402
from bench.report import median, percentile, publish  # noqa: E402
from sluicegate.testing.refserver import running  # noqa: E402

MIB = 1 << 20
HEADING = "## Interface cost and refusals"
INTERFACE = ("read", "parse", "validate", "tokenize", "serialize")
ENGINE = ("queue", "prefill", "decode")


@dataclass
class Server:
    name: str
    url: str
    pid: int
    n_ctx: int

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")


@contextlib.contextmanager
def reference_server() -> Iterator[Server]:
    with tempfile.TemporaryDirectory() as tmp, running(Path(tmp), "--ctx", "2048") as srv:
        yield Server("reference backend", srv.url, srv.proc.pid, 2048)


@contextlib.contextmanager
def model_server(threads: int | None = None) -> Iterator[Server]:
    port = free_port()
    args = ["--slots", "4", "--log-level", "warning", "--data-dir", fresh_data_dir()]
    if threads is not None:
        args += ["--threads", str(threads)]
    with launch(serve_command(port, *args), port) as srv:
        name = "SmolLM2-135M Q4_1 (llama.cpp" + (f", {threads} thread" if threads else "") + ")"
        yield Server(name, srv.url, srv.pid, 2048)


def stages(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def one_token(c: httpx.Client, runs: int) -> dict[str, float]:
    rows: dict[str, list[float]] = {}
    body = {"prompt": "Hello", "max_new_tokens": 1, "temperature": 0}
    for i in range(runs + 20):
        t = time.perf_counter()
        r = c.post("/v1/generate", json=body)
        wall = (time.perf_counter() - t) * 1e3
        assert r.status_code == 200, r.text
        if i < 20:
            continue  # warm-up
        st = stages(r.headers["server-timing"])
        engine = sum(st.get(k, 0.0) for k in ENGINE)
        for k in INTERFACE:
            rows.setdefault(k, []).append(st.get(k, 0.0))
        rows.setdefault("interface", []).append(sum(st.get(k, 0.0) for k in INTERFACE))
        rows.setdefault("server_minus_engine", []).append(st["total"] - engine)
        rows.setdefault("client_minus_engine", []).append(wall - engine)
        rows.setdefault("engine", []).append(engine)
        rows.setdefault("client", []).append(wall)
    return {k: median(v) for k, v in rows.items()}


def refusals(c: httpx.Client, runs: int, n_ctx: int) -> list[tuple[str, int, str, float, float, float]]:
    # ~10 tokens per sentence on SmolLM2, 45 bytes: a prompt a little over the window, under the byte bound
    sentence = "the quick brown fox jumps over the lazy dog. "
    cases = [
        ("window: 1-token prompt, max_new_tokens 100000", {"prompt": "Hello", "max_new_tokens": 100_000}),
        (f"prompt just over {n_ctx - 1} tokens (tokenised)", {"prompt": sentence * (n_ctx // 9)}),
        ("300 KB prompt (refused by its byte length)", {"prompt": sentence * 6_600}),
        ('schema: max_new_tokens "5"', {"prompt": "Hello", "max_new_tokens": "5"}),
    ]
    out = []
    for name, body in cases:
        walls: list[float] = []
        totals: list[float] = []
        etype = ""
        for i in range(runs + 10):
            t = time.perf_counter()
            r = c.post("/v1/generate", json=body)
            wall = (time.perf_counter() - t) * 1e3
            assert r.status_code == 422, (name, r.status_code, r.text[:200])
            etype = r.json()["error"]["type"]
            if i >= 10:
                walls.append(wall)
                totals.append(stages(r.headers["server-timing"])["total"])
        out.append((name, 422, etype, median(walls), percentile(walls, 0.9), median(totals)))
    return out


def body_chunks(total: int) -> Iterator[bytes]:
    yield b'{"prompt": "'
    left = total - 12
    block = b"x" * MIB
    while left > 0:
        yield block[:left]
        left -= len(block[:left])


def rss(srv: Server) -> list[tuple[str, int, float, float]]:
    out = []
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        for size in (1, 20, 100):
            for mode in ("declared", "chunked"):
                headers = {"content-type": "application/json"}
                if mode == "declared":
                    headers["content-length"] = str(size * MIB)
                before = srv.rss_mib()
                r = c.post("/v1/generate", content=body_chunks(size * MIB), headers=headers)
                time.sleep(0.2)  # let the server finish its drain and log line before reading RSS
                out.append((f"{size} MiB {mode}", r.status_code, before, srv.rss_mib()))
    return out


def run(srv: Server, runs: int) -> list[str]:
    lines = [f"### {srv.name}", ""]
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        one = one_token(c, runs)
        refused = refusals(c, max(50, runs // 3), srv.n_ctx)
    lines += [
        f'One-token request (`{{"prompt": "Hello", "max_new_tokens": 1, "temperature": 0}}`), '
        f"median of {runs}, milliseconds:",
        "",
        "| read | parse | validate | tokenize | serialize | **interface (sum)** | server total - engine "
        "| client wall - engine | engine (queue+prefill+decode) | client wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| " + " | ".join(f"{one[k]:.3f}" for k in INTERFACE) + f" | **{one['interface']:.3f}** "
        f"| {one['server_minus_engine']:.3f} | {one['client_minus_engine']:.3f} | {one['engine']:.3f} "
        f"| {one['client']:.3f} |",
        "",
        f"Refusals (422), median of {max(50, runs // 3)}, milliseconds:",
        "",
        "| request | type | client wall (median) | client wall (p90) | server total (median) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | `{t}` | {w:.3f} | {w90:.3f} | {tot:.3f} |" for n, _, t, w, w90, tot in refused]
    lines += [
        "",
        "Server RSS around bodies over the 1 MiB limit (1 MiB itself is at the limit: read, then "
        "refused as invalid JSON):",
        "",
        "| body | status | RSS before (MiB) | RSS after (MiB) | change (MiB) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {s} | {b:.1f} | {a:.1f} | {a - b:+.1f} |" for n, s, b, a in rss(srv)]
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--only", choices=("reference", "model"), default=None)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads for the model server")
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks.md")
    args = ap.parse_args()
    out = [
        HEADING,
        "",
        "Command: `flock /tmp/sluicegate-bench.lock .venv/bin/python bench/interface.py"
        f"{' --runs ' + str(args.runs) if args.runs != 300 else ''}"
        f"{' --only ' + args.only if args.only else ''}{' --threads ' + str(args.threads) if args.threads else ''}"
        f"{' --write' if args.write else ''}`. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other work, Python "
        f"{platform.python_version()}; one request at a time over a keep-alive socket on 127.0.0.1; server "
        "stages from its Server-Timing header. Targets: interface under 1 ms median, a refusal under 2 ms.",
        "",
    ]
    if args.only in (None, "reference"):
        with reference_server() as srv:
            out += run(srv, args.runs)
    if args.only in (None, "model"):
        with model_server(args.threads) as srv:
            out += run(srv, args.runs)
    text = "\n".join(out)
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
