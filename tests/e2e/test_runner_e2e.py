"""The real llama.cpp runner and server: control-token parsing on the text routes, the attention kernels named in
the fingerprint, and thread-count changes leaving results alone."""

from __future__ import annotations

import itertools
from pathlib import Path

import httpx
import numpy as np
import pytest

from sluicegate.backends.base import BatchItem
from sluicegate.backends.cpu_threads import ThreadGovernor
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from tests.e2e.conftest import Server, start_server, stop_server

CHATML = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def vocab() -> LlamaCppRunner:
    return LlamaCppRunner(default_model_path(), n_ctx=64, n_slots=1)


def test_a_chatml_prompt_on_completions_is_read_with_its_control_tokens(server: Server, vocab: LlamaCppRunner) -> None:
    """As llama.cpp's server and vLLM read it: `<|im_start|>` is one control token, not ten of text."""
    parsed = vocab.tokenize(CHATML, parse_special=True)
    plain = vocab.tokenize(CHATML, parse_special=False)
    im_start = vocab.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(im_start) == 1 and parsed.count(im_start[0]) == 2 and im_start[0] not in plain
    body = {"model": "smollm2-135m-instruct", "prompt": CHATML, "max_tokens": 1, "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        default = http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens"]
        as_text = http.post("/v1/completions", json={**body, "parse_special": False}).json()
        native = http.post("/v1/generate", json={"prompt": CHATML, "max_new_tokens": 1})
        native_plain = http.post("/v1/generate", json={"prompt": CHATML, "max_new_tokens": 1, "parse_special": False})
        counted = http.post("/tokenize", json={"prompt": CHATML}).json()["count"]
        counted_plain = http.post("/tokenize", json={"prompt": CHATML, "parse_special": False}).json()["count"]
    assert default == len(parsed) < as_text["usage"]["prompt_tokens"] == len(plain)
    # one rule for raw prompts: /v1/generate and /tokenize read control-token text as /v1/completions does
    assert native.json()["usage"]["prompt_tokens"] == len(parsed) == counted
    assert native_plain.json()["usage"]["prompt_tokens"] == len(plain) == counted_plain


def test_the_attention_kernels_are_in_the_fingerprint_and_neither_is_batch_variant(tmp_path: Path) -> None:
    """Flash attention (the default, kept on its one-row path) and the plain kernels are both batch-invariant
    but round differently from each other: `system_fingerprint` tells them apart; neither start-up warns."""
    plain = LlamaCppRunner(default_model_path(), n_ctx=64, n_slots=1, flash_attn=False)
    fast = LlamaCppRunner(default_model_path(), n_ctx=64, n_slots=1)
    try:
        assert plain.limits.batch_invariant and fast.limits.batch_invariant
        assert fast.limits.decoded_kv_exact and not plain.limits.decoded_kv_exact
        assert (fast.limits.numerics, plain.limits.numerics) == ("flash-attn:k=bf16:v=f16", "")
    finally:
        plain.close()
        fast.close()
    body = {"model": "smollm2-135m-instruct", "prompt": "Hi", "max_tokens": 1}
    prints = []
    for flag in ("--flash-attn", "--no-flash-attn"):
        srv = start_server(tmp_path, "--slots", "2", "--ctx", "256", flag)
        try:
            with httpx.Client(base_url=srv.url, timeout=120) as http:
                prints.append(http.post("/v1/completions", json=body).json()["system_fingerprint"])
        finally:
            stop_server(srv)
        assert "depend on what is batched" not in srv.log()
    assert prints[0] != prints[1]


def _greedy(runner: LlamaCppRunner, prompts: list[str], steps: int) -> tuple[list[list[int]], bytes]:
    """Batched greedy decoding straight on the runner: the tokens, and the last step's logits as bytes."""
    toks = [runner.tokenize(p) for p in prompts]
    for slot in range(len(prompts)):
        runner.clear(slot)
    logits = runner.execute([BatchItem(slot=s, token_ids=t, start_pos=0) for s, t in enumerate(toks)])
    pos = [len(t) for t in toks]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        nxt = [int(np.argmax(row)) for row in logits]
        for s, tok in enumerate(nxt):
            out[s].append(tok)
        logits = runner.execute([BatchItem(slot=s, token_ids=[t], start_pos=pos[s]) for s, t in enumerate(nxt)])
        pos = [p + 1 for p in pos]
    return out, logits.tobytes()


def test_changing_the_thread_count_between_steps_changes_no_result() -> None:
    """The thread governor (backends/cpu_threads.py) may move between 1 and 2 threads at any step: the tokens
    and the logits must be exactly those of a run on a fixed thread count."""
    prompts = ["The history of the lighthouse", "Once upon a time in a quiet village", "List three primes:"]
    fixed = LlamaCppRunner(default_model_path(), n_ctx=128, n_slots=3, n_threads=2, adaptive_threads=False)
    try:
        want = _greedy(fixed, prompts, 24)
    finally:
        fixed.close()
    flips = itertools.cycle([1, 0])
    moving = LlamaCppRunner(default_model_path(), n_ctx=128, n_slots=3, n_threads=2)
    # a run queue that alternates between one busy neighbour and none, sampled every step, unsmoothed
    moving._governor = ThreadGovernor(2, cores=2, interval_s=0.0, weight=1.0, sample=lambda: next(flips))
    try:
        got = _greedy(moving, prompts, 24)
        assert moving._governor.changes >= 20  # it really did switch, step after step
    finally:
        moving.close()
    assert got[0] == want[0]
    assert got[1] == want[1]


def test_the_compute_thread_count_is_in_the_metrics(server: Server) -> None:
    from sluicegate.backends.cpu_threads import usable_cores

    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("sluicegate_compute_threads ")]
    assert len(values) == 1 and 1 <= values[0] <= usable_cores()


def test_the_model_card_says_what_its_kv_costs_and_what_is_exact(server: Server) -> None:
    """SmolLM2: 30 layers x 3 KV heads x 64 dims, K in bf16 and V in f16, 2,048 positions a slot."""
    card = httpx.get(f"{server.url}/v1/models/smollm2-135m-instruct", timeout=30).json()
    assert card["kv"] == {"slots": 16, "bytes_per_slot": 30 * 2048 * 3 * 64 * (2 + 2), "sliding_window": None,
                          "exact": ["batching", "decoded_kv", "drafts"], "inexact": None}
