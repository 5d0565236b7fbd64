"""A thinking model's reasoning, read apart on every surface (serving/reasoning.py): the reference backend served
with a template that marks `<think>...</think>` (`--chat-template-file`), pushed to write a reasoning block
then an answer (or a call). Chat's `reasoning_content` (whole and streamed), a Responses `reasoning` item (and
its events), a Messages `thinking` block (and its deltas); `--reasoning-format none` leaves it in the text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.config import Config, ModelConfig
from tests.api.test_openai_chat import sse
from tests.api.test_openai_responses import events
from tests.api.test_openai_tools_auto import ScriptedRunner
from tests.conftest import make_client, wait_ready

TEMPLATE = (  # the reference template, and a thinking model's marker (a template that writes `</think>`)
    "{# the model reasons between <think> and </think> #}"
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
SCRIPT = "<think>\nplan it\n</think>\n\nThe answer."


def served(tmp_path: Path, script: str, reasoning_format: str = "auto") -> Iterator[TestClient]:
    path = tmp_path / "thinking.jinja"
    path.write_text(TEMPLATE)
    config = Config(model=ModelConfig(chat_template_file=path, reasoning_format=reasoning_format))
    with make_client(config, factory=lambda: ScriptedRunner(script.encode(), n_ctx=1024, n_slots=4)) as c:
        wait_ready(c)
        yield c


@pytest.fixture
def thinker(tmp_path: Path) -> Iterator[TestClient]:
    yield from served(tmp_path, SCRIPT)


def chat(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={
        "model": "reference", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0,
        "max_tokens": len(SCRIPT) + 4, **body})


def test_chat_gives_the_reasoning_apart_whole_and_streamed(thinker: TestClient) -> None:
    card = thinker.get("/v1/models/reference").json()["chat"]
    assert card["reasoning"] == ["<think>", "</think>"] and card["template"] == "file"
    msg = chat(thinker).json()["choices"][0]["message"]
    assert msg["reasoning_content"] == "plan it\n"
    assert msg["content"].startswith("The answer.")
    chunks = sse(chat(thinker, stream=True).text)
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    first_answer = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_answer:])  # reasoning comes first
    plain = chat(thinker, max_tokens=10).json()["choices"][0]  # cut inside the reasoning: no answer yet
    assert plain["finish_reason"] == "length" and plain["message"]["content"] == ""


def test_responses_has_a_reasoning_item_before_the_message(thinker: TestClient) -> None:
    body = {"model": "reference", "input": "Hi", "temperature": 0, "max_output_tokens": len(SCRIPT) + 4}
    whole = thinker.post("/v1/responses", json=body).json()
    kinds = [o["type"] for o in whole["output"]]
    assert kinds == ["reasoning", "message"], whole
    assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": "plan it\n"}]
    evs = events(thinker.post("/v1/responses", json={**body, "stream": True}).text)
    deltas = "".join(e["delta"] for e in evs if e["type"] == "response.reasoning_text.delta")
    assert deltas == "plan it\n"
    done = evs[-1]["response"]  # response.completed, or .incomplete at max_output_tokens
    assert [o["type"] for o in done["output"]] == kinds
    # the output sent back as input: the reasoning item is accepted (and left out of the prompt)
    again = thinker.post("/v1/responses", json={**body, "store": False, "input": [
        {"role": "user", "content": "Hi"}, *whole["output"], {"role": "user", "content": "More?"}]})
    assert again.status_code == 200, again.text


def test_messages_has_a_thinking_block(thinker: TestClient) -> None:
    body = {"model": "reference", "max_tokens": len(SCRIPT) + 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}]}
    msg = thinker.post("/v1/messages", json=body).json()
    assert [b["type"] for b in msg["content"]] == ["thinking", "text"], msg
    assert msg["content"][0] == {"type": "thinking", "thinking": "plan it\n", "signature": ""}
    text = thinker.post("/v1/messages", json={**body, "stream": True}).text
    datas = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    thinking = "".join(d["delta"]["thinking"] for d in datas
                       if d["type"] == "content_block_delta" and d["delta"]["type"] == "thinking_delta")
    assert thinking == "plan it\n"
    starts = [d["content_block"]["type"] for d in datas if d["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]


def test_reasoning_format_none_leaves_it_in_the_text(tmp_path: Path) -> None:
    for client in served(tmp_path, SCRIPT, reasoning_format="none"):
        assert client.get("/v1/models/reference").json()["chat"]["reasoning"] is None
        msg = chat(client).json()["choices"][0]["message"]
        assert "reasoning_content" not in msg and msg["content"].startswith("<think>\nplan it\n</think>")
