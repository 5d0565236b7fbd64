"""The official `openai` client's Responses API, unmodified, against the real server (SmolLM2 on llama.cpp) on
127.0.0.1: create, stream (its event helpers and final response), parse into a pydantic model, a stored
conversation over three turns with the prefix cache at work, and a function call answered by its output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from sluicegate.contract.probe_runner import run_probes, totals
from sluicegate.contract.probes import ProbeOptions, all_probes
from tests.e2e.conftest import Server

MODEL = "smollm2-135m-instruct"
INSTRUCTIONS = ("You are a helpful assistant who answers questions about geography in short, plain sentences. "
                "Keep every answer under twenty words.")


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-unused", max_retries=0, timeout=600) as c:
        yield c


def test_create_and_retrieve(client: openai.OpenAI) -> None:
    out = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=16,
                                  temperature=0, metadata={"run": "1"})
    assert out.object == "response" and out.model == f"{MODEL}@q4_1" and out.status in ("completed", "incomplete")
    assert out.output_text and out.output[0].type == "message"
    assert out.usage is not None and 1 <= out.usage.output_tokens <= 16
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    again = client.responses.retrieve(out.id)
    assert again.output_text == out.output_text and again.metadata == {"run": "1"}
    items = client.responses.input_items.list(out.id)
    assert [i.type for i in items.data] == ["message"]
    client.responses.delete(out.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)


def test_stream_helpers_and_final_response(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "input": "What is the capital of Italy? Answer in one word.",
                          "max_output_tokens": 40, "temperature": 0, "store": False}
    whole = client.responses.create(**kw)
    assert whole.status == "completed", whole
    deltas: list[str] = []
    kinds: list[str] = []
    with client.responses.stream(**kw) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.done" in kinds and "response.output_item.done" in kinds
    assert "".join(deltas) == final.output_text == whole.output_text


class City(BaseModel):
    name: str = Field(max_length=24)
    country: Literal["France", "Italy", "Spain"]
    founded_century: int = Field(ge=-10, le=21)


def test_parse_into_a_pydantic_model(client: openai.OpenAI) -> None:
    out = client.responses.parse(model=MODEL, input="Describe Paris as JSON.", text_format=City,
                                 max_output_tokens=60, temperature=0)
    assert out.status == "completed"
    parsed = out.output_parsed
    assert isinstance(parsed, City) and parsed.name


def test_three_turns_continue_from_the_store_with_the_prefix_cache(client: openai.OpenAI) -> None:
    turns = ["What is the capital of Spain?", "And of Portugal?", "Which of the two is further west?"]
    previous: str | None = None
    cached: list[int] = []
    for text in turns:
        kw: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        out = client.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=text, max_output_tokens=24,
                                      temperature=0, **kw)
        assert out.usage is not None and out.previous_response_id == previous
        cached.append(out.usage.input_tokens_details.cached_tokens)
        previous = out.id
    assert cached[1] > 0 and cached[2] > 0, cached
    assert previous is not None
    items = client.responses.input_items.list(previous, order="asc")
    assert [i.type for i in items.data] == ["message"] * 5  # user, assistant, user, assistant, user
    assert [i.content[0].text for i in items.data[::2]] == turns  # type: ignore[union-attr]


WEATHER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
                     "parameters": WEATHER}]


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=TOOLS,
                                    tool_choice="required", max_output_tokens=60, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert first.status == "completed" and calls, first
    call = calls[0]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    answer = client.responses.create(
        model=MODEL, previous_response_id=first.id, max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "4 degrees, rain"}],
    )
    assert answer.output_text and answer.output[0].type == "message"
    kinds = [i.type for i in client.responses.input_items.list(answer.id, order="asc").data]
    assert kinds == ["message", "function_call", "function_call_output"]
    # the same turn sent whole, the earlier output passed back as items (no store)
    whole = client.responses.create(
        model=MODEL, max_output_tokens=40, temperature=0, store=False,
        input=[{"role": "user", "content": "What is the weather in Paris?"}, *first.output,  # type: ignore[list-item]
               {"type": "function_call_output", "call_id": call.call_id, "output": "4 degrees, rain"}],
    )
    assert whole.output_text == answer.output_text


def test_refusals_are_bad_requests(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bg:
        client.responses.create(model=MODEL, input="x", background=True)
    assert bg.value.param == "background"
    with pytest.raises(openai.BadRequestError) as tool:
        client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
    assert tool.value.param == "tools[0].type"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_" + "0" * 24)


def test_probe_suite_on_the_responses_route(server: Server) -> None:
    probes = all_probes(ProbeOptions(model=MODEL), only=["responses"])
    with httpx.Client(base_url=server.url) as http:
        results = run_probes(http, probes, timeout=120)
    t = totals(results)
    assert [r.probe.name for r in results if r.server_error] == []
    assert [r.probe.name for r in results if r.silently_accepted] == []
    assert [(r.probe.name, r.status, r.error_type) for r in results if not r.passed(True)] == []
    assert t.passed_strict == t.probes >= 20
