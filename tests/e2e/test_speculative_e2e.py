"""Speculative decoding on the real model: the runner's every-position logits, and a served greedy request.

With flash attention on its one-row path (the runner's default) a multi-token verification computes each
position as one-token decoding does, bit for bit, so a served greedy reply equals plain decoding's, whether
the drafts are fixed (`--speculative-ngram 5`) or adaptive (the default, the session's `server`).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from tests.e2e.conftest import Server, start_server, stop_server

TEXT = ("The river runs past the old mill, under the stone bridge, and into the valley where the farmers "
        "grow wheat and barley every summer.")


def test_logits_all_gives_a_row_per_position_in_every_group() -> None:
    r = LlamaCppRunner(default_model_path(), n_ctx=128, n_slots=3)
    try:
        ids = r.tokenize(TEXT)
        head, tail = ids[:-4], ids[-4:]
        for slot in range(3):
            r.execute([BatchItem(slot, head, 0, False)])
        last_only = r.execute([BatchItem(0, tail, len(head), True)]).copy()
        r.truncate(1, len(head))
        mixed = r.execute([  # a verification item beside a decode token and a plain chunk
            BatchItem(2, tail[:1], len(head), True), BatchItem(1, tail, len(head), True, logits_all=True),
        ]).copy()
        assert mixed.shape == (1 + len(tail), r.limits.n_vocab)
        np.testing.assert_array_equal(mixed[-1], last_only[0])
        r.clear(0)
        r.execute([BatchItem(0, head, 0, False)])
        one = [r.execute([BatchItem(0, [t], len(head) + i, True)])[0].copy() for i, t in enumerate(tail)]
        # each position's row is that position's, as one-token decoding computes it
        np.testing.assert_array_equal(np.stack(one), mixed[1:])
    finally:
        r.close()


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("spec"), "--slots", "2", "--ctx", "512", "--speculative-ngram", "5")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("plain"), "--slots", "2", "--ctx", "512", "--speculative-ngram", "0")
    yield srv
    stop_server(srv)


def _drafts(url: str) -> tuple[float, float]:
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    return _counter(metrics, "spec_draft_tokens"), _counter(metrics, "spec_accepted_tokens")


def _counter(metrics: str, name: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith(f"sluicegate_{name}_total"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.timeout(900)
def test_a_greedy_repeat_request_is_served_with_accepted_drafts(
    spec_server: Server, server: Server, plain_server: Server,
) -> None:
    body = {
        "messages": [{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT}"}],
        "model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 48,
    }
    r = httpx.post(f"{spec_server.url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert choice["finish_reason"] in ("stop", "length") and choice["message"]["content"].strip()
    assert 0 < out["usage"]["completion_tokens"] <= 48
    drafted, accepted = _drafts(spec_server.url)
    assert drafted >= accepted > 0
    assert "speculative decoding is on" in spec_server.log()
    again = httpx.post(f"{spec_server.url}/v1/chat/completions", json=body, timeout=600).json()
    assert "choices" in again, again
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]  # alone: repeatable
    plain = httpx.post(f"{plain_server.url}/v1/chat/completions", json=body, timeout=600).json()
    assert "choices" in plain, plain
    assert plain["choices"][0]["message"]["content"] == choice["message"]["content"]  # the drafts changed nothing
    assert _drafts(plain_server.url) == (0.0, 0.0)
    before = _drafts(server.url)
    auto = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=600).json()
    assert "choices" in auto, auto
    assert auto["choices"][0]["message"]["content"] == choice["message"]["content"]
    after = _drafts(server.url)
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    cost = float(next(x for x in metrics.splitlines() if x.startswith("sluicegate_spec_row_cost")).rsplit(" ", 1)[1])
    assert 0.0 < cost <= 1.5
    if cost < 0.8:  # what a row costs on this machine (on a loaded one a draft may not pay, and is not made)
        assert after[1] > before[1]  # the default drafts a reply that copies its prompt
    assert "speculative decoding: adaptive" in server.log()
    assert "may differ" not in spec_server.log() + server.log()  # exact: no warning
