"""/v1/responses in process, on the reference backend: shapes, typed stream events, refusals by name, the store
(GET, input_items, DELETE, previous_response_id per key), tool calls and JSON output through the chat path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi.testclient import TestClient

from sluicegate.backends.reference import ReferenceRunner
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import auth, served
from tests.api.test_openai_chat import TIME, TOOLS, WEATHER
from tests.api.test_openai_tools_auto import client_for
from tests.conftest import make_client, wait_ready

URL = "/v1/responses"
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client(factory=lambda: ReferenceRunner(n_ctx=2048, n_slots=8)) as c:
        wait_ready(c)
        yield c


def create(client: TestClient, **body: Any) -> Any:
    return client.post(URL, json={"model": "reference", "input": "Hi", **body})


def events(text: str) -> list[dict[str, Any]]:
    """The typed events of a streamed response; asserts the framing and the numbering."""
    datas = [e.split("data: ", 1)[1] for e in text.split("\n\n") if e.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    out = [json.loads(d) for d in datas[:-1]]
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def test_shape_and_incomplete(client: TestClient) -> None:
    body = create(client, max_output_tokens=5, temperature=0, metadata={"k": "v"}, instructions="Be brief.").json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["model"] == "reference@seed0" and body["metadata"] == {"k": "v"}
    assert body["instructions"] == "Be brief." and body["store"] is True and body["error"] is None
    (msg,) = body["output"]
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["id"].startswith("msg_")
    assert msg["content"][0]["type"] == "output_text"
    u = body["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert "cached_tokens" in u["input_tokens_details"]
    if u["output_tokens"] == 5:  # the reference model rarely stops by itself within 5 tokens
        assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    else:
        assert body["status"] == "completed" and body["incomplete_details"] is None


def test_stream_events_equal_the_whole_answer(client: TestClient) -> None:
    kw = {"max_output_tokens": 12, "temperature": 0, "store": False}
    whole = create(client, **kw).json()
    evs = events(create(client, **kw, stream=True).text)
    kinds = [e["type"] for e in evs]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if whole["status"] == "completed" else "response.incomplete"]
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert text == whole["output"][0]["content"][0]["text"]
    final = evs[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    for k in ("input_tokens", "output_tokens", "total_tokens"):  # the second run's prompt is cached: not compared
        assert final["usage"][k] == whole["usage"][k]
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["id"] == final["id"]


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"background": True}, "background", "unsupported_parameter"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "unsupported_parameter"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_tool"),
    ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_value"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "unsupported_value"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", "unsupported_content"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}, "verbosity": "low"}},
     "text.verbosity", "unsupported_parameter"),
    ({"tool_choice": {"type": "web_search_preview"}, "tools": FLAT_TOOLS}, "tool_choice.type",
     "unsupported_tool_choice"),
    ({"bogus": 1}, "bogus", "unknown_field"),
    ({"max_output_tokens": 0}, "max_output_tokens", None),
    ({"truncation": "auto"}, "truncation", None),
    ({"tool_choice": "auto"}, "tool_choice", "invalid_combination"),
    ({"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name",
     "unknown_function"),
    ({"input": [{"role": "assistant", "content": "hi"}]}, "input", "unsupported_value"),
    ({"max_output_tokens": 100_000}, "max_output_tokens", "context_length_exceeded"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}}, "text.format.schema",
     "unsupported_schema"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}], "tool_choice": "required"},
     "tools", "unsupported_schema"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}],
      "tool_choice": {"type": "function", "name": "f"}}, "tools[0].parameters", "unsupported_schema"),
])
def test_refusals_name_the_parameter(client: TestClient, body: dict[str, Any], param: str, code: str | None) -> None:
    r = create(client, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err


def test_store_get_items_continue_and_delete(client: TestClient) -> None:
    first = create(client, input=[{"role": "user", "content": "One"}], max_output_tokens=6, temperature=0).json()
    rid = first["id"]
    assert client.get(f"{URL}/{rid}").json() == first
    second = create(client, input="Two", previous_response_id=rid, max_output_tokens=6, temperature=0).json()
    assert second["previous_response_id"] == rid
    assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0  # turn 1's prompt is in the prefix cache
    items = client.get(f"{URL}/{second['id']}/input_items", params={"order": "asc"}).json()
    assert items["object"] == "list" and items["has_more"] is False
    texts = [p["text"] for i in items["data"] for p in i["content"]]
    assert texts == ["One", first["output"][0]["content"][0]["text"], "Two"]
    newest = client.get(f"{URL}/{second['id']}/input_items", params={"limit": 1}).json()
    assert newest["has_more"] is True and newest["data"][0]["content"][0]["text"] == "Two"
    rest = client.get(f"{URL}/{second['id']}/input_items", params={"after": newest["last_id"]}).json()
    assert [i["id"] for i in rest["data"]] == [i["id"] for i in reversed(items["data"][:2])]
    assert client.get(f"{URL}/{rid}/input_items", params={"after": "nope"}).json()["error"]["param"] == "after"
    gone = client.delete(f"{URL}/{rid}")
    assert gone.json() == {"id": rid, "object": "response", "deleted": True}
    for r in (client.get(f"{URL}/{rid}"), client.delete(f"{URL}/{rid}"), create(client, previous_response_id=rid)):
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", r.text
    assert client.get(f"{URL}/resp_x").status_code == 404


def test_store_false_keeps_nothing(client: TestClient) -> None:
    body = create(client, store=False, max_output_tokens=2).json()
    assert body["store"] is False and client.get(f"{URL}/{body['id']}").status_code == 404
    assert create(client, previous_response_id=body["id"]).status_code == 404


def test_streamed_response_is_stored(client: TestClient) -> None:
    evs = events(create(client, stream=True, max_output_tokens=4, temperature=0).text)
    final = evs[-1]["response"]
    assert client.get(f"{URL}/{final['id']}").json() == final


def test_json_schema_output(client: TestClient) -> None:
    fmt = {"type": "json_schema", "name": "weather", "schema": WEATHER}
    body = create(client, text={"format": fmt}, max_output_tokens=64).json()
    assert body["text"]["format"]["name"] == "weather"
    jsonschema.validate(json.loads(body["output"][0]["content"][0]["text"]), WEATHER)


@pytest.fixture
def caller() -> Iterator[TestClient]:
    yield from client_for('<tool_call>{"name": "clock", "arguments": {"tz": "UTC"}}</tool_call>')


def test_function_call_round_trip_streamed_and_whole(caller: TestClient) -> None:
    whole = create(caller, tools=FLAT_TOOLS, max_output_tokens=80, parallel_tool_calls=False).json()
    calls = [o for o in whole["output"] if o["type"] == "function_call"]
    assert calls and whole["status"] == "completed", whole
    call = calls[0]
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_") and call["name"] == "clock"
    jsonschema.validate(json.loads(call["arguments"]), TIME)
    evs = events(create(caller, tools=FLAT_TOOLS, max_output_tokens=80, parallel_tool_calls=False, stream=True).text)
    added = [e["item"] for e in evs if e["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == [o["type"] for o in whole["output"]]
    args = "".join(e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta"
                   and e["output_index"] == len(added) - len(calls))
    done = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
    assert done[0]["arguments"] == args == call["arguments"] and done[0]["name"] == "clock"
    # the call's output goes back as an item; the conversation continues from the stored response
    back = create(caller, previous_response_id=whole["id"], tools=FLAT_TOOLS, tool_choice="none",
                  input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "12:00"}],
                  max_output_tokens=4)
    assert back.status_code == 200, back.text
    kinds = [i["type"] for i in caller.get(f"{URL}/{back.json()['id']}/input_items",
                                            params={"order": "asc"}).json()["data"]]
    assert kinds == ["message", *[o["type"] for o in whole["output"]], "function_call_output"]
    # the same, sent whole as items (no store)
    items = [{"role": "user", "content": "Hi"}, *whole["output"],
             {"type": "function_call_output", "call_id": call["call_id"], "output": "12:00"}]
    assert create(caller, input=items, store=False, max_output_tokens=4).status_code == 200


def test_stored_per_key(db_url: str) -> None:
    """On the real store (SQLite, then Postgres): another key's response is 404 to read, list, delete or
    continue; the owner's is there."""
    with served(db_url) as s:
        _, a = s.key(Scope.GENERATE)
        _, b = s.key(Scope.GENERATE)
        body = {"model": "reference", "input": "Hi", "max_output_tokens": 2}
        r = httpx.post(f"{s.url}{URL}", json=body, headers=auth(a), timeout=60)
        assert r.status_code == 200, r.text
        rid = r.json()["id"]
        assert httpx.get(f"{s.url}{URL}/{rid}", headers=auth(a), timeout=30).json() == r.json()
        for other in (httpx.get(f"{s.url}{URL}/{rid}", headers=auth(b), timeout=30),
                      httpx.get(f"{s.url}{URL}/{rid}/input_items", headers=auth(b), timeout=30),
                      httpx.delete(f"{s.url}{URL}/{rid}", headers=auth(b), timeout=30),
                      httpx.post(f"{s.url}{URL}", json={**body, "previous_response_id": rid}, headers=auth(b),
                                 timeout=60)):
            assert other.status_code == 404 and other.json()["error"]["code"] == "response_not_found", other.text
        again = httpx.post(f"{s.url}{URL}", json={**body, "previous_response_id": rid}, headers=auth(a), timeout=60)
        assert again.status_code == 200, again.text
        assert httpx.delete(f"{s.url}{URL}/{rid}", headers=auth(a), timeout=30).status_code == 200


def test_idempotency_key_replays_and_deadline_header_is_read(client: TestClient) -> None:
    headers = {"Idempotency-Key": "resp-1"}
    first = client.post(URL, json={"model": "reference", "input": "Hi", "max_output_tokens": 3}, headers=headers)
    again = client.post(URL, json={"model": "reference", "input": "Hi", "max_output_tokens": 3}, headers=headers)
    assert first.status_code == again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true" and again.json() == first.json()
    other = client.post(URL, json={"model": "reference", "input": "Bye", "max_output_tokens": 3}, headers=headers)
    assert other.status_code == 400 and other.json()["error"]["param"] == "Idempotency-Key"
    bad = client.post(URL, json={"model": "reference", "input": "Hi"}, headers={"X-Request-Timeout": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Request-Timeout"


def test_huge_and_deeply_nested_input_is_refused_cleanly(client: TestClient) -> None:
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    r = create(client, input=[{"role": "user", "content": deep}])
    assert r.status_code == 400 and "x" * 3 not in r.text
    many = create(client, input=[{"role": "user", "content": "Hi"}] * 1025)
    assert many.status_code == 400 and many.json()["error"]["param"] == "input"
