"""Local models loaded when asked for (api/local_models.py): under a memory budget that holds one model,
alternating requests load and unload them and every answer is the one a server with that model alone gives;
keep_alive unloads an idle model; a deadline shorter than a load is refused at once with the forecast and the load
goes on; a load that fails is 503 load_failed and the next request tries again."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.api.app import create_app
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config, ModelConfig, ModelOptions
from sluicegate.testing.wait import wait_for
from tests.conftest import wait_ready


def first() -> ReferenceRunner:
    return ReferenceRunner(n_ctx=512, n_slots=4)


def second() -> ReferenceRunner:
    return ReferenceRunner(n_ctx=512, n_slots=4, seed=7, name="second")


ONE = first().limits.weights_bytes  # the reference model holds no KV cost: its weights are its cost


def serve(model: ModelConfig, more: dict[str, Callable[[], ReferenceRunner]] | None = None,
          cards: dict[str, Callable[[], ReferenceRunner]] | None = None,
          factory: Callable[[], ReferenceRunner] = first) -> TestClient:
    app = create_app(dataclasses.replace(Config(), model=model), factory,
                     more={"second": second} if more is None else more, cards=cards)
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


@pytest.fixture
def budget_one() -> Iterator[TestClient]:
    with serve(ModelConfig(memory_bytes=ONE + ONE // 2)) as c:
        wait_ready(c)
        yield c


def states(c: TestClient) -> dict[str, str]:
    return {m["id"]: m["state"] for m in c.get("/v1/models").json()["data"]}


def metric(c: TestClient, name: str) -> dict[tuple[str, ...], float]:
    """A family's samples by their label values (a counter by its name without `_total`)."""
    fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
    return {tuple(s.labels.values()): s.value for s in fams[name].samples if not s.name.endswith("_created")}


GEN = {"prompt": "Hello there", "max_new_tokens": 8, "temperature": 0}


def alone(factory: Callable[[], ReferenceRunner]) -> str:
    with serve(ModelConfig(), more={}, factory=factory) as c:
        wait_ready(c)
        return str(c.post("/v1/generate", json=GEN).json()["text"])


def test_a_budget_of_one_model_alternates_them_and_answers_as_each_alone(budget_one: TestClient) -> None:
    c = budget_one
    assert states(c) == {"reference": "loaded", "second": "unloaded"}  # the default at start, the other when asked
    card = c.get("/v1/models/second").json()
    assert card["state"] == "unloaded" and card["context_window"] == 512  # described without loading
    expected = {"reference": alone(first), "second": alone(second)}
    assert expected["reference"] != expected["second"]
    for name in ("second", "reference", "second", "reference"):
        r = c.post("/v1/generate", json={**GEN, "model": name})
        assert r.status_code == 200, r.text
        assert r.json()["model"]["name"] == name and r.json()["text"] == expected[name]
        other = "second" if name == "reference" else "reference"
        assert states(c) == {name: "loaded", other: "unloaded"}
    chat = c.post("/v1/chat/completions", json={"model": "second", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 200 and chat.json()["model"].startswith("second@")
    unloads = metric(c, "sluicegate_model_unloads")
    assert unloads[("reference", "budget")] == 3 and unloads[("second", "budget")] == 2  # the chat loaded "second"
    assert metric(c, "sluicegate_model_loaded") == {("second",): 1.0, ("reference",): 0.0}
    assert metric(c, "sluicegate_models_memory_bytes")[()] == ONE
    # the unloaded model's engine left the scrape; the loaded one's is there
    assert {k[0] for k in metric(c, "sluicegate_running")} == {"second"}


def test_keep_alive_zero_unloads_an_idle_model() -> None:
    with serve(ModelConfig(keep_alive=(("second", 0.0),))) as c:
        wait_ready(c)
        assert states(c)["second"] == "unloaded"
        assert c.post("/v1/generate", json={**GEN, "model": "second"}).status_code == 200
        wait_for(lambda: states(c)["second"] == "unloaded")
        assert states(c)["reference"] == "loaded"  # no keep_alive of its own, no budget: it stays
        assert metric(c, "sluicegate_model_unloads")[("second", "keep_alive")] == 1
        assert c.post("/v1/generate", json={**GEN, "model": "second"}).status_code == 200  # loads again


def test_a_deadline_shorter_than_the_load_is_refused_at_once_and_the_load_goes_on(budget_one: TestClient) -> None:
    c = budget_one
    r = c.post("/v1/generate", json={**GEN, "model": "second"}, headers={"X-Request-Timeout": "1"})
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "loading" and err["param"] == "model" and int(r.headers["retry-after"]) >= 1
    wait_for(lambda: states(c)["second"] == "loaded")  # the load went on: the retry finds it
    again = c.post("/v1/generate", json={**GEN, "model": "second"}, headers={"X-Request-Timeout": "1"})
    assert again.status_code == 200


def test_a_failed_load_is_503_load_failed_and_the_next_request_tries_again() -> None:
    calls = {"n": 0}

    def flaky() -> ReferenceRunner:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("the disk hiccuped")
        return second()

    with serve(ModelConfig(memory_bytes=4 * ONE), more={"second": flaky}, cards={"second": second}) as c:
        wait_ready(c)
        r = c.post("/v1/generate", json={**GEN, "model": "second"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "load_failed"
        assert "disk" not in r.text  # the operator's reason stays in the log
        assert c.post("/v1/generate", json={**GEN, "model": "second"}).status_code == 200


def test_a_model_over_the_budget_is_refused_at_start() -> None:
    with serve(ModelConfig(memory_bytes=ONE // 2)) as c:
        r = c.get("/readyz")
        wait_for(lambda: c.get("/readyz").json()["error"]["code"] == "load_failed")
        assert r.status_code == 503


def test_a_model_has_its_own_kv_tier_budget() -> None:
    own = ModelConfig(options=(("second", ModelOptions(kv_cache_bytes=12_345)),))
    with serve(own) as c:
        wait_ready(c)
        engines = c.app.state.sluicegate.runtime.engines  # type: ignore[attr-defined]
        budgets = {e.runner.identity.name: e.kv_tier.budget_bytes for e in engines}
    assert budgets["second"] == 12_345 and budgets["reference"] != 12_345  # the other keeps the server's
