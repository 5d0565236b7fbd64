"""Anthropic's /v1/messages and /v1/messages/count_tokens in process, on the reference backend: shapes, the
stream's framing, refusals by name, Anthropic's error shape and statuses from every layer that can refuse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config, LimitsConfig
from tests.conftest import make_client, wait_ready

URL = "/v1/messages"
HI = [{"role": "user", "content": "Hi"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]}}


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client(factory=lambda: ReferenceRunner(n_ctx=2048, n_slots=8)) as c:
        wait_ready(c)
        yield c


def create(client: TestClient, **body: Any) -> Any:
    return client.post(URL, json={"model": "reference", "max_tokens": 8, "messages": HI, **body})


def events(text: str) -> list[tuple[str, Any]]:
    """(name, data) of every event; asserts that each event is named after its data's type."""
    out = []
    for raw in text.split("\n\n"):
        if not raw:
            continue
        lines = raw.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), raw
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


def error_of(r: Any, status: int, kind: str, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["request_id"] == r.headers["x-request-id"] == r.headers["request-id"]
    if param is not None:
        assert body["error"]["param"] == param, body
    return dict(body["error"])


def test_a_message(client: TestClient) -> None:
    r = client.post(
        URL, json={"model": "reference", "max_tokens": 8, "messages": HI, "system": "Be brief.", "temperature": 0,
                   "top_k": 5, "metadata": {"user_id": "u-1"}},
        headers={"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31"})
    assert r.status_code == 200, r.text
    msg = r.json()
    assert r.headers["request-id"] == r.headers["x-request-id"] and msg["id"] == "msg_" + r.headers["request-id"]
    assert (msg["type"], msg["role"], msg["model"]) == ("message", "assistant", "reference@seed0")
    assert msg["stop_reason"] == "max_tokens" and msg["stop_sequence"] is None
    assert [b["type"] for b in msg["content"]] == ["text"]
    usage = msg["usage"]
    assert usage["output_tokens"] == 8 and usage["cache_creation_input_tokens"] == 0
    counted = client.post(URL + "/count_tokens", json={"model": "reference", "messages": HI, "system": "Be brief."})
    assert counted.status_code == 200 and counted.json() == {
        "input_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"]}


def test_the_stream_is_anthropics_events(client: TestClient) -> None:
    whole = create(client, temperature=0).json()
    r = create(client, temperature=0, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    names = [n for n, _ in evs]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"} and "[DONE]" not in r.text
    start = evs[0][1]["message"]
    assert start["stop_reason"] is None and start["content"] == [] and start["id"] == "msg_" + r.headers["request-id"]
    text = "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta")
    assert text == whole["content"][0]["text"]
    delta = evs[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8


def test_tool_choice_tool_and_any(client: TestClient) -> None:
    named = create(client, max_tokens=200, tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    msg = named.json()
    assert named.status_code == 200, named.text
    if msg["stop_reason"] == "tool_use":  # the reference model may run out of tokens mid-call
        (block,) = msg["content"]
        assert block["type"] == "tool_use" and block["name"] == "get_weather" and isinstance(block["input"], dict)
    else:  # cut by max_tokens: the call as far as its input's last whole value, or text before its name was whole
        assert msg["stop_reason"] == "max_tokens"
        block = msg["content"][0]
        assert block["type"] == "text" or (block["name"] == "get_weather" and isinstance(block["input"], dict))
    cut = create(client, max_tokens=3, tools=[TOOL], tool_choice={"type": "any"})
    assert cut.json()["stop_reason"] == "max_tokens" and cut.json()["content"][0]["type"] == "text"
    streamed = create(client, max_tokens=3, tools=[TOOL], tool_choice={"type": "any"}, stream=True)
    evs = events(streamed.text)
    assert [n for n, _ in evs][1] == "content_block_start" and evs[1][1]["content_block"]["type"] == "text"
    none = create(client, tools=[TOOL], tool_choice={"type": "none"})
    assert none.status_code == 200 and none.json()["content"][0]["type"] == "text"


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"thinking": {"type": "enabled"}}, "thinking", "unsupported_parameter"),
    ({"frobnicate": 1}, "frobnicate", "unknown_field"),
    ({"max_tokens": None}, "max_tokens", None),
    ({"temperature": 1.5}, "temperature", None),
    ({"temperature": "hot"}, "temperature", None),
    ({"top_k": -1}, "top_k", None),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences", None),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type",
     "unsupported_content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": []}]}]},
     "messages[0].content[0].citations", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {}}]}]}]}, "messages[0].content[0].content[0].type", "unsupported_content"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "unsupported_role"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type", "misplaced_block"),
    ({"messages": [*HI, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}, *HI]},
     "messages[1].content[0].type", "misplaced_block"),
    ({"messages": [*HI, {"role": "assistant", "content": "Sure"}]}, "messages", "unsupported_value"),
    ({"system": [{"type": "image"}]}, "system[0].type", "unsupported_content"),
    ({"metadata": {"user_id": "u", "tier": 1}}, "metadata.tier", "unknown_field"),
    ({"tools": [TOOL], "stop_sequences": ["x"]}, "stop_sequences", "invalid_combination"),
    ({"tools": [TOOL], "tool_choice": {"type": "auto", "frob": 1}}, "tool_choice.frob", "unknown_field"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "invalid_combination"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name", "unknown_function"),
    ({"tools": [TOOL, TOOL], "tool_choice": {"type": "any"}}, "tools", "duplicate_function"),
    ({"tools": [TOOL], "tool_choice": {"type": "any"}, "stop_sequences": ["x"]}, "stop_sequences",
     "invalid_combination"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "any"}},
     "tools[0].type", "unsupported_tool"),
    ({"tools": [{**TOOL, "input_examples": []}], "tool_choice": {"type": "any"}}, "tools[0].input_examples",
     "unsupported_parameter"),
    ({"tools": [{**TOOL, "input_schema": {"type": "object", "properties": {"a": {"type": "string",
      "format": "no-such-format"}}}}], "tool_choice": {"type": "tool", "name": "get_weather"}},
     "tools[0].input_schema", "unsupported_schema"),
    ({"max_tokens": 1 << 17}, "max_tokens", "context_length_exceeded"),
    ({"model": "nope"}, "model", "model_not_found"),
])
def test_refused_by_name(client: TestClient, body: dict[str, Any], param: str, code: str | None) -> None:
    r = create(client, **body)
    status, kind = (404, "not_found_error") if code == "model_not_found" else (400, "invalid_request_error")
    err = error_of(r, status, kind, param)
    if code is not None:
        assert err["code"] == code


def test_cache_control_is_taken_everywhere(client: TestClient) -> None:
    cc = {"type": "ephemeral"}
    r = create(client, cache_control=cc, system=[{"type": "text", "text": "S", "cache_control": cc}],
               messages=[{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {
                   "type": "ephemeral", "ttl": "1h"}}]}])
    assert r.status_code == 200, r.text
    error_of(create(client, cache_control={"type": "persistent"}), 400, "invalid_request_error")


def test_count_tokens_takes_the_prompt_fields_only(client: TestClient) -> None:
    r = client.post(URL + "/count_tokens", json={"model": "reference", "messages": HI, "max_tokens": 4})
    error_of(r, 400, "invalid_request_error", "max_tokens")
    tools = client.post(URL + "/count_tokens", json={"model": "reference", "messages": HI, "tools": [TOOL],
                                                     "tool_choice": {"type": "any"}})
    plain = client.post(URL + "/count_tokens", json={"model": "reference", "messages": HI})
    assert tools.json()["input_tokens"] > plain.json()["input_tokens"] > 0
    error_of(client.post(URL + "/count_tokens", json={"model": "x", "messages": HI}), 404, "not_found_error")


def test_errors_from_outside_the_route_take_anthropics_shape(client: TestClient) -> None:
    error_of(client.post(URL, content=b"{", headers={"content-type": "application/json"}), 400,
             "invalid_request_error")
    error_of(client.post(URL, content=b"{}", headers={"content-type": "text/plain"}), 415, "invalid_request_error")
    error_of(client.get(URL), 405, "invalid_request_error")
    deadline = client.post(URL, json={"model": "reference", "max_tokens": 2, "messages": HI},
                           headers={"X-Request-Timeout": "soon"})
    error_of(deadline, 400, "invalid_request_error", "X-Request-Timeout")
    # other routes keep their own envelope
    other = client.post("/v1/chat/completions", json={"model": "nope", "messages": HI})
    assert other.status_code == 404 and "type" not in other.json()


def test_a_body_over_the_limit_is_request_too_large() -> None:
    with make_client(Config(limits=LimitsConfig(max_body_bytes=256))) as c:
        wait_ready(c)
        big = [{"role": "user", "content": "x" * 400}]
        r = c.post(URL, json={"model": "reference", "max_tokens": 2, "messages": big})
        error_of(r, 413, "request_too_large")
