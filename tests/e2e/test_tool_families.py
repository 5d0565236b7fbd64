"""Tool calls in each family's own syntax, end to end: the real SmolLM2 weights served with each family's real
chat template (`--chat-template-file`, llama.cpp's models/templates/), over a real socket. A required call is
generated in that family's syntax (the raw output, read back from the logprobs' tokens, starts with its
trigger), parsed back to the same `tool_calls` whole and streamed, and the next turn, with the call and its
result, renders. And on the default model: arguments never carry an undeclared property, and a call cut by
max_tokens comes back as far as it got with finish reason `length`, on every surface."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.serving.tool_calls import parse
from sluicegate.serving.tool_formats import by_name
from tests.e2e.conftest import Server, start_server, stop_server

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
FAMILIES = {
    "hermes": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "llama3": "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "granite": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "firefunction": "fireworks-ai-llama-3-firefunction-v2.jinja",
    "command-r7b": "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
    "deepseek-r1": "llama-cpp-deepseek-r1.jinja",
    "phi4": "llama-cpp-microsoft-Phi-4-mini-instruct.jinja",
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server]]:
    name = request.param
    srv = start_server(tmp_path_factory.mktemp(name), "--slots", "2",
                       "--chat-template-file", str(TEMPLATES / FAMILIES[name]))
    yield name, srv
    stop_server(srv)


def chat(srv: Server, **body: Any) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "smollm2-135m-instruct", **body},
                      timeout=120.0)


def streamed(srv: Server, **body: Any) -> tuple[list[dict[str, Any]], str | None, str]:
    """The calls a stream assembles, its finish reason, and its content."""
    calls: dict[int, dict[str, Any]] = {}
    finish, content = None, ""
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", timeout=120.0,
                      json={"model": "smollm2-135m-instruct", "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or ():
                c = calls.setdefault(tc["index"], {"id": tc.get("id"), "name": "", "arguments": ""})
                c["name"] += (tc.get("function") or {}).get("name") or ""
                c["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return [calls[i] for i in sorted(calls)], finish, content


def test_a_required_call_is_written_in_the_familys_syntax_and_read_back(family: tuple[str, Server]) -> None:
    name, srv = family
    card = httpx.get(f"{srv.url}/v1/models/smollm2-135m-instruct", timeout=10.0).json()["chat"]
    assert card["template"] == "file" and card["tool_format"] == name
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 200, "temperature": 0,
            "parallel_tool_calls": False}
    r = chat(srv, logprobs=True, **body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    raw = b"".join(bytes(t["bytes"]) for t in choice["logprobs"]["content"]).decode()  # what the model wrote
    fmt = by_name(name)
    assert raw.lstrip().startswith(fmt.trigger.strip()) or (card["reasoning"] and card["reasoning"][1] in raw)
    parsed = parse("required", raw, None, fmt).complete_calls()
    (call,) = choice["message"]["tool_calls"]
    assert [(c.name, c.arguments) for c in parsed] == [(call["function"]["name"], call["function"]["arguments"])]
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}
    if name == "mistral":
        assert len(call["id"]) == 9 and call["id"].isalnum()
    calls, finish, _ = streamed(srv, **body)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [(call["function"]["name"], call["function"]["arguments"])]
    # the next turn: the call and its result, rendered the template's way (or written for it)
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "18 C and sunny"}]
    count = httpx.post(f"{srv.url}/tokenize", json={"messages": turn, "tools": TOOLS, "model": "smollm2-135m-instruct"},
                       timeout=30.0)
    assert count.status_code == 200, count.text
    follow = chat(srv, messages=turn, tools=TOOLS, max_tokens=8, temperature=0)
    assert follow.status_code == 200, follow.text
    assert follow.json()["usage"]["prompt_tokens"] == count.json()["count"]


def test_an_undeclared_argument_is_never_generated(server: Server) -> None:
    """`get_weather(city)` with no `additionalProperties`: 100 sampled calls, none with another key."""
    keys: set[str] = set()
    n = 0
    for seed in range(13):
        r = chat(server, messages=ASK, tools=TOOLS, n=8, seed=seed, temperature=1.0, max_tokens=96,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"]:
            if choice["finish_reason"] == "tool_calls":
                (call,) = choice["message"]["tool_calls"]
                keys |= set(json.loads(call["function"]["arguments"]))
                n += 1
    assert keys == {"city"} and n >= 100


LONG = {"type": "object", "properties": {"city": {"type": "string", "minLength": 200}}, "required": ["city"]}
LONG_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": LONG}}]


def test_a_call_cut_by_max_tokens_comes_back_as_far_as_it_got(server: Server) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"messages": ASK, "tools": LONG_TOOLS, "tool_choice": named, "max_tokens": 32, "temperature": 0}
    choice = chat(server, **body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["function"]["arguments"].startswith('{"city": "')
    calls, finish, _ = streamed(server, **body)
    assert finish == "length" and [c["arguments"] for c in calls] == [call["function"]["arguments"]]
    # Responses: the call, incomplete; Messages: the tool_use block, its input closed where it was cut
    resp = httpx.post(f"{server.url}/v1/responses", timeout=120.0, json={
        "model": "smollm2-135m-instruct", "input": ASK[0]["content"], "max_output_tokens": 32, "temperature": 0,
        "tools": [{"type": "function", "name": "get_weather", "parameters": LONG}],
        "tool_choice": {"type": "function", "name": "get_weather"}}).json()
    assert resp["status"] == "incomplete"
    [item] = [i for i in resp["output"] if i["type"] == "function_call"]
    assert item["status"] == "incomplete" and item["arguments"] == call["function"]["arguments"]
    msg = httpx.post(f"{server.url}/v1/messages", timeout=120.0, json={
        "model": "smollm2-135m-instruct", "messages": ASK, "max_tokens": 32, "temperature": 0,
        "tools": [{"name": "get_weather", "input_schema": LONG}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }).json()
    assert msg["stop_reason"] == "max_tokens"
    [block] = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert block["name"] == "get_weather" and isinstance(block["input"], dict)
