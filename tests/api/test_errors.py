"""One envelope for every failure on every route, with the documented status, never echoing the input."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Literal

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sluicegate.api.validation import plain_name, validation_error
from sluicegate.config import Config, LimitsConfig
from sluicegate.engine import EngineOverloaded, EngineStopped
from sluicegate.errorcatalog import DEFAULT_DOCS_URL
from sluicegate.serving.core import engine_error
from sluicegate.serving.errors import STATUS, ApiError
from tests.conftest import make_client, wait_ready

DOCS = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
SECRET = "s3cr3t-input"


def envelope_of(r: object) -> dict[str, object]:
    resp = r  # httpx.Response
    body = resp.json()  # type: ignore[attr-defined]
    err = body["error"]
    assert set(err) == {"type", "code", "message", "param", "request_id", "docs_url"}
    anchor = err["type"] if err["code"] in (None, err["type"]) else f"{err['type']}-{err['code']}"
    assert err["docs_url"] == f"{DEFAULT_DOCS_URL}#{anchor}"
    assert err["request_id"] == resp.headers["x-request-id"]  # type: ignore[attr-defined]
    assert STATUS[err["type"]] == resp.status_code  # type: ignore[attr-defined]
    assert SECRET not in resp.text  # type: ignore[attr-defined]
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "etype"),
    [
        ("POST", "/v1/generate", b"{", {"content-type": "application/json"}, 400, "invalid_json"),
        (
            "POST",
            "/v1/generate",
            b'{"prompt": "x"}',
            {"content-type": "text/plain"},
            415,
            "unsupported_media_type",
        ),
        (
            "POST",
            "/v1/generate",
            b'{"prompt": 5}',
            {"content-type": "application/json"},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/generate",
            b'{"prompt": "x", "model": "other"}',
            {"content-type": "application/json"},
            404,
            "model_not_found",
        ),
        ("GET", "/v1/nothing", None, {}, 404, "not_found"),
        ("GET", "/v1/generate", None, {}, 405, "method_not_allowed"),
    ],
)
def test_status_rule(
    client: TestClient,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    status: int,
    etype: str,
) -> None:
    r = client.request(method, path, content=body, headers=headers)
    assert r.status_code == status
    assert envelope_of(r)["type"] == etype
    assert "total;dur=" in r.headers["server-timing"]


def test_405_says_what_is_allowed(client: TestClient) -> None:
    r = client.get("/v1/generate")
    assert r.headers["allow"] == "POST"


def test_unknown_field_is_named_and_a_misspelling_does_not_run(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "x", "max_tokens": 5})
    err = envelope_of(r)
    assert (r.status_code, err["param"], err["code"]) == (422, "max_tokens", "unknown_field")
    assert "unknown parameter 'max_tokens'" in str(err["message"])


def test_misspelling_is_reported_before_the_other_problems(client: TestClient) -> None:
    err = envelope_of(client.post("/v1/generate", json={"max_tokens": 5}))  # prompt missing too
    assert err["param"] == "max_tokens" and str(err["message"]).endswith("; and 1 more problem")


def test_an_unknown_key_that_is_not_a_plain_name_is_not_repeated(client: TestClient) -> None:
    err = envelope_of(client.post("/v1/generate", json={"prompt": "x", f"<{SECRET}>": 1}))
    assert err["param"] is None and err["code"] == "unknown_field"


def test_an_option_in_the_query_string_is_refused(client: TestClient) -> None:
    r = client.post("/v1/generate?max_new_tokens=5", json={"prompt": "x"})
    err = envelope_of(r)
    assert (r.status_code, err["param"], err["code"]) == (422, "max_new_tokens", "unknown_field")


def test_content_type_parameters(client: TestClient) -> None:
    body = b'{"prompt": "x", "max_new_tokens": 1}'
    for ctype in ("application/json; charset=utf-8", "APPLICATION/JSON", 'application/json;charset="UTF-8"'):
        assert client.post("/v1/generate", content=body, headers={"content-type": ctype}).status_code == 200
    for ctype in ("application/json; charset=latin-1", "application/jsonx", "application/json-seq"):
        r = client.post("/v1/generate", content=body, headers={"content-type": ctype})
        assert r.status_code == 415, ctype


def test_500_is_internal_error_with_the_detail_only_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    with make_client() as c:
        app = c.app
        assert isinstance(app, FastAPI)

        async def boom() -> None:
            raise RuntimeError(f"database password is {SECRET}")

        app.add_api_route("/boom", boom)
        with caplog.at_level(logging.ERROR):
            r = c.get("/boom", headers={"x-request-id": "boom-1"})
    assert r.status_code == 500
    err = envelope_of(r)
    assert err == {
        "type": "internal_error",
        "code": None,
        "message": "internal error; report the request id",
        "param": None,
        "request_id": "boom-1",
        "docs_url": f"{DEFAULT_DOCS_URL}#internal_error",
    }
    logged = "\n".join(rec.getMessage() + (rec.exc_text or "") for rec in caplog.records)
    assert "boom-1" in logged and SECRET in caplog.text


def test_503_with_retry_after_while_loading_and_overloaded() -> None:
    err = engine_error(EngineOverloaded(3, "the queue is full"))
    assert (err.status, err.type, err.retry_after, err.code) == (503, "overloaded", 3, "queue_full")
    err = engine_error(EngineStopped("stopping"))
    assert (err.status, err.type, err.retry_after) == (503, "shutting_down", 5)
    with pytest.raises(ValueError):
        engine_error(ValueError("not an engine refusal"))


def test_max_prompt_tokens_from_the_config_is_enforced() -> None:
    with make_client(Config(limits=LimitsConfig(max_prompt_tokens=10))) as c:
        wait_ready(c)
        assert (
            c.post("/v1/generate", json={"prompt": "x" * 9, "max_new_tokens": 1}).status_code == 200
        )  # BOS+9
        r = c.post("/v1/generate", json={"prompt": "x" * 10, "max_new_tokens": 1})
        err = envelope_of(r)
        assert (r.status_code, err["type"], err["param"]) == (422, "prompt_too_long", "prompt")
        assert "the prompt is 11 tokens; at most 10 prompt tokens are accepted" in str(err["message"])


def test_both_budget_rules_are_reachable_over_http(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "a" * 510, "max_new_tokens": 1})  # 511 tokens: fits
    assert r.status_code == 200
    err = envelope_of(client.post("/v1/generate", json={"prompt": "a" * 511, "max_new_tokens": 1}))
    assert err["type"] == "prompt_too_long" and "the prompt is 512 tokens; at most 511" in str(err["message"])
    err = envelope_of(client.post("/v1/generate", json={"prompt": "a" * 400, "max_new_tokens": 200}))
    assert err["type"] == "context_length_exceeded"
    assert str(err["message"]).startswith(
        "401 prompt tokens plus 200 new tokens is 601; the context window is 512"
    )


def test_refused_before_any_engine_work(client: TestClient) -> None:
    state = client.app.state.sluicegate  # type: ignore[attr-defined]
    runner = state.runtime.model.runner
    before = (runner.execute_calls, runner.executed_tokens)
    for body in ({"prompt": "a" * 511}, {"prompt": "a", "max_new_tokens": 600}, {"prompt": "a" * 100_000}):
        assert client.post("/v1/generate", json=body).status_code == 422
    assert (runner.execute_calls, runner.executed_tokens) == before


def test_top_k_beyond_the_vocabulary_is_a_warning(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 1, "top_k": 1000})
    assert r.json()["warnings"] == ["top_k has no effect: it is at least the vocabulary size (258)"]


def test_server_timing_reports_the_interface_stages(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 1})
    stages = dict(part.split(";dur=") for part in r.headers["server-timing"].split(", "))
    for name in ("read", "parse", "validate", "tokenize", "queue", "prefill", "decode", "serialize", "total"):
        assert float(stages[name]) >= 0.0


# -- validation messages are written from the schema, never from the input --------------------------------


class Cat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    kind: Literal["cat"]


class Dog(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    kind: Literal["dog"]


class Pet(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    pet: Cat | Dog = Field(discriminator="kind")
    n: int = Field(1, ge=1, le=9)
    tags: list[str] = Field(default_factory=list, max_length=2)


@pytest.mark.parametrize(
    ("data", "param", "text"),
    [
        ({"pet": {"kind": SECRET}}, "pet", "pet is not acceptable (union_tag_invalid)"),
        ({"pet": {"kind": "cat"}, "n": 10}, "n", "n must be at most 9"),
        ({"pet": {"kind": "cat"}, "n": 0}, "n", "n must be at least 1"),
        ({"pet": {"kind": "cat"}, "n": SECRET}, "n", "n must be an integer, not a string"),
        (
            {"pet": {"kind": "cat"}, "tags": ["a", "b", SECRET]},
            "tags",
            "tags has 3 items; at most 2 are accepted",
        ),
        (
            {"pet": {"kind": "cat"}, "tags": [SECRET, 5]},
            "tags[1]",
            "tags[1] must be a string, not an integer",
        ),
        ({"pet": {"kind": "cat", f"<{SECRET}>": 1}}, None, "the body has an unknown parameter"),
        ({"pet": {"kind": "cat", "colour": 1}}, "pet.cat.colour", "unknown parameter 'pet.cat.colour'"),
        ({}, "pet", "pet is required"),
    ],
)
def test_validation_messages(data: dict[str, object], param: str | None, text: str) -> None:
    with pytest.raises(ValidationError) as info:
        Pet.model_validate(data)
    err = validation_error(info.value)
    assert err.param == param and err.message.startswith(text) and SECRET not in err.message
    assert err.status == 422


def test_plain_name() -> None:
    assert plain_name("messages[0].content") == "messages[0].content"
    assert plain_name("a b") is None and plain_name("x" * 65) is None and plain_name("") is None


# -- docs/errors.md documents every type -----------------------------------------------------------------


def test_every_error_type_is_documented_with_its_status() -> None:
    text = DOCS.read_text()
    for etype, status in STATUS.items():
        row = re.search(rf"^\| `{etype}` \| {status} \|", text, re.M)
        assert row, f"docs/errors.md has no row for {etype} ({status})"


def test_unknown_error_types_cannot_be_raised() -> None:
    with pytest.raises(ValueError):
        ApiError("made_up", "x")
