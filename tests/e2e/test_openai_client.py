"""The official `openai` client, unmodified, against the real server (SmolLM2 on llama.cpp) on 127.0.0.1."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from sluicegate.contract.probe_runner import run_probes, totals
from sluicegate.contract.probes import ProbeOptions, all_probes
from tests.e2e.conftest import Server

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-unused", max_retries=0, timeout=120) as c:
        yield c


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_chat(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=user("What is the capital of France?"), max_tokens=12, temperature=0
    )
    assert out.object == "chat.completion" and out.model == f"{MODEL}@q4_1"
    assert re.fullmatch(r"fp_[0-9a-f]{10}", out.system_fingerprint or "")
    c = out.choices[0]
    assert c.message.role == "assistant" and c.message.content and c.finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_completions(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert out.object == "text_completion" and out.choices[0].text
    assert out.usage is not None and out.usage.completion_tokens <= 6
    echoed = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "The capital of France is" + out.choices[0].text


def test_streaming_with_usage_equals_whole(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": user("Tell me about cats."),
        "max_tokens": 20,
        "seed": 11,
        "temperature": 0.9,
    }
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and whole.usage is not None
    streamed, first = chunks[-1].usage, whole.usage
    assert (streamed.prompt_tokens, streamed.completion_tokens, streamed.total_tokens) == (
        first.prompt_tokens, first.completion_tokens, first.total_tokens)
    # the same prompt again: the prefix cache holds what the first request computed, so at least as much is reused
    assert streamed.prompt_tokens_details is not None and first.prompt_tokens_details is not None
    assert (streamed.prompt_tokens_details.cached_tokens or 0) >= (first.prompt_tokens_details.cached_tokens or 0)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, seed=3)
    streamed = "".join(
        ch.choices[0].text
        for ch in client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=12, seed=3, stream=True
        )
        if ch.choices
    )
    assert streamed == plain.choices[0].text


def test_n_and_seeds(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": user("Name a fruit."),
        "max_tokens": 8,
        "temperature": 1.0,
    }
    many = client.chat.completions.create(**kw, n=3, seed=100)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, c in enumerate(many.choices):
        alone = client.chat.completions.create(**kw, seed=100 + i)
        assert alone.choices[0].message.content == c.message.content
    again = client.chat.completions.create(**kw, n=3, seed=100)
    assert [c.message.content for c in again.choices] == [c.message.content for c in many.choices]
    assert many.usage is not None and many.usage.completion_tokens == sum(
        client.chat.completions.create(**kw, seed=100 + i).usage.completion_tokens  # type: ignore[union-attr]
        for i in range(3)
    )


def test_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=user("Say hello."), max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    c = out.choices[0]
    assert c.logprobs is not None and c.logprobs.content
    for entry in c.logprobs.content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen token is the most likely
    raw = b"".join(bytes(e.bytes or []) for e in c.logprobs.content)
    assert raw.decode("utf-8") == c.message.content
    text = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2)
    lp = text.choices[0].logprobs
    assert lp is not None and lp.tokens and len(lp.top_logprobs or []) == len(lp.tokens)


PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "city"],
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
    },
}


def test_json_schema_output_parses_and_validates(client: openai.OpenAI) -> None:
    for seed in (1, 2):
        out = client.chat.completions.create(
            model=MODEL,
            messages=user("Describe a person as JSON."),
            max_tokens=60,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
        )
        c = out.choices[0]
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content or ""), PERSON)
    obj = client.chat.completions.create(
        model=MODEL,
        messages=user("Reply in JSON: a fruit and its colour."),
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)


WEATHER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER},
    }
]


def test_forced_tool_call(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL,
        messages=user("What is the weather in Paris?"),
        max_tokens=40,
        temperature=0,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    req = client.chat.completions.create(
        model=MODEL,
        messages=user("Weather in Oslo?"),
        max_tokens=50,
        temperature=0,
        tools=TOOLS,
        tool_choice="required",
    )
    call = req.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


AUTO_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER},
    }
]


def weather_turn(city: str, i: int) -> list[Any]:
    """One earlier exchange in which the assistant called get_weather: the model sees the call syntax in use."""
    args = json.dumps({"city": city, "unit": "celsius"})
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": "4 degrees, rain"},
    ]


def test_tools_auto_calls_or_answers(client: openai.OpenAI) -> None:
    """Tools without tool_choice (OpenAI's default, `auto`): the model decides; a call is always valid."""
    client = client.with_options(timeout=600)  # a deadline a loaded machine cannot miss: behaviour, not speed
    history = weather_turn("Oslo", 1)
    out = client.chat.completions.create(
        model=MODEL, messages=[*history, *user("What is the weather in Paris?")], max_tokens=60, temperature=0,
        tools=AUTO_TOOLS,
    )
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    out = client.chat.completions.create(
        model=MODEL, messages=[*history, *user("What is the capital of Italy?")], max_tokens=60, temperature=0,
        tools=AUTO_TOOLS, tool_choice="auto",
    )
    c = out.choices[0]
    assert c.finish_reason in ("stop", "length") and c.message.tool_calls is None
    assert c.message.content and "Rome" in c.message.content


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_calls_equal_whole_ones(client: openai.OpenAI, choice: Any) -> None:
    """The client's stream helper accumulates OpenAI's deltas (index, id and name, then arguments in pieces)
    into the very calls a non-streamed request returns."""
    client = client.with_options(timeout=600)
    args: dict[str, Any] = {
        "model": MODEL, "messages": [*weather_turn("Oslo", 1), *user("What is the weather in Paris?")],
        "max_tokens": 60, "temperature": 0, "tools": AUTO_TOOLS, "tool_choice": choice,
    }
    whole = client.chat.completions.create(**args).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls
    pieces: list[Any] = []
    with client.chat.completions.stream(**args) as s:
        for event in s:
            if event.type == "chunk" and event.chunk.choices and event.chunk.choices[0].delta.tool_calls:
                pieces += event.chunk.choices[0].delta.tool_calls
        final = s.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == whole.message.content
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls or ()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert pieces[0].id and pieces[0].function and pieces[0].function.name == "get_weather"
    assert all(p.id is None for p in pieces[1:])


def test_error_classes(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=user("x"), modalities=["audio"])
    assert bad.value.code == "unsupported_parameter" and bad.value.param == "modalities"
    with pytest.raises(openai.BadRequestError) as window:
        client.chat.completions.create(model=MODEL, messages=user("x"), max_tokens=100_000)
    assert window.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as tools:
        client.chat.completions.create(model=MODEL, messages=user("x"), tools=TOOLS, stop=["}"])
    assert tools.value.code == "invalid_combination" and tools.value.param == "stop"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=user("x"))
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    assert [m.id for m in client.models.list()] == [MODEL]


MULTILINGUAL = [
    "Écris une phrase sur la mer.",
    "Schreib einen Satz über Bäume.",
    "Расскажи о зиме.",
    "写一句关于春天的话。",
    "日本の秋について一文書いて。",
    "اكتب جملة عن الصحراء.",
    "समुद्र के बारे में एक वाक्य लिखो।",
    "Describe your mood only with emoji 😀🎉🌈🔥",
    "Γράψε μια πρόταση για τον ήλιο.",
    "한국의 여름에 대해 써 줘.",
]


@pytest.mark.parametrize("prompt", MULTILINGUAL)
def test_multilingual_streams_have_no_replacement_characters(client: openai.OpenAI, prompt: str) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": user(prompt),
        "max_tokens": 24,
        "seed": 5,
        "temperature": 0.8,
    }
    deltas = [
        ch.choices[0].delta.content or ""
        for ch in client.chat.completions.create(**kw, stream=True)
        if ch.choices
    ]
    assert all("\ufffd" not in d for d in deltas)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    assert "".join(deltas) == whole


def test_probe_suite_on_the_openai_routes(server: Server) -> None:
    probes = all_probes(ProbeOptions(model=MODEL), only=["chat", "completions", "models"])
    with httpx.Client(base_url=server.url) as http:
        results = run_probes(http, probes, timeout=120)
    t = totals(results)
    assert [r.probe.name for r in results if r.server_error] == []
    assert [r.probe.name for r in results if r.silently_accepted] == []
    assert [(r.probe.name, r.status, r.error_type) for r in results if not r.passed(True)] == []
    assert t.passed_strict == t.probes >= 150
