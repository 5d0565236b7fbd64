"""Long unique prompts at one client, over HTTP, side by side with llama.cpp's own llama-server.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/long_prompts.py [--rounds 6] [--write]

Servers (same GGUF, 2 threads, 4 slots of 2,048 positions, all up at once, taking turns request by request so
the machine's drift over minutes hits all alike): `sluicegate` as shipped (flash attention, every call on the
one-row path), `sluicegate --tiled-prefill` (prompts on the tiled kernel, generated tokens on the one-row path:
backends/tiled.py) and llama-server (`-np 4 -t 2`, its f16/f16 flash attention: tiled prefill, split-KV lone
decode). Each request: streaming `POST /v1/completions` of a prompt of exactly L tokens (random words, distinct
from its first token, so no server reuses anything), greedy, end-of-text banned, 32 new tokens. Prefill speed
is L over the time to the first token (which includes the request's HTTP and tokenization); decode is the ms a
token after the first. Every server's 32 tokens are compared with sluicegate's (identical numerics must give
identical greedy tokens; llama-server's differ where its kernels round differently).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import free_port, fresh_data_dir, launch, serve_command  # noqa: E402
from bench.report import median, publish  # noqa: E402

HEADING = "## Long unique prompts at one client, against llama-server"
PEER = ROOT / ".peer" / "venv" / "bin"
SLOTS, CTX, NEW = 4, 2048, 32
BANNED_EOS = {"0": -100, "2": -100}
SERVERS = ("sluicegate", "sluicegate --tiled-prefill", "llama-server")


@contextlib.contextmanager
def server(kind: str, log: Path) -> Iterator[str]:
    from sluicegate.backends.llama_cpp import default_model_path

    port = free_port()
    if kind == "llama-server":
        exe = os.environ.get("LLAMA_SERVER", str(PEER / "llama-cpp-server"))
        cmd = [exe, "-m", str(default_model_path()), "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", str(CTX * SLOTS), "--", "-np", str(SLOTS), "-t", "2", "--no-repack"]
        with launch(cmd, port, ready="/health", log=log, append=True, env={}, group=True, timeout=300) as srv:
            yield srv.url
        return
    cmd = serve_command(port, "--slots", str(SLOTS), "--threads", "2", "--ctx", str(CTX), "--log-level", "warning",
                        "--data-dir", fresh_data_dir(), *kind.split()[1:])
    with launch(cmd, port, log=log, append=True, group=True, timeout=300) as srv:
        yield srv.url


def prompt(n_tokens: int, i: int, tokenize: object) -> str:
    """Random words, exactly `n_tokens` tokens (the default model's tokenizer, no BOS: SmolLM2 adds none)."""
    rng = np.random.default_rng(1000 + i)
    words = [w.strip() for w in (ROOT / "README.md").read_text().split() if w.isalpha()]
    text = " ".join(rng.choice(words, size=n_tokens))
    ids = tokenize(text)  # type: ignore[operator]
    while len(ids) > n_tokens:
        text = text.rsplit(" ", 1)[0]
        ids = tokenize(text)  # type: ignore[operator]
    while len(ids) < n_tokens:
        text += " a"
        ids = tokenize(text)  # type: ignore[operator]
    return text


def one(url: str, text: str) -> tuple[float, float, list[str]]:
    """(seconds to the first token, seconds a token after it, the streamed pieces)."""
    body = {"prompt": text, "max_tokens": NEW, "temperature": 0.0, "logit_bias": BANNED_EOS, "stream": True}
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    t0 = time.perf_counter()
    stamps, pieces = [], []
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "model": model}, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0].get("text"):
                stamps.append(time.perf_counter())
                pieces.append(choices[0]["text"])
    # every reply is NEW tokens (end-of-text banned); a server may send several in one event
    return stamps[0] - t0, (stamps[-1] - stamps[0]) / (NEW - 1), pieces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="requests per server and length")
    ap.add_argument("--lengths", default="512,1024")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path

    vocab = LlamaCppRunner(default_model_path(), vocab_only=True)
    lengths = [int(x) for x in args.lengths.split(",")]
    log = ROOT / "bench" / "results" / "long_prompts.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()[0]
    res: dict[tuple[str, int], list[tuple[float, float]]] = {}
    same: dict[str, list[bool]] = {k: [] for k in SERVERS}
    with contextlib.ExitStack() as stack:
        urls = {k: stack.enter_context(server(k, log)) for k in SERVERS}
        for k in SERVERS:  # one short request each: first-call costs are not a prefill's
            one(urls[k], "Hello there")
        for n in lengths:
            for i in range(args.rounds):
                text = prompt(n, n * 100 + i, lambda t: vocab.tokenize(t, add_special=False))
                got = {}
                for k in SERVERS[i % 3:] + SERVERS[: i % 3]:
                    ttft, tpot, pieces = one(urls[k], text)
                    res.setdefault((k, n), []).append((ttft, tpot))
                    got[k] = "".join(pieces)
                    print(f"{k} L={n} #{i}: prefill {n / ttft:.0f} tok/s, {tpot * 1e3:.1f} ms/token", flush=True)
                for k in SERVERS:
                    same[k].append(got[k] == got["sluicegate"])
    peer = {n: median([n / t for t, _ in res[("llama-server", n)]]) for n in lengths}
    cmd = f"flock /tmp/sluicegate-bench.lock .venv/bin/python bench/long_prompts.py --rounds {args.rounds}"
    rows = [HEADING, "", f"Command: `{cmd}` "
            f"({started}, load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end). "
            "bench/long_prompts.py describes the set-up: one client, unique raw prompts, 32 greedy tokens, medians of "
            f"{args.rounds} requests per cell, the servers taking turns request by request.", "",
            "| server | " + " | ".join(f"prefill {n} tok/s (vs llama-server) | decode ms/token @{n}" for n in lengths)
            + " | greedy replies equal to shipped sluicegate's |", "|---" * (2 * len(lengths) + 2) + "|"]
    for k in SERVERS:
        cells = []
        for n in lengths:
            pf = median([n / t for t, _ in res[(k, n)]])
            cells += [f"{pf:.0f} ({pf / peer[n]:.2f}x)", f"{median([p * 1e3 for _, p in res[(k, n)]]):.1f}"]
        rows.append(f"| {k} | " + " | ".join(cells) + f" | {sum(same[k])}/{len(same[k])} |")
    publish(HEADING, "\n".join(rows), args.write)


if __name__ == "__main__":
    main()
