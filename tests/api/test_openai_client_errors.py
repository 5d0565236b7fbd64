"""The official `openai` client (unmodified) against the app on a real socket (reference backend, uvicorn in a
thread): each mistake raises the matching exception class, with our type, code, param and request id."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from sluicegate.config import Config
from sluicegate.engine import SchedulerConfig
from tests.api.threaded_server import SlowRunner, Threaded, threaded_server

HI: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def srv() -> Iterator[Threaded]:
    with threaded_server() as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: Threaded) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_happy_path(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="reference", messages=HI, max_tokens=4, seed=1)
    assert out.choices[0].message.role == "assistant" and out.usage is not None
    text = client.completions.create(model="reference", prompt="Hi", max_tokens=4, seed=1)
    assert text.choices[0].finish_reason in ("stop", "length")
    assert [m.id for m in client.models.list()] == ["reference"]
    assert client.models.retrieve("reference").id == "reference"


def test_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="reference", messages=HI, store=True)
    e = info.value
    assert e.status_code == 400 and e.type == "invalid_request_error"
    assert e.code == "unsupported_parameter" and e.param == "store"
    assert isinstance(e.body, dict) and e.body["request_id"] == e.response.headers["x-request-id"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="reference", prompt="Hi", max_tokens=100_000)
    assert info.value.code == "context_length_exceeded" and info.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="reference", messages=HI, extra_body={"top_k": 5})
    assert info.value.code == "unknown_field" and info.value.param == "top_k"


def test_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert info.value.code == "model_not_found" and info.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="x")


def test_overloaded_is_a_server_error() -> None:
    with (
        threaded_server(Config(engine=SchedulerConfig(max_waiting=0))) as s,
        openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0) as c,
    ):
        with pytest.raises(openai.InternalServerError) as info:
            c.chat.completions.create(model="reference", messages=HI, max_tokens=2)
        assert info.value.status_code == 503 and info.value.type == "overloaded"
        assert info.value.response.headers["retry-after"].isdigit()
        with pytest.raises(openai.APIStatusError):
            c.completions.create(model="reference", prompt="Hi", max_tokens=2, stream=True)


def test_engine_failure_mid_stream_raises_api_error() -> None:
    with (
        threaded_server(runner=lambda: SlowRunner(n_ctx=2048, n_slots=4, delay_s=0.01, eos_slope=0.0)) as s,
        openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0) as c,
    ):
        stream = c.chat.completions.create(model="reference", messages=HI, max_tokens=400, stream=True)
        first = next(iter(stream))
        assert first.choices[0].delta.role == "assistant"
        s.runner.fail = True
        with pytest.raises(openai.APIError) as info:
            for _ in stream:
                pass
        assert isinstance(info.value.body, dict) and info.value.body["type"] == "internal_error"
        s.runner.fail = False
