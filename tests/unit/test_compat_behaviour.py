"""The classifier's verdicts, checked against what validators actually do with real payloads.

Each case is an old and a new pydantic model plus the payloads that cross the wire: for a request, what
old clients send (valid under the old schema, at its limits, with optionals omitted, every enum value);
for a response, what the new server may send (valid under the new schema, at its limits, new values,
null where allowed, new fields). A request change broke if the new schema rejects such a payload or
pydantic reads it differently; a response change broke if the old schema (closed to unknown fields for a
strict reader) rejects it or an old client reads it differently. The classifier must say breaking exactly
when that happened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from sluicegate.contract import compat
from sluicegate.contract.diff_schemas import diff_schemas

Payload = dict[str, Any]


def model(name: str = "Body", /, extra: Literal["forbid", "allow"] | None = None,
          **fields: Any) -> type[BaseModel]:
    return create_model(name, __config__=ConfigDict(extra=extra) if extra else None, **fields)


@dataclass(frozen=True)
class Case:
    name: str
    direction: Literal["request", "response"]
    old: type[BaseModel]
    new: type[BaseModel]
    payloads: tuple[Payload, ...]
    breaking: bool
    kind: str | None  # a kind the classifier must report; None: it must report no change at all
    reader: Literal["tolerant", "strict"] = "tolerant"


def message_model(content_max: int = 100, roles: tuple[str, ...] = ("user", "assistant"), **more: Any) -> Any:
    return model("Message", role=(Literal[roles], ...), content=(str, Field(max_length=content_max)), **more)


def choice_model(reasons: tuple[str, ...] = ("stop", "length"), **more: Any) -> Any:
    return model("Choice", index=(int, Field(ge=0)), finish_reason=(Literal[reasons], ...), **more)


STREAM_RULE = {"if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
               "then": {"required": ["stream"], "properties": {"stream": {"const": True}}}}


def ruled(**fields: Any) -> type[BaseModel]:
    """A request model whose schema carries STREAM_RULE in `allOf` (pydantic itself does not enforce it)."""
    return create_model("Body", __config__=ConfigDict(json_schema_extra={"allOf": [STREAM_RULE]}), **fields)


Text = model("Text", type=(Literal["text"], ...), text=(str, ...))
Image = model("Image", type=(Literal["image"], ...), url=(str, ...))
Audio = model("Audio", type=(Literal["audio"], ...), data=(str, ...))


class TreeOld(BaseModel):
    kind: Literal["leaf", "branch"]
    children: list[TreeOld] = []


class TreeNew(BaseModel):
    kind: Literal["leaf", "branch", "root"]
    children: list[TreeNew] = []


def _msg(content: str = "hi", role: str = "user") -> Payload:
    return {"role": role, "content": content}


REQ, RESP = "request", "response"

CASES: list[Case] = [
    # ---- requests: limits
    Case("maximum raised", REQ, model(max_tokens=(int, Field(16, ge=1, le=100))),
         model(max_tokens=(int, Field(16, ge=1, le=200))), ({}, {"max_tokens": 1}, {"max_tokens": 100}),
         False, "maximum_raised"),
    Case("maximum lowered", REQ, model(max_tokens=(int, Field(16, ge=1, le=100))),
         model(max_tokens=(int, Field(16, ge=1, le=50))), ({}, {"max_tokens": 1}, {"max_tokens": 100}),
         True, "maximum_lowered"),
    Case("exclusive maximum made inclusive", REQ, model(temperature=(float, Field(1.0, ge=0, lt=2))),
         model(temperature=(float, Field(1.0, ge=0, le=2))), ({}, {"temperature": 0}, {"temperature": 1.999}),
         False, "maximum_raised"),
    Case("integer lt 11 rewritten as le 10", REQ, model(n=(int, Field(1, lt=11))),
         model(n=(int, Field(1, le=10))),
         ({}, {"n": 10}, {"n": -3}), False, None),
    Case("minimum lowered", REQ, model(top_p=(float, Field(1.0, gt=0.1, le=1))),
         model(top_p=(float, Field(1.0, gt=0, le=1))), ({}, {"top_p": 0.1001}, {"top_p": 1}),
         False, "minimum_lowered"),
    Case("minimum raised", REQ, model(seed=(int, Field(0, ge=0))), model(seed=(int, Field(0, ge=1))),
         ({}, {"seed": 0}, {"seed": 7}), True, "minimum_raised"),
    Case("maxLength raised", REQ, model(prompt=(str, Field(min_length=1, max_length=10))),
         model(prompt=(str, Field(min_length=1, max_length=20))), ({"prompt": "a"}, {"prompt": "a" * 10}),
         False, "maxLength_raised"),
    Case("maxLength lowered", REQ, model(prompt=(str, Field(min_length=1, max_length=10))),
         model(prompt=(str, Field(min_length=1, max_length=5))), ({"prompt": "a"}, {"prompt": "a" * 10}),
         True, "maxLength_lowered"),
    Case("minLength raised", REQ, model(prompt=(str, Field(min_length=1))),
         model(prompt=(str, Field(min_length=2))),
         ({"prompt": "a"}, {"prompt": "abc"}), True, "minLength_raised"),
    Case("maxItems raised", REQ, model(stop=(list[str], Field([], max_length=2))),
         model(stop=(list[str], Field([], max_length=4))), ({}, {"stop": []}, {"stop": ["a", "b"]}),
         False, "maxItems_raised"),
    # ---- requests: properties
    Case("optional property added", REQ, model(prompt=(str, ...)),
         model(prompt=(str, ...), suffix=(str | None, None)), ({"prompt": "x"},), False, "property_added"),
    Case("required property added", REQ, model(prompt=(str, ...)), model(prompt=(str, ...), model=(str, ...)),
         ({"prompt": "x"},), True, "required_property_added"),
    Case("property made required", REQ, model(user=(str, "anon")), model(user=(str, ...)),
         ({}, {"user": "u"}), True, "property_made_required"),
    Case("property made optional", REQ, model(user=(str, ...)), model(user=(str, "anon")),
         ({"user": "u"}, {"user": ""}), False, "property_made_optional"),
    Case("property removed, extras ignored", REQ, model(prompt=(str, ...), user=(str | None, None)),
         model(prompt=(str, ...)), ({"prompt": "x"}, {"prompt": "x", "user": "u"}), True, "property_removed"),
    Case("property removed, extras forbidden", REQ,
         model(extra="forbid", prompt=(str, ...), user=(str | None, None)),
         model(extra="forbid", prompt=(str, ...)), ({"prompt": "x"}, {"prompt": "x", "user": "u"}),
         True, "property_removed"),
    Case("default changed", REQ, model(max_tokens=(int, 16)), model(max_tokens=(int, 32)),
         ({}, {"max_tokens": 5}), True, "default_changed"),
    # ---- requests: values and types
    Case("enum value added", REQ, model(role=(Literal["user", "assistant"], ...)),
         model(role=(Literal["user", "assistant", "system"], ...)), ({"role": "user"}, {"role": "assistant"}),
         False, "enum_value_added"),
    Case("enum value removed", REQ, model(role=(Literal["user", "assistant"], ...)),
         model(role=(Literal["user"], ...)),
         ({"role": "user"}, {"role": "assistant"}), True, "enum_value_removed"),
    Case("number narrowed to integer", REQ, model(x=(float, 1.0)), model(x=(int, 1)),
         ({}, {"x": 2}, {"x": 0.5}), True, "type_narrowed"),
    Case("integer widened to number", REQ, model(x=(int, 1)), model(x=(float, 1.0)),
         ({}, {"x": 3}, {"x": -2}), False, "type_widened"),
    Case("union branch added", REQ, model(stop=(str, ...)), model(stop=(str | list[str], ...)),
         ({"stop": "a"}, {"stop": ""}), False, "branch_added"),
    Case("union branch removed", REQ, model(stop=(str | list[str], ...)), model(stop=(str, ...)),
         ({"stop": "a"}, {"stop": ["a"]}), True, "branch_removed"),
    Case("nullable added", REQ, model(seed=(int, ...)), model(seed=(int | None, ...)),
         ({"seed": 0}, {"seed": 5}), False, "nullable_added"),
    Case("nullable removed", REQ, model(seed=(int | None, ...)), model(seed=(int, ...)),
         ({"seed": 0}, {"seed": None}), True, "nullable_removed"),
    Case("unknown fields now allowed", REQ, model(extra="forbid", prompt=(str, ...)),
         model(prompt=(str, ...)),
         ({"prompt": "x"},), False, "additional_properties_widened"),
    Case("unknown fields now refused", REQ, model(prompt=(str, ...)),
         model(extra="forbid", prompt=(str, ...)),
         ({"prompt": "x"}, {"prompt": "x", "client_tag": "y"}), True, "additional_properties_narrowed"),
    Case("pattern added", REQ, model(name=(str, ...)), model(name=(str, Field(pattern="^[a-z]+$"))),
         ({"name": "abc"}, {"name": "Abc-1"}), True, "pattern_added"),
    Case("pattern removed", REQ, model(name=(str, Field(pattern="^[a-z]+$"))), model(name=(str, ...)),
         ({"name": "abc"}, {"name": "z"}), False, "pattern_removed"),
    # ---- requests: nested
    Case("nested: message content maxLength lowered", REQ,
         model(messages=(list[message_model()], Field(min_length=1))),
         model(messages=(list[message_model(content_max=50)], Field(min_length=1))),
         ({"messages": [_msg()]}, {"messages": [_msg("a" * 100), _msg("", "assistant")]}),
         True, "maxLength_lowered"),
    Case("nested: message role value added", REQ, model(messages=(list[message_model()], ...)),
         model(messages=(list[message_model(roles=("user", "assistant", "system"))], ...)),
         ({"messages": []}, {"messages": [_msg(), _msg("x" * 100, "assistant")]}), False, "enum_value_added"),
    Case("nested: optional message field added", REQ, model(messages=(list[message_model()], ...)),
         model(messages=(list[message_model(name=(str | None, None))], ...)),
         ({"messages": [_msg(), _msg("b", "assistant")]},), False, "property_added"),
    Case("nested: discriminated union variant removed", REQ,
         model(part=(Annotated[Text | Image, Field(discriminator="type")], ...)),
         model(part=(Text, ...)),
         ({"part": {"type": "text", "text": "hi"}}, {"part": {"type": "image", "url": "u"}}),
         True, "branch_removed"),
    Case("nested: discriminated union variant added", REQ,
         model(part=(Annotated[Text | Image, Field(discriminator="type")], ...)),
         model(part=(Annotated[Text | Image | Audio, Field(discriminator="type")], ...)),
         ({"part": {"type": "text", "text": "hi"}}, {"part": {"type": "image", "url": "u"}}),
         False, "branch_added"),
    Case("nested: recursive tree gains a kind", REQ, TreeOld, TreeNew,
         ({"kind": "leaf"},
          {"kind": "branch", "children": [{"kind": "leaf"}, {"kind": "branch", "children": []}]}),
         False, "enum_value_added"),
    # ---- requests: cross-field rules and key patterns (compared whole)
    Case("rule added", REQ, model(stream=(bool, False), stream_options=(dict[str, bool] | None, None)),
         ruled(stream=(bool, False), stream_options=(dict[str, bool] | None, None)),
         ({}, {"stream": True, "stream_options": {}}, {"stream_options": {}}), True, "rule_added"),
    Case("rule removed", REQ, ruled(stream=(bool, False), stream_options=(dict[str, bool] | None, None)),
         model(stream=(bool, False), stream_options=(dict[str, bool] | None, None)),
         ({}, {"stream": True, "stream_options": {}}, {"stream_options": None}), False, "rule_removed"),
    Case("propertyNames added", REQ, model(bias=(dict[str, float], {})),
         model(bias=(dict[str, float], Field({}, json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}}))),
         ({}, {"bias": {"12": 1.0}}, {"bias": {"x": 1.0}}), True, "propertyNames_added"),
    # ---- responses: values
    Case("finish_reason value added", RESP, model(finish_reason=(Literal["stop", "length"], ...)),
         model(finish_reason=(Literal["stop", "length", "eos"], ...)),
         ({"finish_reason": "stop"}, {"finish_reason": "length"}, {"finish_reason": "eos"}),
         True, "enum_value_added"),
    Case("finish_reason value removed", RESP, model(finish_reason=(Literal["stop", "length"], ...)),
         model(finish_reason=(Literal["stop"], ...)),
         ({"finish_reason": "stop"},), False, "enum_value_removed"),
    Case("maximum raised", RESP, model(tokens=(int, Field(ge=0, le=100))),
         model(tokens=(int, Field(ge=0, le=1000))),
         ({"tokens": 0}, {"tokens": 1000}), True, "maximum_raised"),
    Case("maximum lowered", RESP, model(tokens=(int, Field(ge=0, le=100))),
         model(tokens=(int, Field(ge=0, le=50))),
         ({"tokens": 0}, {"tokens": 50}), False, "maximum_lowered"),
    Case("minimum raised", RESP, model(tokens=(int, Field(ge=0))), model(tokens=(int, Field(ge=1))),
         ({"tokens": 1}, {"tokens": 9}), False, "minimum_raised"),
    Case("minimum lowered", RESP, model(tokens=(int, Field(ge=0))), model(tokens=(int, Field(ge=-1))),
         ({"tokens": -1}, {"tokens": 0}), True, "minimum_lowered"),
    Case("maxLength raised", RESP, model(text=(str, Field(max_length=8))),
         model(text=(str, Field(max_length=16))),
         ({"text": ""}, {"text": "x" * 16}), True, "maxLength_raised"),
    Case("maxLength lowered", RESP, model(text=(str, Field(max_length=8))),
         model(text=(str, Field(max_length=4))),
         ({"text": ""}, {"text": "x" * 4}), False, "maxLength_lowered"),
    Case("integer widened to number", RESP, model(ms=(int, ...)), model(ms=(float, ...)),
         ({"ms": 3}, {"ms": 0.5}), True, "type_widened"),
    Case("number narrowed to integer", RESP, model(ms=(float, ...)), model(ms=(int, ...)),
         ({"ms": 3}, {"ms": -1}), False, "type_narrowed"),
    Case("nullable added", RESP, model(seed=(int, ...)), model(seed=(int | None, ...)),
         ({"seed": 1}, {"seed": None}), True, "nullable_added"),
    Case("nullable removed", RESP, model(seed=(int | None, ...)), model(seed=(int, ...)),
         ({"seed": 1},), False, "nullable_removed"),
    Case("union branch added", RESP, model(stop=(str, ...)), model(stop=(str | list[str], ...)),
         ({"stop": "a"}, {"stop": ["a"]}), True, "branch_added"),
    Case("union branch removed", RESP, model(stop=(str | list[str], ...)), model(stop=(str, ...)),
         ({"stop": "a"},), False, "branch_removed"),
    Case("pattern added", RESP, model(id=(str, ...)), model(id=(str, Field(pattern="^gen-[0-9]+$"))),
         ({"id": "gen-1"},), False, "pattern_added"),
    Case("map values widened", RESP, model(logprobs=(dict[str, int], ...)),
         model(logprobs=(dict[str, float], ...)),
         ({"logprobs": {}}, {"logprobs": {"a": 1, "b": -0.5}}), True, "type_widened"),
    Case("default changed", RESP, model(object=(str, "generation")), model(object=(str, "completion")),
         ({}, {"object": "x"}), True, "default_changed"),
    # ---- responses: properties and readers
    Case("new field, tolerant reader", RESP, model(id=(str, ...)), model(id=(str, ...), created=(int, ...)),
         ({"id": "a", "created": 1},), False, "property_added"),
    Case("new field, strict reader", RESP, model(id=(str, ...)), model(id=(str, ...), created=(int, ...)),
         ({"id": "a", "created": 1},), True, "property_added", reader="strict"),
    Case("new field, old schema closed", RESP, model(extra="forbid", id=(str, ...)),
         model(extra="forbid", id=(str, ...), created=(int, ...)), ({"id": "a", "created": 1},),
         True, "property_added"),
    Case("required field removed", RESP, model(id=(str, ...), text=(str, ...)), model(id=(str, ...)),
         ({"id": "a"},), True, "property_removed"),
    Case("optional field removed", RESP, model(id=(str, ...), seed=(int | None, None)), model(id=(str, ...)),
         ({"id": "a"},), False, "property_removed"),
    Case("required field made optional", RESP, model(text=(str, ...)), model(text=(str, "")),
         ({}, {"text": "x"}), True, "property_made_optional"),
    Case("optional field made required", RESP, model(text=(str, "")), model(text=(str, ...)),
         ({"text": "x"}, {"text": ""}), False, "property_made_required"),
    Case("unknown fields no longer sent", RESP, model(extra="allow", id=(str, ...)),
         model(extra="forbid", id=(str, ...)), ({"id": "a"},), False, "additional_properties_narrowed"),
    # ---- responses: nested
    Case("nested: choice finish_reason value added", RESP, model(choices=(list[choice_model()], ...)),
         model(choices=(list[choice_model(("stop", "length", "tool_calls"))], ...)),
         ({"choices": []}, {"choices": [{"index": 0, "finish_reason": "tool_calls"}]}),
         True, "enum_value_added"),
    Case("nested: choice field added, tolerant", RESP, model(choices=(list[choice_model()], ...)),
         model(choices=(list[choice_model(logprobs=(float | None, None))], ...)),
         ({"choices": [{"index": 0, "finish_reason": "stop", "logprobs": None}]},
          {"choices": [{"index": 1, "finish_reason": "length", "logprobs": -0.5}]}), False, "property_added"),
    Case("nested: choice field added, strict", RESP, model(choices=(list[choice_model()], ...)),
         model(choices=(list[choice_model(logprobs=(float | None, None))], ...)),
         ({"choices": [{"index": 0, "finish_reason": "stop", "logprobs": -0.5}]},), True, "property_added",
         reader="strict"),
    Case("nested: usage field made nullable", RESP,
         model(usage=(model("Usage", prompt_tokens=(int, ...)), ...)),
         model(usage=(model("Usage", prompt_tokens=(int | None, ...)), ...)),
         ({"usage": {"prompt_tokens": 3}}, {"usage": {"prompt_tokens": None}}), True, "nullable_added"),
    Case("nested: recursive tree gains a kind", RESP, TreeOld, TreeNew,
         ({"kind": "leaf"}, {"kind": "branch", "children": [{"kind": "root"}]}), True, "enum_value_added"),
]


def _closed(schema: Any) -> Any:
    """What a strict reader enforces: no object takes fields its schema does not name."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        is_object = out.get("type") == "object" or "properties" in out
        if is_object and not isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def _same(ref: Any, other: Any, *, all_keys: bool) -> bool:
    """Does `other` mean what `ref` means? Keys only `other` has are new fields and do not count."""
    if isinstance(ref, dict) and isinstance(other, dict):
        if all_keys and not set(ref) <= set(other):
            return False
        return all(_same(ref[k], other[k], all_keys=all_keys) for k in ref if k in other)
    if isinstance(ref, list) and isinstance(other, list):
        pairs = zip(ref, other, strict=True) if len(ref) == len(other) else None
        return pairs is not None and all(_same(a, b, all_keys=all_keys) for a, b in pairs)
    return bool(ref == other)


def _validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def behaviour_breaks(case: Case) -> list[str]:
    """What goes wrong on the wire; an empty list means every payload still works."""
    old_schema, new_schema = case.old.model_json_schema(), case.new.model_json_schema()
    request = case.direction == "request"
    source = _validator(old_schema if request else new_schema)
    reader_schema = _closed(old_schema) if case.reader == "strict" else old_schema
    target_schema = new_schema if request else reader_schema
    target = _validator(target_schema)
    problems: list[str] = []
    for payload in case.payloads:
        errors = [e.message for e in source.iter_errors(payload)]
        assert not errors, f"bad fixture: {payload} is not valid under the sending side's schema: {errors}"
        if not target.is_valid(payload):
            problems.append(f"{json.dumps(payload)} rejected by the {'new' if request else 'old'} schema")
            continue
        try:
            old_read = case.old.model_validate(payload).model_dump(mode="json")
            new_read = case.new.model_validate(payload).model_dump(mode="json")
        except ValidationError as exc:
            problems.append(f"{json.dumps(payload)} rejected by a model: {exc.errors()[0]['msg']}")
            continue
        if not _same(old_read, new_read, all_keys=request):
            problems.append(f"{json.dumps(payload)} read as {old_read} (old model), {new_read} (new)")
    return problems


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 25
    assert {c.direction for c in CASES} == {"request", "response"}
    assert any(c.name.startswith("nested") for c in CASES)
    assert len({(c.direction, c.name) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.direction}: {c.name}" for c in CASES])
def test_classification_matches_behaviour(case: Case) -> None:
    problems = behaviour_breaks(case)
    changes = diff_schemas(case.old.model_json_schema(), case.new.model_json_schema(), case.direction,
                           reader=case.reader)
    classified = any(c.breaking for c in changes)
    assert bool(problems) == case.breaking, f"the case's payloads do not show its verdict: {problems}"
    assert classified == bool(problems), f"classifier said {changes}, behaviour: {problems or 'fine'}"
    if case.kind is not None:
        assert case.kind in {c.kind for c in changes}, changes
    else:
        assert changes == [], changes


def test_nested_changes_name_the_path() -> None:
    case = next(c for c in CASES if c.name == "nested: choice finish_reason value added")
    changes = diff_schemas(case.old.model_json_schema(), case.new.model_json_schema(), "response")
    assert [(c.path, c.kind, c.breaking) for c in changes] == [
        ("$.choices[].finish_reason", "enum_value_added", True)
    ]


# ---- the CLI


def _write(tmp_path: Path, name: str, doc: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc, encoding="utf-8")
    return str(path)


def _openapi(finish_reasons: list[str], extra_paths: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": {
            "/v1/generate": {"post": {
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/GenerateRequest"}}}},
                "responses": {"200": {"description": "ok", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/GenerateResponse"}}}}},
            }},
            **(extra_paths or {}),
        },
        "components": {"schemas": {
            "GenerateRequest": {"type": "object", "properties": {"prompt": {"type": "string"}},
                                "required": ["prompt"]},
            "GenerateResponse": {"type": "object", "required": ["finish_reason"], "properties": {
                "finish_reason": {"enum": finish_reasons, "type": "string"}}},
        }},
    }


def test_cli_compatible_change_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _write(tmp_path, "old.json", _openapi(["stop", "length"]))
    new = _write(tmp_path, "new.json", _openapi(["stop"], {"/v1/models": {"get": {"responses": {}}}}))
    assert compat.main([old, new]) == 0
    out = capsys.readouterr().out
    assert "POST /v1/generate response 200 $.finish_reason" in out
    assert "GET /v1/models" in out and "BREAKING" not in out
    assert out.strip().splitlines()[-1] == "2 changes: 0 breaking, 2 compatible"


def test_cli_breaking_change_exits_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _write(tmp_path, "old.json", _openapi(["stop", "length"]))
    new = _write(tmp_path, "new.json", _openapi(["stop", "length", "tool_calls"]))
    assert compat.main([old, new]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["PATH", "KIND", "STATUS", "REASON"]
    row = next(line for line in lines if "$.finish_reason" in line)
    assert "enum_value_added" in row and "BREAKING" in row and '"tool_calls"' in row
    assert lines[0].index("STATUS") == row.index("BREAKING")  # the columns line up
    assert lines[-1] == "1 change: 1 breaking, 0 compatible"


def test_cli_bare_schemas_need_a_direction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _write(tmp_path, "old.json", model(n=(int, Field(1, le=10))).model_json_schema())
    new = _write(tmp_path, "new.json", model(n=(int, Field(1, le=20))).model_json_schema())
    assert compat.main([old, new]) == 2
    assert "--direction" in capsys.readouterr().err
    assert compat.main([old, new, "--direction", "request"]) == 0
    assert "$.n" in capsys.readouterr().out
    assert compat.main([old, new, "--direction", "response"]) == 1
    assert compat.main([old, old, "--direction", "response", "--reader", "strict"]) == 0
    assert "no changes" in capsys.readouterr().out


def test_cli_strict_reader_flags_new_fields(tmp_path: Path) -> None:
    old = _write(tmp_path, "old.json", model(id=(str, ...)).model_json_schema())
    new = _write(tmp_path, "new.json", model(id=(str, ...), created=(int, ...)).model_json_schema())
    assert compat.main([old, new, "--direction", "response"]) == 0
    assert compat.main([old, new, "--direction", "response", "--reader", "strict"]) == 1


@pytest.mark.parametrize(
    ("old_text", "new_text", "argv", "message"),
    [
        ('{"type": "object"}', "{not json", [], "invalid JSON"),
        ('{"type": "object"}', "[1, 2]", ["--direction", "request"], "expected a JSON object"),
        ('{"type": "object"}', None, ["--direction", "request"], "cannot read"),
        ('{"openapi": "3.1.0", "paths": {}}', '{"type": "object"}', [], "OpenAPI"),
        ('{"openapi": "3.1.0", "paths": {}}', '{"openapi": "3.1.0", "paths": {}}', ["--direction", "request"],
         "--direction"),
        ('{"$ref": "#/$defs/Missing"}', '{"type": "object"}', ["--direction", "request"], "unresolvable"),
        ("{}", "{}", ["--reader", "lax", "--direction", "request"], "invalid choice"),
    ],
)
def test_cli_usage_errors_exit_two_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old_text: str, new_text: str | None, argv: list[str],
    message: str,
) -> None:
    old = _write(tmp_path, "old.json", old_text)
    new = _write(tmp_path, "new.json", new_text) if new_text is not None else str(tmp_path / "absent.json")
    assert compat.main([old, new, *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert captured.out == ""


def test_cli_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert compat.main(["--help"]) == 0
    assert "--reader" in capsys.readouterr().out

