"""The upstream hop's overhead: the same workload sent to an engine directly, and through a sluicegate whose
upstream it is (`serve --no-local-model --upstream URL`).

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/upstream.py                 # the full run (real model)
    .venv/bin/python bench/upstream.py --reference --levels 1 --requests 4 --max-tokens 4 --no-write   # smoke

The upstream is sluicegate serving the default GGUF (`--slots 16`); the front serves no model of its own and
tokenises with the same GGUF (vocab only). Streaming `POST /v1/completions`, greedy, end-of-text banned, so
every request generates exactly `--max-tokens` tokens; each prompt is unique (no prefix cache help). Closed
loop: N clients, each sending its next request when its last ends, `--requests` per client; direct and
through the front alternate for `--rounds` rounds. Per request, on the client: TTFT (send -> first token)
and latency (send -> [DONE]). The overhead is the front's median minus the direct median (and p90).
`--reference` runs both on the tiny reference backend (no model file): a smoke test of the script only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import free_port, fresh_data_dir, launch
from bench.report import percentile, publish

HEADING = "## Upstream hop overhead"
BANNED_EOS = {"0": -100, "2": -100}  # the default model's <|endoftext|>, <|im_end|>


@contextlib.contextmanager
def server(argv: list[str]) -> Iterator[str]:
    port = free_port()
    with launch([sys.executable, "-m", *argv, "--port", str(port)], port) as srv:
        yield srv.url


def commands(reference: bool, upstream_url: str | None) -> list[str]:
    if reference:
        base = ["sluicegate.testing.refserver", "--eos-slope", "0", "--slots", "16"]
        return base + (["--no-local-model", "--upstream", f"reference={upstream_url}/v1"] if upstream_url else [])
    base = ["sluicegate", "serve", "--data-dir", fresh_data_dir(), "--slots", "16", "--threads", "2"]
    return base + (["--no-local-model", "--upstream", f"{upstream_url}/v1"] if upstream_url else [])


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
              reference: bool) -> tuple[float, float]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if not reference:
        body["logit_bias"] = BANNED_EOS
    start = time.perf_counter()
    ttft = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                ttft = time.perf_counter() - start
    return ttft or 0.0, time.perf_counter() - start


async def level(url: str, model: str, clients: int, requests: int, max_tokens: int, tag: str,
                reference: bool) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker(w: int) -> None:
            for i in range(requests):
                out.append(await one(client, url, model, f"{tag} client {w} request {i}: tell me about rivers",
                                     max_tokens, reference))
        await asyncio.gather(*(worker(w) for w in range(clients)))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="1,16")
    p.add_argument("--requests", type=int, default=12, help="requests per client per round")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reference", action="store_true", help="the reference backend: a smoke test only")
    p.add_argument("--no-write", action="store_true", help="print, do not write docs/benchmarks.md")
    a = p.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    rows = []
    with server(commands(a.reference, None)) as direct, server(commands(a.reference, direct)) as front:
        model = httpx.get(f"{direct}/v1/models").json()["data"][0]["id"]
        for n in levels:
            got: dict[str, list[tuple[float, float]]] = {"direct": [], "front": []}
            for r in range(a.rounds):
                for name, url in (("direct", direct), ("front", front))[:: 1 if r % 2 == 0 else -1]:
                    got[name] += asyncio.run(level(url, model, n, a.requests, a.max_tokens, f"{name}{r}",
                                                   a.reference))
            d, f = got["direct"], got["front"]
            dt, ft = [x[0] * 1e3 for x in d], [x[0] * 1e3 for x in f]  # ms
            dl, fl = [x[1] * 1e3 for x in d], [x[1] * 1e3 for x in f]
            p = percentile
            rows.append(f"| {n} | {len(f)} | {p(dt, .5):.1f} | {p(ft, .5):.1f} | {p(ft, .5) - p(dt, .5):+.1f} "
                        f"| {p(ft, .9) - p(dt, .9):+.1f} | {p(dl, .5):.1f} | {p(fl, .5):.1f} "
                        f"| {p(fl, .5) - p(dl, .5):+.1f} |")
    backend = "reference backend (smoke only)" if a.reference else "SmolLM2-135M Q4_1, 2 threads, 16 slots"
    text = "\n".join([
        HEADING, "",
        f"`bench/upstream.py`: {backend}; streaming completions, {a.max_tokens} tokens, {a.requests} requests per "
        f"client per round, {a.rounds} rounds. Times in ms, measured on the client.", "",
        "| clients | requests | TTFT direct p50 | TTFT via front p50 | added p50 | added p90 | latency direct p50 "
        "| latency via front p50 | added |",
        "|---|---|---|---|---|---|---|---|---|", *rows, "",
    ])
    publish(HEADING, text, not a.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
