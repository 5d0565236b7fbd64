"""Several local models in one process (`--model NAME=GGUF`, repeated): each its own engine, the request's `model`
picks one on every surface, `/v1/models` lists them all, an unknown name is a 404 listing them, their metrics are
one family per name with a sample per model, and their forward passes take turns through one lock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.api.app import create_app
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config
from tests.conftest import wait_ready


@pytest.fixture
def two() -> Iterator[TestClient]:
    app = create_app(Config(), lambda: ReferenceRunner(n_ctx=512, n_slots=4),
                     more={"second": lambda: ReferenceRunner(n_ctx=512, n_slots=4, seed=7, name="second")})
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


def test_the_request_names_the_model_on_every_surface(two: TestClient) -> None:
    assert {m["id"] for m in two.get("/v1/models").json()["data"]} == {"reference", "second"}
    outs = {}
    for model in ("reference", "second"):
        gen = two.post("/v1/generate", json={"model": model, "prompt": "Hi", "max_new_tokens": 6, "temperature": 0})
        assert gen.status_code == 200 and gen.json()["model"]["name"] == model
        outs[model] = gen.json()["text"]
        chat = two.post("/v1/chat/completions", json={"model": model, "max_tokens": 4, "temperature": 0,
                                                      "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200 and chat.json()["model"].startswith(model + "@")
        msg = two.post("/v1/messages", json={"model": model, "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "Hi"}]})
        assert msg.status_code == 200 and msg.json()["model"].startswith(model + "@")
        resp = two.post("/v1/responses", json={"model": model, "input": "Hi", "max_output_tokens": 4})
        assert resp.status_code == 200 and resp.json()["model"].startswith(model + "@")
        assert two.get(f"/v1/models/{model}").json()["id"] == model
    assert outs["reference"] != outs["second"]  # two models, two answers (different weights)
    default = two.post("/v1/generate", json={"prompt": "Hi", "max_new_tokens": 6, "temperature": 0}).json()
    assert default["model"]["name"] == "reference" and default["text"] == outs["reference"]  # the first: default
    missing = two.post("/v1/generate", json={"model": "third", "prompt": "Hi"})
    assert missing.status_code == 404 and "reference" in missing.json()["error"]["message"]
    assert "second" in missing.json()["error"]["message"]


def test_metrics_have_a_sample_per_model(two: TestClient) -> None:
    for model in ("reference", "second"):
        two.post("/v1/generate", json={"model": model, "prompt": "Hi", "max_new_tokens": 3})
    families = {f.name: f for f in text_string_to_metric_families(two.get("/metrics").text)}
    for name in ("sluicegate_generated_tokens", "sluicegate_running", "vllm:num_requests_waiting",
                 "sluicegate_time_to_first_token_seconds"):
        assert {s.labels["model_name"] for s in families[name].samples} == {"reference", "second"}, name
    generated = {s.labels["model_name"]: s.value for s in families["sluicegate_generated_tokens"].samples}
    assert generated == {"reference": 3, "second": 3}
