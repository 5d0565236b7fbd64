"""The upstream wire, unit by unit: what is sent, how chunks read back, usage checks, metering a failure."""

from __future__ import annotations

import asyncio
import json

import pytest

from sluicegate.engine.client import OutputCollector
from sluicegate.engine.types import EngineRequest, FinishReason, RequestOutput, SamplingParams
from sluicegate.upstream.outputs import Sink, end
from sluicegate.upstream.wire import (
    UpstreamFailure,
    check_usage,
    failure_for_status,
    finish_reason,
    parse_chunk,
    request_body,
)


class Schema:
    def __init__(self) -> None:
        self.schema = {"type": "object"}


def req(**params: object) -> EngineRequest:
    return EngineRequest("r", [5, 6, 7], SamplingParams(**params))  # type: ignore[arg-type]


def test_the_body_sends_ids_and_only_what_is_set() -> None:
    body = request_body("m", req(max_new_tokens=3, temperature=0.0), token_ids=False)
    assert body == {"model": "m", "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0.0, "top_p": 1.0,
                    "stream": True, "stream_options": {"include_usage": True}}
    r = req(seed=4, stop=("x",), top_k=5, logprobs=2, logit_bias={3: -1.0})
    r.constraint = Schema()  # type: ignore[assignment]
    body = request_body("m", r, token_ids=True)
    assert (body["seed"], body["stop"], body["top_k"], body["logprobs"], body["logit_bias"]) == (
        4, ["x"], 5, 2, {"3": -1.0})
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}


def test_chunks_read_back_text_ids_and_logprobs_by_id() -> None:
    lp = {"tokens": ["token_id:9"], "token_logprobs": [-0.5], "top_logprobs": [{"token_id:9": -0.5,
                                                                                  "token_id:2": -1.5}]}
    c = parse_chunk(json.dumps({"choices": [{"text": "a", "token_ids": [9], "logprobs": lp,
                                             "finish_reason": None}]}))
    assert (c.text, c.token_ids) == ("a", [9])
    assert c.logprobs[0].token_id == 9 and c.logprobs[0].top == ((9, -0.5), (2, -1.5))
    for bad in ('{"choices": [{"text": 5}]}', "[]", '{"error": {"message": "x"}}', '{"usage": null}',
                json.dumps({"choices": [{"text": "", "logprobs": {"tokens": ["a"], "token_logprobs": [0]}}]})):
        with pytest.raises(UpstreamFailure):
            parse_chunk(bad)


def test_finish_reasons_and_usage() -> None:
    r = req(max_new_tokens=4, stop=("x",))
    assert finish_reason(parse_chunk('{"choices": [{"finish_reason": "length"}]}'), r) is FinishReason.LENGTH
    assert finish_reason(parse_chunk('{"choices": [{"finish_reason": "stop", "stop_reason": null}]}'),
                         r) is FinishReason.EOS
    assert finish_reason(parse_chunk('{"choices": [{"finish_reason": "stop"}]}'), r) is FinishReason.STOP
    assert check_usage({"prompt_tokens": 3, "completion_tokens": 2}, r, 2) == (3, 2, 0)
    for usage, got in (({"prompt_tokens": 4, "completion_tokens": 2}, 2), ({"prompt_tokens": 3,
                       "completion_tokens": 1}, 2), ({"prompt_tokens": 3, "completion_tokens": 9}, None),
                       ({"prompt_tokens": "3", "completion_tokens": 2}, 2)):
        with pytest.raises(UpstreamFailure):
            check_usage(usage, r, got)
    assert failure_for_status(503, "7").retryable and failure_for_status(503, "7").retry_after == 7
    assert not failure_for_status(400, None).retryable and not failure_for_status(400, None).counts_against
    assert failure_for_status(429, None).type == "upstream_unavailable"


def test_a_failed_run_is_metered_as_what_came() -> None:
    async def go() -> tuple[RequestOutput, RequestOutput]:
        sink = Sink(OutputCollector(1), 0)
        never = end(req(), FinishReason.ERROR, sink, UpstreamFailure("upstream_unavailable", "x", retry_after=2))
        sink.put(RequestOutput("r", [1, 2], "ab"))
        return never, end(req(), FinishReason.ERROR, sink, UpstreamFailure("upstream_error", "dropped"))

    never, dropped = asyncio.run(go())
    assert (never.prompt_tokens, never.completion_tokens, never.error_type, never.retry_after) == (
        0, 0, "upstream_unavailable", 2)
    assert (dropped.prompt_tokens, dropped.completion_tokens, dropped.error_type) == (3, 2, "upstream_error")
