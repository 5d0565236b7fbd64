"""Batch fidelity over HTTP: 32 requests at once give the token ids they give one at a time.

The server has 16 slots, so half of the concurrent requests wait and join as others leave; prompts from a
few tokens to ~500 (decoding well past the 256 positions where llama.cpp's flash-attention kernels used to
change numerics) and some sharing a long prefix, so prefill chunks, decode steps and prefix reuse all mix.
The same on a server with `--tiled-prefill` (prompts on the tiled kernel, generated tokens on the one-row
path, padding and twin rows: backends/tiled.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import Server, start_server, stop_server

SYSTEM = (
    "You are a careful assistant. Answer briefly, cite no sources, and never invent facts. "
    "If a question is ambiguous, say which reading you answer. Prefer plain words to jargon. "
) * 3
STORY = (
    "The lighthouse keeper counted the ships every evening and wrote their names in a blue notebook. "
    "One winter night a ship without a name passed the rocks, and the keeper followed its lights. "
)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about rain.",
    "def add(a, b):",
    "List three prime numbers:",
    "Translate to German: good night",
    "Explain photosynthesis in one sentence.",
    "东京在哪个国家？",
    "Emoji summary of a day at the beach:",
]


def prompts() -> list[str]:
    out = list(QUESTIONS)
    out += [SYSTEM + q for q in QUESTIONS]  # shared ~100-token prefix
    out += [STORY * n + "What happened next?" for n in (3, 6, 9, 12)]  # ~130 to ~500 tokens
    out += ["Once upon a time", "2 + 2 =", "Le ciel est", "SELECT name FROM"]
    return out


def bodies() -> list[dict[str, object]]:
    ps = prompts()
    assert len(ps) == 24
    greedy = [{"prompt": p, "max_new_tokens": 24, "temperature": 0.0} for p in ps[:16]]
    seeded = [
        {"prompt": p, "max_new_tokens": 24, "temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 77 + i}
        for i, p in enumerate(ps[8:])
    ]
    return greedy + seeded


async def _all(server: Server, reqs: list[dict[str, object]]) -> list[dict[str, object]]:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=server.url, timeout=900, limits=limits) as c:
        rs = await asyncio.gather(*(c.post("/v1/generate", json=b) for b in reqs))
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    return [r.json() for r in rs]


@pytest.fixture(scope="module")
def tiled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("tiled"), "--slots", "16", "--tiled-prefill")
    yield srv
    stop_server(srv)


@pytest.mark.timeout(1200)  # about 30 s on a quiet 2-core machine; minutes under contention
def test_32_concurrent_requests_equal_the_same_requests_one_at_a_time(server: Server) -> None:
    check_batched_equals_alone(server)


@pytest.mark.timeout(1200)
def test_the_same_with_tiled_prefill(tiled_server: Server) -> None:
    check_batched_equals_alone(tiled_server)


def check_batched_equals_alone(server: Server) -> None:
    reqs = bodies()
    assert len(reqs) == 32
    with httpx.Client(base_url=server.url, timeout=900) as c:
        alone = []
        for b in reqs:
            r = c.post("/v1/generate", json=b)
            assert r.status_code == 200, r.text
            alone.append(r.json())
    together = asyncio.run(_all(server, reqs))
    pairs = list(zip(alone, together, strict=True))
    mismatches = [i for i, (a, t) in enumerate(pairs) if a["token_ids"] != t["token_ids"]]
    assert not mismatches, f"{len(mismatches)}/32 differ: {mismatches}"
    for a, t in zip(alone, together, strict=True):
        assert a["text"] == t["text"] and a["finish_reason"] == t["finish_reason"]
        assert a["usage"]["prompt_tokens"] == t["usage"]["prompt_tokens"]
    # the repeated prompts found their blocks in the prefix cache, and that changed nothing above
    cached = [t["usage"]["prompt_tokens_details"]["cached_tokens"] for t in together]
    assert sum(c > 0 for c in cached) >= 4
    assert all(c < t["usage"]["prompt_tokens"] for c, t in zip(cached, together, strict=True))
