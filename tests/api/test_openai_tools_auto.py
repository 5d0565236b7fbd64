"""`tool_choice: "auto"` (and tools without a choice) on /v1/chat/completions, in process, on the reference
backend steered by a script: free text, then, from the trigger `<tool_call>` on, calls the grammar keeps valid;
streamed calls equal whole ones; a call cut by max_tokens comes back as far as it got, with `length`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import jsonschema
import numpy as np
import pytest
from fastapi.testclient import TestClient

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import ReferenceRunner
from tests.api.test_openai_chat import TIME, TOOLS, WEATHER, sse, streamed_calls, streamed_text
from tests.conftest import make_client, wait_ready

URL = "/v1/chat/completions"
MARK = b"<|assistant|>"  # the reference template's generation prompt
SCHEMAS = {"weather": WEATHER, "clock": TIME}


class ScriptedRunner(ReferenceRunner):
    """The reference model, pushed to write `script` (bytes) at the start of each answer; what follows is the
    model's own (random) choice, as free or as constrained as the request makes it. The push is a large logit,
    not a mask: a grammar still refuses a scripted byte it does not allow."""

    def __init__(self, script: bytes, **kw: Any) -> None:
        super().__init__(**kw)
        self.script = script

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        ends: list[tuple[int, int]] = []  # (slot, positions seen) of every row, in the order rows come back
        for item in batch:
            base = len(self._slots[item.slot])
            if item.logits_all:
                ends += [(item.slot, base + i + 1) for i in range(len(item.token_ids))]
            elif item.want_logits:
                ends.append((item.slot, base + len(item.token_ids)))
        rows = np.array(super().execute(batch), copy=True)
        for r, (slot, n) in enumerate(ends):
            seen = bytes(t for t in self._slots[slot][:n] if t < 256)
            k = len(seen) - (seen.rfind(MARK) + len(MARK))
            if seen.rfind(MARK) >= 0 and k < len(self.script):
                rows[r, self.script[k]] += 60.0
        return rows


def client_for(script: str) -> Iterator[TestClient]:
    with make_client(factory=lambda: ScriptedRunner(script.encode(), n_ctx=2048, n_slots=8)) as c:
        wait_ready(c)
        yield c


@pytest.fixture
def caller() -> Iterator[TestClient]:
    yield from client_for("Let me check. <tool_call>")


@pytest.fixture
def two_calls() -> Iterator[TestClient]:
    call = '<tool_call>{"name": "clock", "arguments": {"tz": "UTC"}}</tool_call>'
    yield from client_for(f"{call}\n{call}")


@pytest.fixture
def plain() -> Iterator[TestClient]:
    with make_client(factory=lambda: ReferenceRunner(n_ctx=2048, n_slots=8)) as c:
        wait_ready(c)
        yield c


def chat(client: TestClient, **body: Any) -> Any:
    body = {"model": "reference", "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, **body}
    return client.post(URL, json=body)


def check_call(call: dict[str, Any]) -> None:
    assert call["type"] == "function" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


@pytest.mark.parametrize("choice", [{}, {"tool_choice": "auto"}])
def test_text_then_a_valid_call(caller: TestClient, choice: dict[str, Any]) -> None:
    for seed in (1, 2, 3):
        c = chat(caller, max_tokens=120, seed=seed, parallel_tool_calls=False, **choice).json()["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        assert c["message"]["content"] == "Let me check."
        (call,) = c["message"]["tool_calls"]
        check_call(call)


def test_streamed_calls_equal_whole_ones(caller: TestClient) -> None:
    for seed in (1, 2):
        whole = chat(caller, max_tokens=120, seed=seed, parallel_tool_calls=False).json()["choices"][0]
        chunks = sse(chat(caller, max_tokens=120, seed=seed, parallel_tool_calls=False, stream=True).text)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert streamed_text(chunks) == whole["message"]["content"]
        streamed = streamed_calls(chunks)
        assert [c["function"] for c in streamed] == [c["function"] for c in whole["message"]["tool_calls"]]
        pieces = [d for ch in chunks[:-1] for d in ch["choices"][0]["delta"].get("tool_calls") or ()]
        assert pieces[0]["function"]["name"] and pieces[0]["function"]["arguments"] == ""
        assert all("id" not in p and "name" not in p["function"] for p in pieces[1:])  # merged when a reader lags
        assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_call_cut_by_max_tokens_is_length_and_as_far_as_it_got(caller: TestClient) -> None:
    # "Let me check. <tool_call>" is 25 bytes; the call's head (its name) about 35 more, its arguments more still
    c = chat(caller, max_tokens=40, seed=1).json()["choices"][0]
    assert c["finish_reason"] == "length"  # cut before the name: no call yet
    assert c["message"]["tool_calls"] is None and c["message"]["content"] == "Let me check."
    c = chat(caller, max_tokens=70, seed=1).json()["choices"][0]
    assert c["finish_reason"] == "length"
    (call,) = c["message"]["tool_calls"]  # cut in its arguments: returned as far as it got, as OpenAI does
    assert call["function"]["name"] in SCHEMAS and call["function"]["arguments"].startswith("{")
    chunks = sse(chat(caller, max_tokens=70, seed=1, stream=True).text)
    assert [x["function"] for x in streamed_calls(chunks)] == [call["function"]]


def test_parallel_calls_and_their_refusal(two_calls: TestClient) -> None:
    calls = chat(two_calls, max_tokens=200, seed=1).json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls[:2]] == ["clock", "clock"]  # the script's; the model may add more
    assert calls[0]["id"] != calls[1]["id"]
    for call in calls[:2]:
        check_call(call)
    chunks = sse(chat(two_calls, max_tokens=200, seed=1, stream=True).text)
    assert [c["function"] for c in streamed_calls(chunks)] == [c["function"] for c in calls]
    assert {d["index"] for ch in chunks[:-1] for d in ch["choices"][0]["delta"].get("tool_calls") or ()} >= {0, 1}
    # the grammar refuses a second trigger: the answer ends after the first call
    c = chat(two_calls, max_tokens=200, seed=1, parallel_tool_calls=False).json()["choices"][0]
    assert c["finish_reason"] == "tool_calls" and len(c["message"]["tool_calls"]) == 1


def test_free_text_stays_text(plain: TestClient) -> None:
    for seed in (1, 2, 3):
        c = chat(plain, max_tokens=30, seed=seed).json()["choices"][0]
        assert c["finish_reason"] in ("stop", "length")
        assert c["message"]["tool_calls"] is None and isinstance(c["message"]["content"], str)
        assert "<tool_call>" not in c["message"]["content"]


def test_none_describes_the_tools_and_calls_nothing(caller: TestClient) -> None:
    c = chat(caller, max_tokens=60, seed=1, tool_choice="none").json()["choices"][0]
    assert c["message"]["tool_calls"] is None
    assert c["message"]["content"].startswith("Let me check. <tool_call>")  # just text: nothing is parsed


def test_each_choice_parses_its_own_calls(caller: TestClient) -> None:
    whole = chat(caller, max_tokens=120, seed=4, n=2, parallel_tool_calls=False).json()["choices"]
    chunks = sse(chat(caller, max_tokens=120, seed=4, n=2, parallel_tool_calls=False, stream=True).text)
    for i in (0, 1):
        assert whole[i]["finish_reason"] == "tool_calls" and whole[i]["message"]["content"] == "Let me check."
        assert [c["function"] for c in streamed_calls(chunks, i)] == [
            c["function"] for c in whole[i]["message"]["tool_calls"]]
        finish = [c["choices"][0]["finish_reason"] for c in chunks[:-1]
                  if c["choices"] and c["choices"][0]["index"] == i and c["choices"][0]["finish_reason"]]
        assert finish == ["tool_calls"]
