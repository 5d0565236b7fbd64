"""Every error links its entry in the error catalog (`docs_url`, docs/errors.md "Every code"): on the native,
OpenAI and Anthropic routes, from the route and from the layers before it, by our type and code whatever the
dialect shows; the official `openai` and `anthropic` clients take it as an extra field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from sluicegate.config import Config
from sluicegate.contract.errors_doc import anchors
from sluicegate.errorcatalog import DEFAULT_DOCS_URL, set_docs_base
from tests.api.threaded_server import Threaded, threaded_server
from tests.conftest import make_client, wait_ready

ANCHORS = anchors((Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text())
HI = [{"role": "user", "content": "Hi"}]


def linked(err: dict[str, Any], anchor: str, base: str = DEFAULT_DOCS_URL) -> None:
    assert err["docs_url"] == f"{base}#{anchor}", err
    assert anchor in ANCHORS, f"docs/errors.md has no anchor {anchor}"


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client() as c:
        wait_ready(c)
        yield c


def test_native_routes(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "x", "max_tokens": 5})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_field"
    linked(r.json()["error"], "invalid_request-unknown_field")
    r = client.post("/v1/generate", content=b'{"prompt": NaN}', headers={"content-type": "application/json"})
    assert r.status_code == 400
    linked(r.json()["error"], "invalid_json-invalid_number")
    r = client.get("/v1/nowhere")  # refused by the framework's 404, before any route
    assert r.status_code == 404
    linked(r.json()["error"], "not_found-unknown_route")
    r = client.post("/v1/generate", json={"prompt": "x", "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    linked(r.json()["error"], "model_not_found")  # a code equal to its type: the type's entry


def test_openai_routes_link_our_type_and_code(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"model": "reference", "messages": HI, "max_tokens": 100_000})
    err = r.json()["error"]
    assert r.status_code == 400 and (err["type"], err["code"]) == ("invalid_request_error", "context_length_exceeded")
    linked(err, "context_length_exceeded-context_window_exceeded")
    r = client.post("/v1/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    linked(r.json()["error"], "unsupported_media_type-wrong_content_type")
    r = client.get("/v1/responses/resp_0123456789abcdef")
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    linked(r.json()["error"], "not_found-response_not_found")


def test_anthropic_routes_carry_it_in_their_shape(client: TestClient) -> None:
    r = client.post("/v1/messages", json={"model": "reference", "max_tokens": 8, "messages": HI, "top_q": 1})
    body = r.json()
    assert r.status_code == 400 and body["type"] == "error" and body["error"]["code"] == "unknown_field"
    linked(body["error"], "invalid_request-unknown_field")
    r = client.post("/v1/messages", content=b"{}", headers={"content-type": "text/plain"})  # before the route
    assert r.status_code == 415 and r.json()["type"] == "error"
    linked(r.json()["error"], "unsupported_media_type-wrong_content_type")


@pytest.fixture
def default_base_after() -> Iterator[None]:
    yield
    set_docs_base(DEFAULT_DOCS_URL)  # the base is the process's: leave it as the other tests expect


@pytest.mark.usefixtures("default_base_after")
def test_the_base_is_the_servers_setting() -> None:
    base = "https://docs.example.com/sluicegate/errors.html"
    with make_client(Config(error_docs_url=base)) as c:
        wait_ready(c)
        linked(c.post("/v1/generate", json={"prompt": "x", "top_q": 1}).json()["error"],
               "invalid_request-unknown_field", base)
        linked(c.post("/v1/messages", json={"model": "x", "max_tokens": 1, "messages": HI}).json()["error"],
               "model_not_found", base)


@pytest.fixture(scope="module")
def srv() -> Iterator[Threaded]:
    with threaded_server() as s:
        yield s


def test_the_openai_client_takes_it(srv: Threaded) -> None:
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0) as c, \
            pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model="reference", messages=[{"role": "user", "content": "Hi"}],
                                  extra_body={"top_k": 5})
    assert info.value.code == "unknown_field" and isinstance(info.value.body, dict)
    linked(info.value.body, "invalid_request-unknown_field")


def test_the_anthropic_client_takes_it(srv: Threaded) -> None:
    """Its error models allow extra fields: the typed exception is raised, and the body parses with the field."""
    with anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0) as c, \
            pytest.raises(anthropic.NotFoundError) as info:
        c.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    e = info.value
    assert e.type == "not_found_error" and isinstance(e.body, dict)
    linked(e.body["error"], "model_not_found")
    parsed = anthropic.types.ErrorResponse.model_validate(e.body)
    assert parsed.error.type == "not_found_error" and parsed.error.model_extra is not None
    assert parsed.error.model_extra["docs_url"] == e.body["error"]["docs_url"]
