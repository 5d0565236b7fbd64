"""/v1/chat/completions in process, on the reference backend: shapes, refusals, error mapping, SSE framing,
constrained output."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from sluicegate.backends.base import RunnerLimits
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config
from sluicegate.engine import SchedulerConfig
from sluicegate.errorcatalog import DEFAULT_DOCS_URL
from tests.api.threaded_server import SlowRunner
from tests.conftest import make_client, wait_ready

URL = "/v1/chat/completions"


@pytest.fixture
def client() -> Iterator[TestClient]:
    """The reference backend with a 2048-byte window: tool lists are long in a byte vocabulary."""
    with make_client(factory=lambda: ReferenceRunner(n_ctx=2048, n_slots=8)) as c:
        wait_ready(c)
        yield c


HI = [{"role": "user", "content": "Hi"}]


def chat(client: TestClient, **body: Any) -> Any:
    return client.post(URL, json={"model": "reference", "messages": HI, **body})


def sse(text: str) -> list[Any]:
    """The data of every event, `[DONE]` as the string; asserts the framing."""
    assert text.endswith("data: [DONE]\n\n")
    events = [e for e in text.split("\n\n") if e]
    out: list[Any] = []
    for e in events:
        lines = e.split("\n")
        if lines[0].startswith(":"):
            continue
        assert len(lines) == 1 and lines[0].startswith("data: "), e
        data = lines[0][len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    assert out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return out


def streamed_calls(chunks: list[Any], index: int = 0) -> list[dict[str, Any]]:
    """Tool-call deltas accumulated as the openai client does: by `index`, the id and name once, the
    arguments joined."""
    calls: dict[int, dict[str, Any]] = {}
    for ch in chunks[:-1]:
        for choice in ch["choices"]:
            if choice["index"] != index:
                continue
            for d in choice["delta"].get("tool_calls") or ():
                call = calls.setdefault(d["index"], {"function": {"arguments": ""}})
                if "id" in d:
                    assert "id" not in call, "a call's id is sent once"
                    call["id"], call["type"] = d["id"], d["type"]
                    call["function"]["name"] = d["function"]["name"]
                call["function"]["arguments"] += d["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]


def streamed_text(chunks: list[Any], index: int = 0) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks[:-1]
        if c["choices"] and c["choices"][0]["index"] == index
    )


def test_chat_completion_shape(client: TestClient) -> None:
    r = chat(client, max_tokens=6, seed=5)
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == "chatcmpl-" + r.headers["x-request-id"]
    assert body["object"] == "chat.completion"
    assert body["model"] == "reference@seed0"
    assert re.fullmatch(r"fp_[0-9a-f]{10}", body["system_fingerprint"])
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and 1 <= u["completion_tokens"] <= 6
    assert "cached_tokens" in u["prompt_tokens_details"]


def test_fingerprint_follows_weights_and_engine_config() -> None:
    fps = []
    for cfg in (Config(), Config(), Config(engine=SchedulerConfig(block_size=32))):
        with make_client(cfg) as c:
            wait_ready(c)
            fps.append(chat(c, max_tokens=1).json()["system_fingerprint"])
    assert fps[0] == fps[1] != fps[2]


class BatchVariantRunner(ReferenceRunner):
    """The reference model, declaring batch-dependent numerics (as llama.cpp with split-KV flash attention would)."""

    @property
    def limits(self) -> RunnerLimits:
        return dataclasses.replace(super().limits, batch_invariant=False)


def test_batch_dependent_numerics_change_the_fingerprint() -> None:
    fps = []
    for factory in (lambda: ReferenceRunner(n_ctx=512, n_slots=8), lambda: BatchVariantRunner(n_ctx=512, n_slots=8)):
        with make_client(Config(), factory) as c:
            wait_ready(c)
            fps.append(chat(c, max_tokens=1).json()["system_fingerprint"])
    assert fps[0] != fps[1]


def test_seeded_choices_replay_alone_and_usage_sums(client: TestClient) -> None:
    many = chat(client, max_tokens=8, seed=41, n=3, temperature=1.0).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    for i, c in enumerate(many["choices"]):
        alone = chat(client, max_tokens=8, seed=41 + i, temperature=1.0).json()
        assert alone["choices"][0]["message"]["content"] == c["message"]["content"]
    u = many["usage"]
    single = chat(client, max_tokens=8, seed=41).json()["usage"]["prompt_tokens"]
    assert u["prompt_tokens"] == 3 * single


def test_stream_framing_usage_and_equality(client: TestClient) -> None:
    body = {"max_tokens": 12, "seed": 7, "temperature": 0.8}
    whole = chat(client, **body).json()
    r = chat(client, **body, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = sse(r.text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    assert len({c["id"] for c in chunks[:-1]}) == 1
    usage_chunk = chunks[-2]
    # the same counts, but the second request found the first one's prompt in the prefix cache
    whole["usage"].pop("prompt_tokens_details")
    cached = usage_chunk["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert cached == whole["usage"]["prompt_tokens"] - 2  # all but the last two tokens
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole["usage"]
    assert all(c["usage"] is None for c in chunks[:-2])
    finish = [c for c in chunks[:-2] if c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["delta"] == {}
    assert finish[0]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert streamed_text(chunks) == whole["choices"][0]["message"]["content"]
    plain = sse(chat(client, **body, stream=True).text)
    assert all("usage" not in c for c in plain[:-1])  # not asked: never sent


def test_stream_n_choices(client: TestClient) -> None:
    body = {"max_tokens": 6, "seed": 3, "n": 2}
    whole = chat(client, **body).json()
    chunks = sse(chat(client, **body, stream=True).text)
    for i in range(2):
        assert streamed_text(chunks, i) == whole["choices"][i]["message"]["content"]


def test_logprobs(client: TestClient) -> None:
    body = chat(client, max_tokens=5, seed=1, logprobs=True, top_logprobs=3).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert 1 <= len(content) <= body["usage"]["completion_tokens"]
    for entry in content:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert bytes(entry["bytes"]).decode("utf-8", errors="backslashreplace") == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][-1]["logprob"]
    chunks = sse(chat(client, max_tokens=5, seed=1, logprobs=True, top_logprobs=3, stream=True).text)
    streamed = [e for c in chunks[:-1] for e in (c["choices"][0]["logprobs"] or {}).get("content") or []]
    assert streamed == content


SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "n", "color"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_validates(client: TestClient, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    body = chat(client, max_tokens=64, seed=seed, response_format=fmt).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_json_object_mode(client: TestClient) -> None:
    body = chat(
        client,
        max_tokens=200,
        seed=4,
        temperature=0.0,
        response_format={"type": "json_object"},
        logit_bias={"125": 8.0},
    ).json()  # bias '}' so the object ends soon
    text = body["choices"][0]["message"]["content"]
    assert isinstance(json.loads(text), dict)


WEATHER = {
    "type": "object",
    "properties": {"unit": {"enum": ["C", "F"]}, "days": {"type": "integer", "minimum": 1, "maximum": 3}},
    "required": ["unit", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"enum": ["UTC", "CET"]}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "clock", "description": "the time", "parameters": TIME}},
]


def test_named_tool_call(client: TestClient) -> None:
    choice = {"type": "function", "function": {"name": "weather"}}
    body = chat(client, max_tokens=160, seed=2, tools=TOOLS, tool_choice=choice).json()
    c = body["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
    (call,) = c["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    chunks = sse(chat(client, max_tokens=160, seed=2, tools=TOOLS, tool_choice=choice, stream=True).text)
    first = chunks[0]["choices"][0]["delta"]
    assert first["tool_calls"][0]["function"] == {"name": "weather", "arguments": ""}
    args = "".join(
        d["tool_calls"][0]["function"]["arguments"]
        for ch in chunks[1:-1]
        if (d := ch["choices"][0]["delta"]).get("tool_calls")
    )
    assert args == call["function"]["arguments"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_required_tool_call(client: TestClient) -> None:
    for seed in (1, 2, 3):
        body = chat(client, max_tokens=160, seed=seed, tools=TOOLS, tool_choice="required",
                    parallel_tool_calls=False).json()
        c = body["choices"][0]
        assert c["finish_reason"] == "tool_calls"
        (call,) = c["message"]["tool_calls"]
        schema = {"weather": WEATHER, "clock": TIME}[call["function"]["name"]]
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
        chunks = sse(chat(client, max_tokens=160, seed=seed, tools=TOOLS, tool_choice="required",
                          parallel_tool_calls=False, stream=True).text)
        (streamed,) = streamed_calls(chunks)
        assert streamed["function"] == call["function"]
        pieces = [d for ch in chunks[:-1] for d in ch["choices"][0]["delta"].get("tool_calls") or ()]
        assert pieces[0]["function"] == {"name": call["function"]["name"], "arguments": ""} and "id" in pieces[0]
        assert all("id" not in p and "name" not in p["function"] for p in pieces[1:])


def test_parallel_tool_calls_permits_and_never_requires_several_calls(client: TestClient) -> None:
    """`true` (OpenAI's default) allows several calls; a choice here makes one, which satisfies it, so the answer
    is the same as with `false` or without the field (as vLLM and OpenAI read it)."""
    calls = [
        chat(client, max_tokens=80, seed=3, tools=TOOLS, tool_choice="required", **extra).json()["choices"][0]
        ["message"]["tool_calls"]
        for extra in ({"parallel_tool_calls": True}, {"parallel_tool_calls": False}, {})
    ]
    assert len(calls[0]) == 1
    assert calls[0][0]["function"] == calls[1][0]["function"] == calls[2][0]["function"]  # ids are per call


def test_tool_choice_none_generates_text(client: TestClient) -> None:
    c = chat(client, max_tokens=4, seed=1, tools=TOOLS, tool_choice="none").json()["choices"][0]
    assert c["message"]["tool_calls"] is None and isinstance(c["message"]["content"], str)


def test_multibyte_characters_are_never_split_in_a_stream() -> None:
    """The reference vocabulary is bytes, so every non-ASCII character below spans several tokens. Deltas
    merge when the reader lags (engine/client.py), so each step takes 5 ms here, as a real one does."""
    with make_client(factory=lambda: SlowRunner(delay_s=0.005, n_ctx=512, n_slots=8)) as client:
        wait_ready(client)
        _check_multibyte_stream(client)


def _check_multibyte_stream(client: TestClient) -> None:
    text = "héllo wörld, 日本語, Привет, مرحبا, 👩‍👩‍👧 🇺🇦 ✨"
    schema = {
        "type": "object",
        "properties": {"s": {"const": text}},
        "required": ["s"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    r = chat(client, max_tokens=200, seed=9, response_format=fmt, stream=True)
    chunks = sse(r.text)
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks[:-1] if c["choices"]]
    assert all("\ufffd" not in (d or "") for d in deltas)
    assert json.loads("".join(d or "" for d in deltas)) == {"s": text}
    assert len([d for d in deltas if d]) > 3  # really incremental


def test_stop_strings_are_held_back(client: TestClient) -> None:
    whole = chat(client, max_tokens=30, seed=11).json()["choices"][0]["message"]["content"]
    stop = whole[5:7]
    if not stop.strip() or "\ufffd" in stop:
        pytest.skip("the sampled text has no usable stop string")
    cut = chat(client, max_tokens=30, seed=11, stop=[stop]).json()["choices"][0]
    assert cut["message"]["content"] == whole[: whole.index(stop)] and cut["finish_reason"] == "stop"
    chunks = sse(chat(client, max_tokens=30, seed=11, stop=[stop], stream=True).text)
    assert streamed_text(chunks) == cut["message"]["content"]


# -- refusals: named, with what is supported ---------------------------------------------------------------

UNSUPPORTED = [
    "audio",
    "modalities",
    "prediction",
    "service_tier",
    "store",
    "metadata",
    "reasoning_effort",
    "web_search_options",
    "functions",
    "function_call",
    "prompt_cache_key",
    "verbosity",
]


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_known_unsupported_parameters_are_refused_by_name(client: TestClient, name: str) -> None:
    r = chat(client, **{name: {"x": 1} if name in ("metadata", "web_search_options") else "x"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "unsupported_parameter"
    assert err["param"] == name and "supported: model, messages" in err["message"]
    assert err["request_id"] == r.headers["x-request-id"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"frobnicate": 1}, "frobnicate", "unknown_field"),
        (
            {"messages": [{"role": "user", "content": "x", "name": "bob"}]},
            "messages[0].name",
            "unsupported_parameter",
        ),
        (
            {"messages": [{"role": "function", "content": "x", "name": "f"}]},
            "messages[0].role",
            "unsupported_role",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0].type",
            "unsupported_content",
        ),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "wrong_type"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_field"),
        ({"tools": TOOLS, "stop": ["x"]}, "stop", "invalid_combination"),
        ({"tools": TOOLS, "tool_choice": "auto", "response_format": {"type": "json_object"}}, "response_format",
         "invalid_combination"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_combination"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
            "unknown_function",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type", "unsupported_value"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
            "response_format.json_schema.schema",
            "unsupported_schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}, "extra": 1},
                }
            },
            "response_format.json_schema.extra",
            "unknown_field",
        ),
        ({"response_format": {"type": "json_object"}, "stop": ["}"]}, "stop", "invalid_combination"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_combination"),
        (
            {"stream": True, "stream_options": {"include_obfuscation": False}},
            "stream_options.include_obfuscation",
            "unsupported_parameter",
        ),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_combination"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "out_of_range"),
        ({"max_tokens": 2, "max_completion_tokens": 2}, "max_tokens", "invalid_combination"),
        ({"n": 9}, "n", "out_of_range"),
        ({"seed": -1}, "seed", "out_of_range"),
        ({"logit_bias": {"258": 1}}, "logit_bias", "invalid_token_id"),
        ({"logit_bias": {"1": 150}}, "logit_bias.1", "out_of_range"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
            "messages",
            "unsupported_value",
        ),
        ({"max_tokens": 100_000}, "max_tokens", "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "x" * 2100}]}, "messages", "prompt_too_long"),
    ],
)
def test_refusals(client: TestClient, body: dict[str, Any], param: str, code: str) -> None:
    r = chat(client, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code), err


def test_error_statuses() -> None:
    with make_client() as c:
        # before the model is loaded? (the reference loads at once; readiness is covered elsewhere)
        wait_ready(c)
        r = c.post(URL, json={"model": "gpt-4o", "messages": HI})
        assert r.status_code == 404
        assert r.json()["error"] | {"message": "", "request_id": ""} == {
            "type": "invalid_request_error",
            "code": "model_not_found",
            "param": "model",
            "message": "",
            "request_id": "",
            "docs_url": f"{DEFAULT_DOCS_URL}#model_not_found",  # our type's entry: the code equals it
        }
        r = c.post(URL, content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = c.post(URL, content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["type"] == "unsupported_media_type"
        assert c.get(URL).status_code == 405
    with make_client(Config(engine=SchedulerConfig(max_waiting=0))) as c:
        wait_ready(c)
        for stream in (False, True):
            r = c.post(URL, json={"model": "reference", "messages": HI, "stream": stream})
            assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded"
            assert r.headers["retry-after"].isdigit()


def test_user_is_recorded_with_the_request(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="sluicegate.openai"):
        r = chat(client, max_tokens=1, user="user-42", safety_identifier="sid-7")
        client.post("/v1/completions", json={"model": "reference", "prompt": "x", "max_tokens": 1, "user": "u-9"})
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "sluicegate.openai"]
    assert f"{r.headers['x-request-id']} user='user-42' safety_identifier='sid-7'" in lines
    assert any(line.endswith("user='u-9'") for line in lines)


def test_a_length_cut_inside_a_character_drops_the_partial_character(client: TestClient) -> None:
    schema = {
        "type": "object",
        "properties": {"s": {"const": "日本"}},
        "required": ["s"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    body = chat(client, max_tokens=8, seed=1, response_format=fmt).json()  # `{"s": "` is 7 bytes, 日 is 3
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == '{"s": "'
    chunks = sse(chat(client, max_tokens=8, seed=1, response_format=fmt, stream=True).text)
    assert streamed_text(chunks) == '{"s": "'
