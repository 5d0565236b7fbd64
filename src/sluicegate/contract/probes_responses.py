"""Probes for `/v1/responses`: the generic JSON-boundary cases, the parameters OpenAI defines that this server
refuses (built-in tools, background, reasoning, ...), the item and format shapes, and the stored-response routes.
Every refusal is a 400 `invalid_request_error`, or a 404 for a response this key does not have; see
docs/openai.md."""

from __future__ import annotations

import json
from typing import Any

from sluicegate.contract.probes import MARKER, WEATHER_SCHEMA, Probe, ProbeOptions, Target, json_body_probes, register
from sluicegate.contract.probes_openai import INVALID, OPENAI_EXPECT

RESPONSES = "/v1/responses"
NO_SUCH = "resp_" + "0" * 24
_TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}
NOT_FOUND = (404, "invalid_request_error")


def responses_target(opts: ProbeOptions) -> Target:
    base = {"model": opts.model or "model", "input": "Hello", "max_output_tokens": 1, "store": False}
    return Target("responses", RESPONSES, base, tokens="max_output_tokens", prompt=("input",),
                  expect=OPENAI_EXPECT)


def responses_probes(opts: ProbeOptions) -> list[Probe]:
    t = responses_target(opts)

    def probe(case: str, body: bytes, refused: bool | tuple[int, str], note: str, **kw: Any) -> Probe:
        expect: tuple[int, str | None] = (200, None)
        if isinstance(refused, tuple):
            expect = refused
        elif refused:
            expect = INVALID
        status, etype = expect
        return Probe(f"responses:{case}", "POST", RESPONSES, body, expect_status=status, expect_type=etype,
                     note=note, **kw)

    def fmt(text: dict[str, Any]) -> bytes:  # `text` is also encode's prompt argument: set it by hand
        return json.dumps({**t.body(), "text": text}).encode()

    user = {"role": "user", "content": "Hi"}
    out = [*json_body_probes(t)]
    for name, value in (
        ("background", True),
        ("reasoning", {"effort": "low"}),
        ("conversation", "conv_1"),
        ("prompt", {"id": "pmpt_1"}),
        ("service_tier", "auto"),
        ("top_logprobs", 2),
        ("prompt_cache_key", "k"),
        ("max_tool_calls", 2),
    ):
        out.append(probe(f"unsupported_{name}", t.encode(**{name: value}), True, f"{name}: OpenAI's, not ours"))
    out += [
        probe("input_missing", t.encode(drop=["input"]), True, "input is required"),
        probe("input_empty_list", t.encode(input=[]), True, "at least one item"),
        probe("input_items", t.encode(input=[user, {"role": "user", "content": [
            {"type": "input_text", "text": "there"}]}]), False, "easy messages and input_text parts"),
        probe("input_image", t.encode(input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://127.0.0.1/x.png"}]}]), True, "text only"),
        probe("item_reference", t.encode(input=[{"type": "item_reference", "id": "msg_1"}]), True,
              "no item references"),
        probe("item_unknown_type", t.encode(input=[{"type": MARKER}]), True, "no such item", marker=True),
        probe("item_unknown_field", t.encode(input=[{**user, "frob": MARKER}]), True, "an unknown field",
              marker=True),
        probe("role_unknown", t.encode(input=[{"role": MARKER, "content": "x"}]), True, "no such role",
              marker=True),
        probe("last_assistant", t.encode(input=[user, {"role": "assistant", "content": "x"}]), True,
              "continuing the assistant's message is not supported"),
        probe("function_call_output", t.encode(input=[
            user,
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "4 degrees"},
        ]), False, "a call and its output"),
        probe("instructions", t.encode(instructions="Be brief."), False, "a system message first"),
        probe("metadata", t.encode(metadata={"k": "v"}), False, "kept with the response"),
        probe("metadata_too_many", t.encode(metadata={str(i): "v" for i in range(17)}), True, "at most 16"),
        probe("include", t.encode(include=["message.output_text.logprobs"]), True, "nothing to include"),
        probe("truncation_auto", t.encode(truncation="auto"), True, "a conversation over the window is refused"),
        probe("web_search", t.encode(tools=[{"type": "web_search"}]), True, "no built-in tools"),
        probe("tools_auto", t.encode(tools=[_TOOL], max_output_tokens=4), False, "tool_choice auto, the default"),
        probe("tools_required", t.encode(tools=[_TOOL], tool_choice="required", max_output_tokens=4), False,
              "a forced call"),
        probe("tool_choice_named", t.encode(tools=[_TOOL], tool_choice={"type": "function", "name": "get_weather"},
                                            max_output_tokens=4), False, "a named call"),
        probe("tool_choice_unknown_fn", t.encode(tools=[_TOOL], tool_choice={"type": "function", "name": "nope"}),
              True, "a function not in tools"),
        probe("tool_choice_builtin", t.encode(tools=[_TOOL], tool_choice={"type": "file_search"}), True,
              "no built-in tools"),
        probe("tool_choice_no_tools", t.encode(tool_choice="required"), True, "tool_choice without tools"),
        probe("chat_shaped_tool", t.encode(tools=[{"type": "function", "function": {"name": "x"}}]), True,
              "tools are flat here"),
        probe("format_json", fmt({"format": {"type": "json_object"}}), False, "JSON mode"),
        probe("format_schema_invalid", fmt({"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}),
              True, "not a schema"),
        probe("format_unknown", fmt({"format": {"type": "xml"}}), True, "no such format"),
        probe("verbosity", fmt({"verbosity": "low"}), True, "a model's reasoning is its own, not set per request"),
        probe("stream_ok", t.encode(stream=True), False, "the typed events"),
        probe("previous_unknown", t.encode(previous_response_id=NO_SUCH), NOT_FOUND, "no such stored response"),
        probe("previous_malformed", t.encode(previous_response_id=MARKER), True, "not a response id",
              marker=True),
        Probe("responses:get_unknown", "GET", f"{RESPONSES}/{NO_SUCH}", headers=(), expect_status=404,
              expect_type="invalid_request_error", note="no such stored response"),
        Probe("responses:get_marker", "GET", f"{RESPONSES}/{MARKER}", headers=(), expect_status=404,
              expect_type="invalid_request_error", note="not an id", marker=True),
        Probe("responses:items_unknown", "GET", f"{RESPONSES}/{NO_SUCH}/input_items", headers=(),
              expect_status=404, expect_type="invalid_request_error", note="no such stored response"),
        Probe("responses:delete_unknown", "DELETE", f"{RESPONSES}/{NO_SUCH}", headers=(), expect_status=404,
              expect_type="invalid_request_error", note="no such stored response"),
    ]
    return out


register("responses", responses_probes)
