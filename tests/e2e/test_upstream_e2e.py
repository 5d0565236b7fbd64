"""`sluicegate serve --no-local-model --upstream URL` in front of the real server (the default model): the
front tokenises with the GGUF's vocabulary alone, and answers exactly as the upstream does."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def front(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("front"), "--no-local-model", "--upstream", f"{server.url}/v1",
                       "--upstream-version", "smollm2-135m-instruct=q4_1")
    yield srv
    stop_server(srv)


def test_the_front_answers_as_the_upstream(server: Server, front: Server) -> None:
    body = {"prompt": "The capital of France is", "max_new_tokens": 8, "temperature": 0}
    direct = httpx.post(f"{server.url}/v1/generate", json=body, timeout=120).json()
    via = httpx.post(f"{front.url}/v1/generate", json=body, timeout=120).json()
    assert via["token_ids"] == direct["token_ids"] and via["text"] == direct["text"]
    assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    assert via["model"] == {"name": "smollm2-135m-instruct", "version": "q4_1", "digest": "unknown"}
    models = httpx.get(f"{front.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["smollm2-135m-instruct"]
    tok = httpx.post(f"{front.url}/tokenize", json={"prompt": body["prompt"]}).json()
    assert tok["count"] == direct["usage"]["prompt_tokens"] and tok["max_model_len"] == 2048
