"""The official `anthropic` client, unmodified, against the real server (SmolLM2 on llama.cpp) on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from sluicegate.contract.probe_runner import run_probes, totals
from sluicegate.contract.probes import ProbeOptions, all_probes
from tests.e2e.conftest import Server

MODEL = "smollm2-135m-instruct"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                     "required": ["city"], "additionalProperties": False},
}
TIME = {
    "name": "get_time",
    "input_schema": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
                     "additionalProperties": False},
}


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="sk-unused", max_retries=0, timeout=120) as c:
        yield c


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_create(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=12, system="You are terse.", messages=user("What is the capital of France?"),
        extra_body={"temperature": 0},
    )
    assert raw.request_id and raw.request_id == raw.headers["x-request-id"]
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant" and msg.model == f"{MODEL}@q4_1"
    assert msg.id == f"msg_{raw.request_id}"
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert len(msg.content) == 1 and msg.content[0].type == "text" and msg.content[0].text
    assert 1 <= msg.usage.output_tokens <= 12 and msg.usage.input_tokens > 0
    assert msg.usage.cache_read_input_tokens is not None
    counted = client.messages.count_tokens(model=MODEL, system="You are terse.",
                                           messages=user("What is the capital of France?"))
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens


def test_stream_equals_whole(client: anthropic.Anthropic) -> None:
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 20, "messages": user("Tell me about cats."),
                          "extra_body": {"temperature": 0, "top_k": 40}}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert whole.content[0].type == "text" and text == whole.content[0].text
    assert [b.model_dump(include={"type", "text"}) for b in final.content] == [
        b.model_dump(include={"type", "text"}) for b in whole.content]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert (final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
            == whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0))


def test_raw_stream_events(client: anthropic.Anthropic) -> None:
    events = list(client.messages.create(model=MODEL, max_tokens=5, messages=user("Hi"), stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) <= {"content_block_delta"}
    start, delta = events[0], events[-2]
    assert start.type == "message_start" and start.message.stop_reason is None
    assert delta.type == "message_delta" and delta.delta.stop_reason in ("end_turn", "max_tokens")


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": user("Count from one to ten in words."),
                          "extra_body": {"temperature": 0}}
    free = client.messages.create(**kw)
    assert free.content[0].type == "text"
    words = free.content[0].text.split()
    assert len(words) >= 3
    stop = words[2][:10]
    cut = client.messages.create(**kw, stop_sequences=["\u2603", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].type == "text" and stop not in cut.content[0].text
    assert free.content[0].text.startswith(cut.content[0].text)


def test_named_tool(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model=MODEL, max_tokens=40, messages=user("What's the weather in Paris?"), tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert msg.stop_reason == "tool_use"
    (block,) = msg.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, WEATHER["input_schema"])


def test_any_tool_streamed_equals_whole(client: anthropic.Anthropic) -> None:
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 60, "messages": user("What time is it in Berlin?"),
                          "tools": [WEATHER, TIME], "tool_choice": {"type": "any"}, "extra_body": {"temperature": 0}}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    for msg in (whole, final):
        assert msg.stop_reason == "tool_use"
        (block,) = msg.content
        assert block.type == "tool_use" and block.name in ("get_weather", "get_time")
        jsonschema.validate(block.input, (WEATHER if block.name == "get_weather" else TIME)["input_schema"])
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (b.name, b.input) for b in whole.content if b.type == "tool_use"]


def test_named_tool_streams_input_json(client: anthropic.Anthropic) -> None:
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 40, "messages": user("Weather in Rome?"), "tools": [WEATHER],
                          "tool_choice": {"type": "tool", "name": "get_weather"}, "extra_body": {"temperature": 0}}
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        pieces = [e.partial_json for e in stream if e.type == "input_json"]
        final = stream.get_final_message()
    assert len(pieces) > 1  # the input arrives in pieces as it is generated
    assert final.content[0].type == "tool_use" and whole.content[0].type == "tool_use"
    assert final.content[0].input == whole.content[0].input and final.stop_reason == "tool_use"


def test_tool_result_conversation(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model=MODEL, max_tokens=16, tools=[WEATHER], tool_choice={"type": "none"},
        messages=[
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C and sunny"},
                {"type": "text", "text": "Tell me in one sentence."}]},
        ],
    )
    assert msg.content[0].type == "text" and msg.stop_reason in ("end_turn", "max_tokens")


def test_tools_without_tool_choice_are_auto(client: anthropic.Anthropic) -> None:
    """Anthropic's default: the model answers or calls; a call is always valid, streamed or not alike."""
    for question in ("What's the weather in Paris? Use the tool.", "Say hello to me."):
        kw: dict[str, Any] = {"model": MODEL, "max_tokens": 60, "messages": user(question), "tools": [WEATHER],
                              "extra_body": {"temperature": 0}}
        whole = client.messages.create(**kw)
        with client.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        for msg in (whole, final):
            calls = [b for b in msg.content if b.type == "tool_use"]
            for b in calls:
                assert b.name == "get_weather"
                jsonschema.validate(b.input, WEATHER["input_schema"])
            assert msg.stop_reason in (("tool_use",) if calls else ("end_turn", "max_tokens"))
        assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
            (b.type, getattr(b, "input", None)) for b in whole.content]


def test_errors_are_typed(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="no-such-model", max_tokens=4, messages=user("Hi"))
    assert nf.value.request_id and isinstance(nf.value.body, dict)
    assert nf.value.body["type"] == "error" and nf.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=MODEL, max_tokens=4, messages=user("Hi"), thinking={"type": "disabled"})
    assert isinstance(bad.value.body, dict) and bad.value.body["error"]["param"] == "thinking"
    with pytest.raises(anthropic.BadRequestError) as stop:
        client.messages.create(model=MODEL, max_tokens=4, messages=user("Hi"), tools=[WEATHER], stop_sequences=["}"])
    assert isinstance(stop.value.body, dict) and stop.value.body["error"]["param"] == "stop_sequences"
    with pytest.raises(anthropic.BadRequestError) as window:
        client.messages.create(model=MODEL, max_tokens=1 << 17, messages=user("Hi"))
    assert isinstance(window.value.body, dict) and window.value.body["error"]["param"] == "max_tokens"


def test_messages_probes_against_the_real_model(server: Server) -> None:
    """`sluicegate probe --surface messages` as a test: 0 failed, 0 silently accepted, 0 5xx."""
    probes = all_probes(ProbeOptions(model=MODEL), only=["messages"])
    with httpx.Client(base_url=server.url) as http:
        results = run_probes(http, probes, timeout=120)
    t = totals(results)
    assert [r.probe.name for r in results if r.server_error] == []
    assert [r.probe.name for r in results if r.silently_accepted] == []
    assert [(r.probe.name, r.status, r.error_type) for r in results if not r.passed(True)] == []
    assert t.passed_strict == t.probes >= 80
