"""/v1/completions and /v1/models in process, on the reference backend."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from fastapi.testclient import TestClient

from sluicegate.backends.reference import ReferenceRunner
from sluicegate.serving.openai_completions import fim_tokens
from tests.api.test_openai_chat import sse

URL = "/v1/completions"


def complete(client: TestClient, **body: Any) -> Any:
    return client.post(URL, json={"model": "reference", "prompt": "Hello", **body})


def test_completion_shape(client: TestClient) -> None:
    r = complete(client, max_tokens=5, seed=2)
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == "cmpl-" + r.headers["x-request-id"] and body["object"] == "text_completion"
    assert body["model"] == "reference@seed0" and body["system_fingerprint"].startswith("fp_")
    (c,) = body["choices"]
    assert c["index"] == 0 and c["logprobs"] is None and c["finish_reason"] in ("stop", "length")
    assert body["usage"]["prompt_tokens"] == 1 + len(b"Hello")  # BOS + bytes, counted by the engine
    # the same as the native route computes for the same request
    native = client.post("/v1/generate", json={"prompt": "Hello", "max_new_tokens": 5, "seed": 2}).json()
    assert native["text"] == c["text"]


def test_default_max_tokens_is_16(client: TestClient) -> None:
    body = complete(client, seed=1, temperature=0.0).json()
    assert body["usage"]["completion_tokens"] <= 16


def test_echo_prompt_lists_and_token_prompts(client: TestClient) -> None:
    plain = complete(client, max_tokens=4, seed=3).json()["choices"][0]["text"]
    echoed = complete(client, max_tokens=4, seed=3, echo=True).json()["choices"][0]["text"]
    assert echoed == "Hello" + plain
    ids = [256, *b"Hello"]  # BOS and the bytes: the same prompt as token ids
    assert complete(client, max_tokens=4, seed=3, prompt=ids).json()["choices"][0]["text"] == plain
    many = complete(client, max_tokens=4, seed=3, prompt=["Hello", "Bye"], n=2).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2, 3]
    assert many["choices"][0]["text"] == plain  # prompt 0, run 0 (seed 3)
    bye = complete(client, max_tokens=4, seed=4, prompt="Bye").json()["choices"][0]["text"]
    assert many["choices"][3]["text"] == bye  # prompt 1, run 1 (seed 3 + 1)


def test_logprobs_shape(client: TestClient) -> None:
    c = complete(client, max_tokens=6, seed=5, logprobs=2).json()["choices"][0]
    lp = c["logprobs"]
    n = len(lp["tokens"])
    assert n >= 1 and len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert all(1 <= len(t) <= 2 for t in lp["top_logprobs"])
    zero = complete(client, max_tokens=3, seed=5, logprobs=0).json()["choices"][0]["logprobs"]
    assert zero["top_logprobs"] is None and len(zero["token_logprobs"]) >= 1


def test_stream(client: TestClient) -> None:
    whole = complete(client, max_tokens=8, seed=6, n=2).json()
    chunks = sse(
        complete(client, max_tokens=8, seed=6, n=2, stream=True, stream_options={"include_usage": True}).text
    )
    # the same counts, but both runs found the prompt the first request's two runs left in the prefix cache
    whole["usage"].pop("prompt_tokens_details")
    cached = chunks[-2]["usage"].pop("prompt_tokens_details")["cached_tokens"]
    assert cached == whole["usage"]["prompt_tokens"] - 2 * 2  # each run computes its last two tokens
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"] == whole["usage"]
    for i in range(2):
        text = "".join(c["choices"][0]["text"] for c in chunks[:-2] if c["choices"][0]["index"] == i)
        assert text == whole["choices"][i]["text"]
    echoed = sse(complete(client, max_tokens=2, echo=True, stream=True).text)
    assert echoed[0]["choices"][0]["text"] == "Hello"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"best_of": 2}, "best_of", "unsupported_parameter"),
        ({"suffix": "x"}, "suffix", "unsupported_parameter"),
        ({"echo": True, "logprobs": 1}, "echo", "invalid_combination"),
        ({"logprobs": 6}, "logprobs", "out_of_range"),
        ({"prompt": ""}, "prompt", "too_short"),
        ({"prompt": [300]}, "prompt", "invalid_token_id"),
        ({"prompt": ["a", "b", "c"], "n": 8}, "n", "too_many_choices"),
        ({"max_tokens": 600}, "max_tokens", "context_length_exceeded"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "too_long"),
    ],
)
def test_refusals(client: TestClient, body: dict[str, Any], param: str, code: str) -> None:
    r = complete(client, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code), err


class FimRunner(ReferenceRunner):
    """Pretends three byte values are StarCoder-style FIM control tokens (for the detection only)."""

    SPECIAL: ClassVar[dict[str, int]] = {"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3}

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        if parse_special and text in self.SPECIAL:
            return [self.SPECIAL[text]]
        return super().tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id in (1, 2, 3) else super().token_bytes(token_id)


def test_fim_detection() -> None:
    assert fim_tokens(ReferenceRunner()) is None
    assert fim_tokens(FimRunner()) == (1, 2, 3)


def test_models(client: TestClient) -> None:
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list"
    (m,) = listed["data"]
    assert m["id"] == "reference" and m["object"] == "model" and m["owned_by"] == "sluicegate"
    for model_id in ("reference", "reference@seed0"):  # OpenAI's fields as listed, then the card (predictions.md)
        card = client.get(f"/v1/models/{model_id}").json()
        assert {k: card[k] for k in m} == m and card["ref"] == "reference@seed0"
    r = client.get("/v1/models/gpt-4o")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/generate", {"prompt": "x" * 100, "max_new_tokens": 2}, "prompt"),
        (URL, {"model": "reference", "prompt": "x" * 100, "max_tokens": 2}, "prompt"),
        ("/v1/chat/completions",
         {"model": "reference", "messages": [{"role": "user", "content": "x" * 100}], "max_tokens": 2}, "messages"),
    ],
)
def test_every_surface_refuses_over_the_configured_prompt_limit(path: str, body: dict[str, Any], param: str) -> None:
    """LimitsConfig applies to every surface through the serving core, with the surface's own statuses."""
    from sluicegate.config import Config, LimitsConfig
    from tests.conftest import make_client, wait_ready

    with make_client(Config(limits=LimitsConfig(max_prompt_tokens=64, max_new_tokens=8))) as c:
        wait_ready(c)
        r = c.post(path, json=body)
        err = r.json()["error"]
        native = path == "/v1/generate"
        assert r.status_code == (422 if native else 400) and err["param"] == param
        assert (err["type"] if native else err["code"]) == "prompt_too_long"
        assert "at most 64 prompt tokens" in err["message"]
        over = {**body, ("max_new_tokens" if native else "max_tokens"): 9, "prompt": "x"}
        if path.endswith("chat/completions"):
            over = {**body, "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}
        r = c.post(path, json=over)
        assert r.status_code == (422 if native else 400) and "at most 8 new tokens" in r.json()["error"]["message"]


def test_special_token_text_is_parsed_by_default_and_parse_special_false_keeps_it_text(client: TestClient) -> None:
    """The reference vocabulary has no control-token text, so parsing cannot change its count; what matters
    here is that the option is accepted on both routes and reaches the tokenizer (the e2e test checks the
    real model's ChatML control tokens)."""
    for parse in (True, False):
        r = complete(client, prompt="<|im_start|>user", max_tokens=1, parse_special=parse)
        assert r.status_code == 200
        g = client.post("/v1/generate", json={"prompt": "<|im_start|>", "max_new_tokens": 1, "parse_special": parse})
        assert g.status_code == 200
    r = complete(client, parse_special="yes")
    assert r.status_code == 400 and r.json()["error"]["param"] == "parse_special"
