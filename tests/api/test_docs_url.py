"""Every error links its entry in the error catalog (`docs_url`, docs/errors.md "Every code"): on the native,
OpenAI and Anthropic routes, from the route and from the layers before it, by our type and code whatever the
dialect shows; the official `openai` and `anthropic` clients take it as an extra field. By default the link is
relative, `/docs/errors#<anchor>`, and resolves on the server that answered: `GET /docs/errors` is the catalog
as a page, needing no key, with an element whose `id` is each anchor. `--error-docs-url` replaces the base."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

import anthropic
import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from sluicegate.config import Config
from sluicegate.contract import errors_doc
from sluicegate.contract.errors_doc import anchors
from sluicegate.errorcatalog import DEFAULT_DOCS_URL, DOCS_PATH, ENTRIES, ErrorEntry, set_docs_base
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope
from sluicegate.testing.wait import wait_for
from tests.api.auth_helpers import GEN, served
from tests.api.threaded_server import Threaded, threaded_server
from tests.conftest import make_client, wait_ready
from tests.dbs import sqlite_url

ANCHORS = anchors((Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text())
HI = [{"role": "user", "content": "Hi"}]


def linked(err: dict[str, Any], anchor: str, base: str = DEFAULT_DOCS_URL) -> None:
    assert err["docs_url"] == f"{base}#{anchor}", err
    assert anchor in ANCHORS, f"docs/errors.md has no anchor {anchor}"


def check_page(r: httpx.Response, anchor: str) -> None:
    """The catalog's page, holding an element whose id is `anchor` (where a browser jumps)."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["cache-control"] == "public, max-age=3600"
    assert f'id="{anchor}"' in r.text, anchor


def resolves(client: TestClient, err: dict[str, Any]) -> None:
    """The error's docs_url, a path on this server: GET it without its fragment, and the fragment is an id there."""
    path, anchor = urldefrag(err["docs_url"])
    assert path == DOCS_PATH and anchor, err
    check_page(client.get(path), anchor)


def resolves_over_http(request_url: str, err: dict[str, Any]) -> None:
    """As a client would: the reference resolved against the URL it called."""
    url, anchor = urldefrag(urljoin(request_url, err["docs_url"]))
    assert url == urljoin(request_url, DOCS_PATH), url
    check_page(httpx.get(url, timeout=30), anchor)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client() as c:
        wait_ready(c)
        yield c


def test_native_routes(client: TestClient) -> None:
    r = client.post("/v1/generate", json={"prompt": "x", "max_tokens": 5})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_field"
    linked(r.json()["error"], "invalid_request-unknown_field")
    resolves(client, r.json()["error"])
    r = client.post("/v1/generate", content=b'{"prompt": NaN}', headers={"content-type": "application/json"})
    assert r.status_code == 400
    linked(r.json()["error"], "invalid_json-invalid_number")
    resolves(client, r.json()["error"])
    r = client.get("/v1/nowhere")  # refused by the framework's 404, before any route
    assert r.status_code == 404
    linked(r.json()["error"], "not_found-unknown_route")
    resolves(client, r.json()["error"])
    r = client.post("/v1/generate", json={"prompt": "x", "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    linked(r.json()["error"], "model_not_found")  # a code equal to its type: the type's entry
    resolves(client, r.json()["error"])


def test_the_page_is_the_catalog(client: TestClient) -> None:
    """Every entry, in the document's order, each with its id: the same anchors as docs/errors.md's table."""
    r = client.get(DOCS_PATH)
    check_page(r, "invalid_request")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none': no script at all
    ids = re.findall(r'<section id="([^"]+)">', r.text)
    assert ids == [e.anchor for e in ENTRIES]
    assert set(ids) <= ANCHORS  # docs/errors.md links the same places
    assert r.text.startswith("<!DOCTYPE html>") and "<h1>" in r.text
    for e in ENTRIES[:3]:
        assert e.meaning in r.text and e.action in r.text
    assert client.get(DOCS_PATH + "/x").status_code == 404  # the page, not a tree
    assert client.post(DOCS_PATH).status_code == 405


def test_the_page_escapes_every_text(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = ErrorEntry("bad<type>", 'c"&', 400, "<script>alert(1)</script>", "a & b < c")
    monkeypatch.setattr(errors_doc, "ENTRIES", (odd,))
    page = errors_doc.page()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'id="bad&lt;type&gt;-c&quot;&amp;"' in page and "a &amp; b &lt; c" in page


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
    resolves(client, r.json()["error"])


def test_anthropic_routes_carry_it_in_their_shape(client: TestClient) -> None:
    r = client.post("/v1/messages", json={"model": "reference", "max_tokens": 8, "messages": HI, "top_q": 1})
    body = r.json()
    assert r.status_code == 400 and body["type"] == "error" and body["error"]["code"] == "unknown_field"
    linked(body["error"], "invalid_request-unknown_field")
    r = client.post("/v1/messages", content=b"{}", headers={"content-type": "text/plain"})  # before the route
    assert r.status_code == 415 and r.json()["type"] == "error"
    linked(r.json()["error"], "unsupported_media_type-wrong_content_type")
    resolves(client, r.json()["error"])


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
        check_page(c.get(DOCS_PATH), "model_not_found")  # still served, for whoever calls it
    mirror = "/internal/sluicegate-errors"  # a path on the server (a proxy that serves the docs there)
    with make_client(Config(error_docs_url=mirror)) as c:
        wait_ready(c)
        linked(c.post("/v1/generate", json={"prompt": "x", "top_q": 1}).json()["error"],
               "invalid_request-unknown_field", mirror)


def test_a_refused_key_can_read_why(tmp_path: Path) -> None:
    """With keys on, the 401's docs_url resolves without a key: the catalog's page is public, like /healthz."""
    url = sqlite_url(tmp_path)
    upgrade(url)
    with served(url) as s:
        s.key(Scope.GENERATE)
        generate = s.url + "/v1/generate"
        wait_for(lambda: httpx.post(generate, json=GEN, timeout=30).status_code == 401)  # auth on
        r = httpx.post(generate, json=GEN, timeout=30)
        err = r.json()["error"]
        linked(err, "authentication_required-missing_api_key")
        resolves_over_http(generate, err)
        r = httpx.post(generate, json=GEN, headers={"Authorization": "Bearer sk-not-ours"}, timeout=30)
        assert r.status_code == 401
        linked(r.json()["error"], "invalid_api_key-malformed_api_key")
        resolves_over_http(generate, r.json()["error"])
        assert httpx.get(s.url + DOCS_PATH + "/x", timeout=30).status_code == 401  # the page alone is public


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
    resolves_over_http(str(info.value.request.url), info.value.body)


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
    resolves_over_http(str(e.request.url), e.body["error"])
