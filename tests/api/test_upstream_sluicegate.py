"""A sluicegate whose upstream is another sluicegate (both on the reference backend, real sockets): the probe
suite passes unchanged through the hop, and the hop changes no answer: the same request gives the same
tokens, logprobs and JSON directly and through the front."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluicegate.contract.probe_runner import run_probes
from sluicegate.contract.probes import ProbeOptions, all_probes
from sluicegate.testing.refserver import RefServer, running


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RefServer, RefServer]]:
    logs: Path = tmp_path_factory.mktemp("logs")
    with running(logs, "--eos-slope", "0.2") as upstream, running(
        logs, "--eos-slope", "0.2", "--no-local-model", "--upstream", f"reference={upstream.url}/v1",
        timeout=60.0,
    ) as front:
        yield upstream, front


# What the hop cannot carry, refused by name (docs/upstream.md): `auto`'s grammar is no JSON schema.
REFUSED_THROUGH_THE_HOP = {"chat:tools_auto", "messages:tools_auto", "messages:tool_choice_auto",
                          "responses:tools_auto"}


def test_the_probe_suite_passes_through_the_hop(pair: tuple[RefServer, RefServer]) -> None:
    _, front = pair
    with httpx.Client(base_url=front.url, timeout=60) as client:
        results = run_probes(client, all_probes(ProbeOptions(model="reference")))
        failed = {r.probe.name for r in results if not r.passed()}
        assert failed == REFUSED_THROUGH_THE_HOP, failed
        for r in results:
            if r.probe.name in REFUSED_THROUGH_THE_HOP:
                assert r.status == 400 and r.envelope, r.probe.name
                body = r.probe.body if isinstance(r.probe.body, bytes) else None
                resp = client.request(r.probe.method, r.probe.path, content=body, headers=dict(r.probe.headers))
                assert resp.json()["error"]["code"] == "unsupported_for_model"
                assert resp.json()["error"]["param"] == "tool_choice"


def both(pair: tuple[RefServer, RefServer], path: str, body: dict[str, Any]) -> tuple[Any, Any]:
    out = []
    for srv in pair:
        r = httpx.post(srv.url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out[0], out[1]


def test_generate_is_the_same_tokens_and_usage(pair: tuple[RefServer, RefServer]) -> None:
    direct, front = both(pair, "/v1/generate", {"prompt": "Once upon a time", "max_new_tokens": 12, "seed": 7})
    assert front["token_ids"] == direct["token_ids"] and front["text"] == direct["text"]
    assert front["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    assert front["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"] == len(front["token_ids"])
    assert front["finish_reason"] == direct["finish_reason"] and front["seed"] == 7
    assert front["model"] == {"name": "reference", "version": "upstream", "digest": "unknown"}


def test_chat_logprobs_and_json_are_the_same(pair: tuple[RefServer, RefServer]) -> None:
    msgs = [{"role": "user", "content": "Give me an object"}]
    body = {"model": "reference", "messages": msgs, "max_tokens": 8, "temperature": 0, "logprobs": True,
            "top_logprobs": 2}
    direct, front = both(pair, "/v1/chat/completions", body)
    assert front["choices"][0]["logprobs"] == direct["choices"][0]["logprobs"]
    assert front["choices"][0]["logprobs"]["content"]
    body = {"model": "reference", "messages": msgs, "max_tokens": 40, "temperature": 0,
            "response_format": {"type": "json_object"}}
    direct, front = both(pair, "/v1/chat/completions", body)
    assert front["choices"][0]["message"] == direct["choices"][0]["message"]
    if front["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(front["choices"][0]["message"]["content"]), dict)


def test_a_stream_through_the_hop_ends_with_done(pair: tuple[RefServer, RefServer]) -> None:
    _, front = pair
    body = {"model": "reference", "prompt": "Hello", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=60) as r:
        data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["usage"]["completion_tokens"] >= 1


def test_messages_through_the_hop_are_the_same(pair: tuple[RefServer, RefServer]) -> None:
    """Anthropic's Messages in front of an upstream engine: rendered here, generated there, shaped here."""
    body: dict[str, Any] = {"model": "reference", "max_tokens": 10, "temperature": 0, "system": "Be brief.",
                            "messages": [{"role": "user", "content": "Once upon a time"}]}
    direct, front = both(pair, "/v1/messages", body)
    assert front["content"] == direct["content"] and front["stop_reason"] == direct["stop_reason"]
    assert front["usage"]["output_tokens"] == direct["usage"]["output_tokens"]
    text = direct["content"][0]["text"]
    if len(text) > 3:  # a stop sequence from the text: reported by name through the hop too
        stop = text[2:4]
        direct, front = both(pair, "/v1/messages", {**body, "stop_sequences": ["\u2603", stop]})
        assert front["stop_reason"] == direct["stop_reason"] == "stop_sequence"
        assert front["stop_sequence"] == direct["stop_sequence"] == stop
    stream = httpx.post(pair[1].url + "/v1/messages", json={**body, "stream": True}, timeout=60)
    assert stream.status_code == 200 and stream.text.endswith('event: message_stop\ndata: {"type": "message_stop"}\n\n')


def test_responses_through_the_hop_are_the_same(pair: tuple[RefServer, RefServer]) -> None:
    """/v1/responses goes to the upstream's chat route: the same text and JSON as direct; a named call is the same
    call (the upstream writes it as bare JSON under a schema, the direct server in its model's syntax: the
    arguments are each valid, not the same bytes)."""
    tool = {"type": "function", "name": "clock", "parameters": {
        "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}}
    for extra in ({}, {"text": {"format": {"type": "json_object"}}}):
        body = {"model": "reference", "input": "Hi", "max_output_tokens": 40, "temperature": 0, **extra}
        direct, front = both(pair, "/v1/responses", body)
        strip = [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in direct["output"]]
        assert [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in front["output"]] == strip
        assert front["status"] == direct["status"] and front["model"] == "reference@upstream"
    body = {"model": "reference", "input": "Hi", "max_output_tokens": 120, "temperature": 0, "tools": [tool],
            "tool_choice": {"type": "function", "name": "clock"}}
    for answer in both(pair, "/v1/responses", body):
        assert answer["status"] == "completed", answer
        (call,) = answer["output"]
        assert call["type"] == "function_call" and call["name"] == "clock"
        assert json.loads(call["arguments"])["tz"] in ("UTC", "CET")
    r = httpx.post(pair[1].url + "/v1/responses", json={"model": "reference", "input": "Hi", "tools": [tool]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
