"""Probes for Anthropic's Messages surface: the generic JSON-boundary cases aimed at `/v1/messages`, plus the
cases only it has (Anthropic's parameters this server refuses, content blocks, tools, count_tokens). Every
refusal is in Anthropic's shape and statuses (api/anthropic_errors.py; docs/anthropic.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.contract.outcomes import dialect_outcomes
from sluicegate.contract.probes import MARKER, WEATHER_SCHEMA, Probe, ProbeOptions, Target, json_body_probes, register

INVALID = (400, "invalid_request_error")
ANTHROPIC_EXPECT = dialect_outcomes(INVALID, media_type=(415, "invalid_request_error"),
                                    too_large=(413, "request_too_large"), no_model=(404, "not_found_error"))
MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
_TOOL = {"name": "get_weather", "input_schema": WEATHER_SCHEMA}


def messages_target(opts: ProbeOptions) -> Target:
    base = {"model": opts.model or "model", "max_tokens": 1, "messages": [{"role": "user", "content": "Hello"}]}
    return Target("messages", MESSAGES, base, tokens="max_tokens", prompt=("messages", 0, "content"),
                  expect=ANTHROPIC_EXPECT)


def messages_probes(opts: ProbeOptions) -> list[Probe]:
    t = messages_target(opts)
    model = opts.model or "model"

    def probe(case: str, body: bytes, refused: bool, note: str, path: str = MESSAGES, **kw: Any) -> Probe:
        status, etype = INVALID if refused else (200, None)
        return Probe(f"messages:{case}", "POST", path, body, expect_status=status, expect_type=etype, note=note,
                     **kw)

    def user(content: Any) -> list[Mapping[str, Any]]:
        return [{"role": "user", "content": content}]

    out = [*json_body_probes(t)]
    for name, value in (
        ("thinking", {"type": "enabled", "budget_tokens": 1024}),
        ("output_config", {"format": {"type": "json_schema", "schema": {}}}),
        ("container", "c"),
        ("mcp_servers", []),
        ("service_tier", "auto"),
        ("context_management", {}),
    ):
        out.append(probe(f"unsupported_{name}", t.encode(**{name: value}), True, f"{name}: Anthropic's, not ours"))
    out += [
        probe("max_tokens_missing", t.encode(drop=["max_tokens"]), True, "max_tokens is required"),
        probe("messages_empty", t.encode(messages=[]), True, "at least one message"),
        probe("role_system", t.encode(messages=[{"role": "system", "content": "x"}]), True, "system is a field"),
        probe("image_block", t.encode(messages=user([{"type": "image", "source": {"type": "url", "url": "x"}}])),
              True, "text only"),
        probe("document_block", t.encode(messages=user([{"type": "document", "source": {}}])), True, "text only"),
        probe("block_unknown_field", t.encode(messages=user([{"type": "text", "text": "x", "frob": MARKER}])),
              True, "an unknown field in a block", marker=True),
        probe("text_blocks", t.encode(messages=user([{"type": "text", "text": "Hello"}, {"type": "text",
                                                                                          "text": " there"}])),
              False, "content as text blocks"),
        probe("system_string", t.encode(system="Be brief."), False, "a system prompt"),
        probe("system_blocks", t.encode(system=[{"type": "text", "text": "Be brief.",
                                                 "cache_control": {"type": "ephemeral"}}]),
              False, "system as text blocks, with a cache breakpoint"),
        probe("system_image", t.encode(system=[{"type": "image"}]), True, "system takes text blocks"),
        probe("last_assistant", t.encode(messages=[*user("Hi"), {"role": "assistant", "content": "The"}]), True,
              "prefill is not supported"),
        probe("temperature_above_1", t.encode(temperature=1.5), True, "Anthropic's range is 0..1"),
        probe("top_k", t.encode(top_k=40, temperature=0.7), False, "top_k"),
        probe("top_k_negative", t.encode(top_k=-1), True, "out of range"),
        probe("stop_sequences", t.encode(stop_sequences=["\n\n"]), False, "a stop sequence"),
        probe("stop_sequences_many", t.encode(stop_sequences=["a", "b", "c", "d", "e"]), True, "at most 4"),
        probe("metadata", t.encode(metadata={"user_id": "u-1"}), False, "user_id is logged"),
        probe("metadata_unknown", t.encode(metadata={"user_id": "u", "tier": "x"}), True, "user_id only"),
        probe("stream", t.encode(stream=True), False, "a streamed answer"),
        probe("tools_auto", t.encode(tools=[_TOOL], max_tokens=4), False, "tool_choice auto, the default"),
        probe("tool_choice_auto", t.encode(tools=[_TOOL], tool_choice={"type": "auto", "disable_parallel_tool_use":
                                                                        True}, max_tokens=4), False, "auto, one call"),
        probe("tools_auto_stop", t.encode(tools=[_TOOL], stop_sequences=["}"]), True, "stop could cut a call"),
        probe("tool_choice_any", t.encode(tools=[_TOOL], tool_choice={"type": "any"}, max_tokens=4), False,
              "a forced call"),
        probe("tool_choice_tool", t.encode(tools=[_TOOL], tool_choice={"type": "tool", "name": "get_weather"},
                                           max_tokens=4), False, "a named call"),
        probe("tool_choice_none", t.encode(tools=[_TOOL], tool_choice={"type": "none"}), False, "no call"),
        probe("tool_choice_unknown", t.encode(tools=[_TOOL], tool_choice={"type": "tool", "name": "nope"}), True,
              "a tool not in tools"),
        probe("tool_choice_no_tools", t.encode(tool_choice={"type": "any"}), True, "tool_choice without tools"),
        probe("server_tool", t.encode(tools=[{"type": "web_search_20250305", "name": "web_search"}],
                                      tool_choice={"type": "any"}), True, "client tools only"),
        probe("tool_no_schema", t.encode(tools=[{"name": "f"}], tool_choice={"type": "any"}), True,
              "input_schema is required"),
        probe("tool_use_and_result", t.encode(tools=[_TOOL], tool_choice={"type": "none"}, messages=[
            *user("Weather in Oslo?"),
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}]},
            *user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 C"}])]),
              False, "a tool call and its result"),
        probe("count_ok", b'{"model": "%s", "messages": [{"role": "user", "content": "Hello"}]}' % model.encode(),
              False, "count the prompt", path=COUNT),
        probe("count_max_tokens", t.encode(), True, "count_tokens takes no max_tokens", path=COUNT),
        Probe("messages:count_no_model", "POST", COUNT,
              b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}]}' % MARKER.encode(),
              expect_status=404, expect_type="not_found_error", note="no such model", marker=True),
    ]
    return out


register("messages", messages_probes)
