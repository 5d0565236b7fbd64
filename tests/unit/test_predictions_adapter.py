"""The predictions adapter (serving/predictions.py) without HTTP, on the reference backend: parsing, both
input kinds, the record's shape, the budget and model rules, batch priority passed through."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from sluicegate.config import LimitsConfig
from sluicegate.engine import Priority
from sluicegate.serving import predictions
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from tests.unit.test_serving_core import served


def run(body: dict[str, Any], ctx: RequestContext | None = None, limits: LimitsConfig | None = None) -> Any:
    async def go() -> Any:
        with served(limits) as model:
            return await predictions.predict(model, predictions.parse(body), ctx or RequestContext("r1"))
    return asyncio.run(go())


def refused(body: Any, limits: LimitsConfig | None = None) -> ApiError:
    with pytest.raises(ApiError) as info:
        if isinstance(body, dict):
            run(body, limits=limits)
        else:
            predictions.parse(body)
    return info.value


def test_prompt_prediction_record() -> None:
    rec = run({"input": {"prompt": "hello"}, "options": {"max_new_tokens": 5, "temperature": 0.0},
               "metadata": {"team": "a"}})
    assert re.fullmatch(r"pred_[0-9a-f]{24}", rec.id)
    assert rec.object == "prediction"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rec.created_at)
    assert rec.model.ref == f"{rec.model.name}@{rec.model.version}"
    assert rec.model.digest.startswith("sha256:")
    assert rec.metadata == {"team": "a"}
    assert len(rec.result.token_ids) == rec.usage.output_tokens <= 5
    assert rec.result.finish_reason in ("length", "eos", "stop")
    assert rec.result.seed is None  # greedy
    assert rec.usage.input_tokens > 0
    assert rec.usage.compute_ms == pytest.approx(rec.timing.prefill_ms + rec.timing.decode_ms)


def test_same_seed_same_tokens_and_messages_input() -> None:
    body = {"input": {"messages": [{"role": "user", "content": "hi"}]}, "options": {"seed": 3, "max_new_tokens": 6}}
    a, b = run(body), run(body)
    assert a.result.token_ids == b.result.token_ids and a.result.seed == 3
    assert a.id != b.id
    # the chat template's text is part of the prompt: more tokens than the bare message
    assert a.usage.input_tokens > run({"input": {"prompt": "hi"}}).usage.input_tokens


def test_batch_priority_and_tenant_reach_the_engine() -> None:
    ctx = RequestContext("r2", priority=Priority.BATCH, tenant="key_1")

    async def go() -> None:
        with served() as model:
            plan = await predictions.prepare(model, predictions.parse({"input": {"prompt": "x"}}), ctx)
            req = plan.runs.requests[0]
            assert (req.priority, req.tenant) == (Priority.BATCH, "key_1")
            await predictions.complete(model, plan, ctx)
    asyncio.run(go())


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"input": {}}, "input", "invalid_combination"),
    ({"input": {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}}, "input", "invalid_combination"),
    ({"input": {"messages": [{"role": "user", "content": "b"}]}, "options": {"parse_special": True}},
     "options.parse_special", "invalid_combination"),
    ({"input": {"prompt": "a"}, "options": {"temperature": 3.0}}, "options.temperature", "out_of_range"),
    ({"input": {"prompt": "a"}, "options": {"max_new_tokens": "5"}}, "options.max_new_tokens", "wrong_type"),
    ({"input": {"prompt": "a"}, "options": {"n": 2}}, "options.n", "unknown_field"),
    ({"input": {"prompt": "a"}, "extra": 1}, "extra", "unknown_field"),
    ({"input": {"prompt": ""}}, "input.prompt", "too_short"),
    ({"input": {"messages": [{"role": "tool", "content": "b"}]}}, "input.messages[0].role", "not_allowed"),
    ({"input": {"prompt": "a"}, "metadata": {"k": 5}}, "metadata.k", "wrong_type"),
    ({"input": {"prompt": "a"}, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "too_long"),
])
def test_refusals_name_the_parameter(body: dict[str, Any], param: str, code: str) -> None:
    err = refused(body)
    assert (err.type, err.param, err.code) == ("invalid_request", param, code)


def test_not_an_object() -> None:
    assert refused([1]).code == "wrong_type"


def test_model_resolution() -> None:
    rec = run({"input": {"prompt": "a"}})
    assert run({"input": {"prompt": "a"}, "model": rec.model.ref}).model == rec.model
    assert run({"input": {"prompt": "a"}, "model": rec.model.name}).model == rec.model
    err = refused({"input": {"prompt": "a"}, "model": rec.model.name + "@nope"})
    assert (err.type, err.code, err.param) == ("model_not_found", "model_version_not_found", "model")
    assert rec.model.version in err.message and "nope" not in err.message
    assert refused({"input": {"prompt": "a"}, "model": "other"}).code == "model_not_found"


def test_budget_rules_use_the_prediction_names() -> None:
    err = refused({"input": {"prompt": "a"}, "options": {"max_new_tokens": 50}},
                  limits=LimitsConfig(max_new_tokens=10))
    assert err.param == "options.max_new_tokens" and "10" in err.message
    err = refused({"input": {"prompt": "word " * 400}})  # the reference window is 256 tokens
    assert err.param == "input.prompt"
