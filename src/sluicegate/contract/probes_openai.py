"""Probes for the OpenAI-compatible surface: the generic JSON-boundary cases aimed at chat and completions,
plus the cases only these routes have (parameters OpenAI defines that this server refuses, combinations, the
model routes). Every refusal is a 400 `invalid_request_error` or a 404 `model_not_found`, as OpenAI's client
expects; see docs/openai.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sluicegate.contract.outcomes import dialect_outcomes
from sluicegate.contract.probes import MARKER, WEATHER_SCHEMA, Probe, ProbeOptions, Target, json_body_probes, register

INVALID = (400, "invalid_request_error")
OPENAI_EXPECT = dialect_outcomes(INVALID, media_type=(415, "unsupported_media_type"),
                                 too_large=(413, "body_too_large"), no_model=(404, "invalid_request_error"))
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat_target(opts: ProbeOptions) -> Target:
    base = {
        "model": opts.model or "model",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 1,
    }
    return Target(
        "chat", CHAT, base, tokens="max_tokens", prompt=("messages", 0, "content"), expect=OPENAI_EXPECT
    )


def completions_target(opts: ProbeOptions) -> Target:
    base = {"model": opts.model or "model", "prompt": "Hello", "max_tokens": 1}
    return Target("completions", COMPLETIONS, base, tokens="max_tokens", expect=OPENAI_EXPECT)


_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}


def chat_probes(opts: ProbeOptions) -> list[Probe]:
    t = chat_target(opts)

    def probe(case: str, body: bytes, refused: bool, note: str, **kw: Any) -> Probe:
        status, etype = INVALID if refused else (200, None)
        return Probe(
            f"chat:{case}", "POST", CHAT, body, expect_status=status, expect_type=etype, note=note, **kw
        )

    def msgs(*items: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        return list(items)

    user = {"role": "user", "content": "Hi"}
    out = [*json_body_probes(t)]
    for name, value in (
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("service_tier", "auto"),
        ("store", True),
        ("metadata", {"k": "v"}),
        ("reasoning_effort", "low"),
        ("web_search_options", {}),
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("prompt_cache_key", "k"),
        ("verbosity", "low"),
    ):
        out.append(
            probe(f"unsupported_{name}", t.encode(**{name: value}), True, f"{name}: OpenAI's, not ours")
        )
    out += [
        probe("messages_missing", t.encode(drop=["messages"]), True, "messages are required"),
        probe("messages_empty", t.encode(messages=[]), True, "at least one message"),
        probe("model_missing", t.encode(drop=["model"]), True, "OpenAI requires the model"),
        probe(
            "role_function",
            t.encode(messages=msgs({"role": "function", "name": "f", "content": "x"})),
            True,
            "the deprecated function role",
        ),
        probe(
            "role_unknown",
            t.encode(messages=msgs({"role": MARKER, "content": "x"})),
            True,
            "no such role",
            marker=True,
        ),
        probe(
            "image_part",
            t.encode(
                messages=msgs(
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}],
                    }
                )
            ),
            True,
            "text only",
        ),
        probe(
            "text_parts",
            t.encode(
                messages=msgs(
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}],
                    }
                )
            ),
            False,
            "content as text parts",
        ),
        probe(
            "message_name", t.encode(messages=msgs({**user, "name": "bob"})), True, "names are not rendered"
        ),
        probe(
            "message_unknown_field",
            t.encode(messages=msgs({**user, "frob": MARKER})),
            True,
            "an unknown field in a message",
            marker=True,
        ),
        probe("content_number", t.encode(messages=msgs({"role": "user", "content": 5})), True, "a number"),
        probe(
            "last_assistant",
            t.encode(messages=msgs(user, {"role": "assistant", "content": "x"})),
            True,
            "continuing the assistant's message is not supported",
        ),
        probe(
            "system_developer",
            t.encode(messages=msgs({"role": "developer", "content": "Be brief."}, user)),
            False,
            "developer renders as system",
        ),
        probe("n_too_big", t.encode(n=100), True, "n is at most 8"),
        probe("top_logprobs_alone", t.encode(top_logprobs=2), True, "top_logprobs needs logprobs"),
        probe("top_logprobs_big", t.encode(logprobs=True, top_logprobs=21), True, "at most 20"),
        probe("logprobs_ok", t.encode(logprobs=True, top_logprobs=2), False, "logprobs with 2 alternatives"),
        probe("both_max_tokens", t.encode(max_completion_tokens=1), True, "max_tokens and its new name"),
        probe(
            "max_completion_tokens",
            t.encode(drop=["max_tokens"], max_completion_tokens=1),
            False,
            "the new name alone",
        ),
        probe("seed_negative", t.encode(seed=-1), True, "seeds are 0..2^63-1"),
        probe("logit_bias_bad_key", t.encode(logit_bias={"abc": 1}), True, "keys are token ids"),
        probe("logit_bias_big_id", t.encode(logit_bias={"99999999": 1}), True, "past the vocabulary"),
        probe("logit_bias_range", t.encode(logit_bias={"1": 101}), True, "biases are -100..100"),
        probe("logit_bias_ok", t.encode(logit_bias={"1": -100}), False, "a valid bias"),
        probe(
            "stream_options_alone",
            t.encode(stream_options={"include_usage": True}),
            True,
            "stream_options needs stream",
        ),
        probe(
            "stream_options_unknown",
            t.encode(stream=True, stream_options={"include_obfuscation": True}),
            True,
            "not implemented",
        ),
        probe(
            "stream_ok",
            t.encode(stream=True, stream_options={"include_usage": True}),
            False,
            "a streamed answer",
        ),
        probe("response_format_unknown", t.encode(response_format={"type": "xml"}), True, "no such format"),
        probe("response_format_json", t.encode(response_format={"type": "json_object"}), False, "JSON mode"),
        probe(
            "schema_invalid",
            t.encode(
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}
            ),
            True,
            "a schema that is not one",
        ),
        probe("tools_auto", t.encode(tools=[_TOOL], max_tokens=4), False, "tool_choice auto, the default"),
        probe("tools_auto_stop", t.encode(tools=[_TOOL], stop=["}"]), True, "stop could cut a call"),
        probe(
            "tools_required",
            t.encode(tools=[_TOOL], tool_choice="required", max_tokens=4),
            False,
            "a forced call",
        ),
        probe(
            "tool_choice_unknown_fn",
            t.encode(tools=[_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
            True,
            "a function not in tools",
        ),
        probe("tool_choice_no_tools", t.encode(tool_choice="required"), True, "tool_choice without tools"),
        probe(
            "parallel_tool_calls",
            t.encode(tools=[_TOOL], tool_choice="required", parallel_tool_calls=True, max_tokens=4),
            False,
            "true permits several calls and never requires them",
        ),
        probe(
            "custom_tool",
            t.encode(tools=[{"type": "custom", "custom": {"name": "x"}}], tool_choice="none"),
            True,
            "function tools only",
        ),
        probe(
            "tool_json_stop",
            t.encode(response_format={"type": "json_object"}, stop=["}"]),
            True,
            "stop could cut the JSON",
        ),
    ]
    return out


def completions_probes(opts: ProbeOptions) -> list[Probe]:
    t = completions_target(opts)

    def probe(case: str, body: bytes, refused: bool, note: str, **kw: Any) -> Probe:
        status, etype = INVALID if refused else (200, None)
        return Probe(
            f"completions:{case}",
            "POST",
            COMPLETIONS,
            body,
            expect_status=status,
            expect_type=etype,
            note=note,
            **kw,
        )

    return [
        *json_body_probes(t),
        probe("best_of", t.encode(best_of=2), True, "no server-side ranking"),
        probe("prompt_empty", t.encode(""), True, "an empty prompt"),
        probe("prompt_tokens", t.encode(prompt=[72, 105]), False, "token ids"),
        probe("prompt_token_too_big", t.encode(prompt=[10**8]), True, "past the vocabulary"),
        probe("prompt_list", t.encode(prompt=["Hello", "Bye"]), False, "two prompts"),
        probe("prompt_mixed", t.encode(prompt=["Hello", 5]), True, "a string and a number"),
        probe("too_many_choices", t.encode(prompt=["a", "b", "c"], n=8), True, "24 choices"),
        probe("logprobs_big", t.encode(logprobs=6), True, "at most 5"),
        probe("logprobs_bool", t.encode(logprobs=True), True, "a count, not a boolean"),
        probe("echo_logprobs", t.encode(echo=True, logprobs=1), True, "prompt logprobs are not computed"),
        probe("echo_ok", t.encode(echo=True), False, "the prompt comes back first"),
        probe("suffix_no_fim", t.encode(suffix="end"), True, "this server's models have no FIM tokens"),
        probe("stream_ok", t.encode(stream=True), False, "a streamed answer"),
        probe("stop_string", t.encode(stop="\n"), False, "a single stop string"),
        probe("stop_too_many", t.encode(stop=["a", "b", "c", "d", "e"]), True, "at most 4 stop strings"),
        probe("model_number", t.encode(model=7), True, "a number for the model name"),
    ]


def models_probes(opts: ProbeOptions) -> list[Probe]:
    name = opts.model or "model"
    return [
        Probe("models:list", "GET", "/v1/models", headers=(), note="the served model"),
        Probe(
            "models:get",
            "GET",
            f"/v1/models/{name}",
            headers=(),
            note="one model",
            expect_status=200 if opts.model else 404,
            expect_type=None if opts.model else "invalid_request_error",
        ),
        Probe(
            "models:unknown",
            "GET",
            f"/v1/models/{MARKER}",
            headers=(),
            expect_status=404,
            expect_type="invalid_request_error",
            note="model_not_found",
            marker=True,
        ),
        Probe(
            "models:post",
            "POST",
            "/v1/models",
            json.dumps({}).encode(),
            expect_status=405,
            expect_type="method_not_allowed",
            note="a GET route",
        ),
    ]


register("chat", chat_probes)
register("completions", completions_probes)
register("models", models_probes)
