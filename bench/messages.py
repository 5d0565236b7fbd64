"""What Anthropic's Messages surface costs next to chat, on the same serving path and the same model.

    flock /work/helpers/bench.lock .venv/bin/python bench/messages.py [--runs 200] [--write]

The real model (`sluicegate serve`, SmolLM2 on llama.cpp) over a socket on 127.0.0.1, one request at a time on a
keep-alive connection, the two routes interleaved (this machine drifts over minutes), greedy, the same prompt:

1. a one-token answer: the server's non-engine time (Server-Timing `total` minus queue, prefill and decode) and
   the client's wall time;
2. a 32-token stream: the client's wall time to the last event (the same tokens on both routes).

`--write` replaces the "## Messages surface cost" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import sluicegate_server  # noqa: E402
from bench.report import median, publish  # noqa: E402

HEADING = "## Messages surface cost"
MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
ENGINE = ("queue", "prefill", "decode")


def stages(header: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";dur=")
        if rest:
            out[name] = float(rest)
    return out


def body(tokens: int, stream: bool) -> dict[str, object]:
    """The same request on both routes: both read `model`, `messages`, `max_tokens`, `temperature`, `stream`."""
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "stream": stream}


PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


def one(http: httpx.Client, route: str) -> tuple[float, float]:
    t = time.perf_counter()
    r = http.post(PATHS[route], json=body(1, False))
    wall = (time.perf_counter() - t) * 1e3
    r.raise_for_status()
    st = stages(r.headers["server-timing"])
    return st["total"] - sum(st.get(k, 0.0) for k in ENGINE), wall


def streamed(http: httpx.Client, route: str) -> float:
    t = time.perf_counter()
    with http.stream("POST", PATHS[route], json=body(32, True)) as r:
        r.raise_for_status()
        for _ in r.iter_bytes():
            pass
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    got: dict[str, dict[str, list[float]]] = {r: {"server": [], "wall": [], "stream": []} for r in PATHS}
    with sluicegate_server() as url, httpx.Client(base_url=url, timeout=120) as http:
        for route in PATHS:  # warm both
            one(http, route)
            streamed(http, route)
        for i in range(args.runs):
            for route in (("chat", "messages") if i % 2 else ("messages", "chat")):
                server, wall = one(http, route)
                got[route]["server"].append(server)
                got[route]["wall"].append(wall)
        for i in range(max(args.runs // 5, 10)):
            for route in (("chat", "messages") if i % 2 else ("messages", "chat")):
                got[route]["stream"].append(streamed(http, route))
    rows = [f"| {route} | {median(v['server']):.2f} | {median(v['wall']):.2f} | {median(v['stream']):.1f} |"
            for route, v in got.items()]
    ratio = median(got["messages"]["stream"]) / median(got["chat"]["stream"])
    text = "\n".join([
        HEADING, "",
        f"Command: `flock /work/helpers/bench.lock .venv/bin/python bench/messages.py --runs {args.runs} --write` "
        f"({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC). Machine: {platform.machine()}, 2 cores shared "
        f"with other work, Python {platform.python_version()}; the real model, one request at a time over a "
        "keep-alive socket on 127.0.0.1, the two routes interleaved, greedy, the same prompt. Medians, ms: the "
        f"server's non-engine time of a one-token answer ({args.runs} each), the client's wall time of it, and "
        f"the client's wall time of a 32-token stream ({max(args.runs // 5, 10)} each).", "",
        "| route | server non-engine | one-token wall | 32-token stream wall |",
        "|---|---|---|---|",
        *rows, "",
        f"Messages stream / chat stream: {ratio:.3f}. The Messages adapter converts the request to chat's and "
        "shapes Anthropic's events from the same engine outputs; what it adds is the conversion and one pydantic "
        "event per delta (chat splices text into a pre-rendered chunk).", "",
    ])
    publish(HEADING, text, args.write)


if __name__ == "__main__":
    main()
