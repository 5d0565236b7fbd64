"""Rules of the schema classifier, one raw-schema change at a time."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sluicegate.contract.diff_schemas import Change, SchemaError, diff_openapi, diff_schemas

Schema = dict[str, Any]


def obj(required: tuple[str, ...] = (), additional: Any = None, **props: Schema) -> Schema:
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if additional is not None:
        out["additionalProperties"] = additional
    return out


Verdict = tuple[str, str, bool]


def verdicts(old: Schema, new: Schema, direction: Any, reader: Any = "tolerant") -> list[Verdict]:
    return [(c.path, c.kind, c.breaking) for c in diff_schemas(old, new, direction, reader=reader)]


INT = {"type": "integer"}
STR = {"type": "string"}


# ---- limits: a request may only relax them, a response may only tighten them


@pytest.mark.parametrize(
    ("old", "new", "kind", "request_breaks"),
    [
        ({"maximum": 10}, {"maximum": 20}, "maximum_raised", False),
        ({"maximum": 10}, {"maximum": 5}, "maximum_lowered", True),
        ({"exclusiveMaximum": 10}, {"exclusiveMaximum": 11}, "maximum_raised", False),
        ({"minimum": 0}, {"minimum": -1}, "minimum_lowered", False),
        ({"minimum": 0}, {"minimum": 1}, "minimum_raised", True),
        ({"exclusiveMinimum": 0}, {"minimum": 0}, "minimum_lowered", False),
        ({}, {"maximum": 3}, "maximum_added", True),
        ({"maximum": 3}, {}, "maximum_removed", False),
        ({"maxLength": 4}, {"maxLength": 8}, "maxLength_raised", False),
        ({"maxLength": 4}, {"maxLength": 2}, "maxLength_lowered", True),
        ({"minLength": 1}, {"minLength": 0}, "minLength_lowered", False),
        ({"maxItems": 4}, {"maxItems": 3}, "maxItems_lowered", True),
        ({"minItems": 1}, {"minItems": 2}, "minItems_raised", True),
        ({"maxProperties": 1}, {"maxProperties": 2}, "maxProperties_raised", False),
        ({"multipleOf": 2}, {"multipleOf": 1}, "multipleOf_changed", False),
        ({"multipleOf": 0.1}, {"multipleOf": 0.2}, "multipleOf_changed", True),
    ],
)
def test_limits(old: Schema, new: Schema, kind: str, request_breaks: bool) -> None:
    old, new = {"type": "number", **old}, {"type": "number", **new}
    assert verdicts(old, new, "request") == [("$", kind, request_breaks)]
    assert verdicts(old, new, "response") == [("$", kind, not request_breaks)]


def test_equivalent_bounds_are_no_change() -> None:
    below_11, up_to_10 = {"type": "integer", "exclusiveMaximum": 11}, {"type": "integer", "maximum": 10}
    assert verdicts(below_11, up_to_10, "response") == []
    above_minus_1, from_0 = {"type": "integer", "exclusiveMinimum": -1}, {"type": "integer", "minimum": 0}
    assert verdicts(above_minus_1, from_0, "request") == []
    # OpenAPI 3.0 spells exclusivity as a boolean next to maximum
    assert verdicts({"type": "number", "maximum": 5, "exclusiveMaximum": True},
                    {"type": "number", "exclusiveMaximum": 5}, "request") == []
    assert verdicts({"type": "number", "maximum": 5, "exclusiveMaximum": True},
                    {"type": "number", "maximum": 5}, "request") == [("$", "maximum_raised", False)]


def test_exclusive_to_inclusive_at_the_same_value_is_a_widening() -> None:
    old, new = {"type": "number", "exclusiveMaximum": 2}, {"type": "number", "maximum": 2}
    assert verdicts(old, new, "request") == [("$", "maximum_raised", False)]
    assert verdicts(new, old, "request") == [("$", "maximum_lowered", True)]
    assert verdicts(new, old, "response") == [("$", "maximum_lowered", False)]


# ---- properties


def test_request_property_rules() -> None:
    old = obj(("a",), a=STR, b=STR)
    assert verdicts(old, obj(("a",), a=STR, b=STR, c=STR), "request") == [("$.c", "property_added", False)]
    assert verdicts(old, obj(("a", "c"), a=STR, b=STR, c=STR), "request") == [
        ("$.c", "required_property_added", True)
    ]
    both = obj(("a", "b"), a=STR, b=STR)
    assert verdicts(old, both, "request") == [("$.b", "property_made_required", True)]
    assert verdicts(old, obj((), a=STR, b=STR), "request") == [("$.a", "property_made_optional", False)]
    assert verdicts(old, obj(("a",), a=STR), "request") == [("$.b", "property_removed", True)]
    closed = verdicts(obj((), False, a=STR, b=STR), obj((), False, a=STR), "request")
    assert closed == [("$.b", "property_removed", True)]


def test_response_property_rules() -> None:
    old = obj(("a",), a=STR, b=STR)
    added = obj(("a", "c"), a=STR, b=STR, c=STR)
    assert verdicts(old, added, "response") == [("$.c", "property_added", False)]
    assert verdicts(old, added, "response", "strict") == [("$.c", "property_added", True)]
    assert verdicts(obj(("a",), False, a=STR), obj(("a",), False, a=STR, c=STR), "response") == [
        ("$.c", "property_added", True)  # the old contract itself promised no other fields
    ]
    assert verdicts(old, obj((), a=STR, b=STR), "response") == [("$.a", "property_made_optional", True)]
    both = obj(("a", "b"), a=STR, b=STR)
    assert verdicts(old, both, "response") == [("$.b", "property_made_required", False)]
    assert verdicts(old, obj((), b=STR), "response") == [("$.a", "property_removed", True)]
    assert verdicts(old, obj(("a",), a=STR), "response") == [("$.b", "property_removed", False)]


def test_required_names_without_a_property_schema_count() -> None:
    assert verdicts({"type": "object", "required": ["x"]}, {"type": "object"}, "response") == [
        ("$.x", "property_removed", True)
    ]


@pytest.mark.parametrize(
    ("old", "new", "kind", "request_breaks", "response_breaks"),
    [
        (True, False, "additional_properties_narrowed", True, False),
        (False, True, "additional_properties_widened", False, True),
        (None, {"type": "integer"}, "additional_properties_narrowed", True, False),
        ({"type": "integer"}, True, "additional_properties_widened", False, True),
        (False, {}, "additional_properties_widened", False, True),  # {} is `true`
    ],
)
def test_additional_properties(
    old: Any, new: Any, kind: str, request_breaks: bool, response_breaks: bool
) -> None:
    assert verdicts(obj((), old, a=STR), obj((), new, a=STR), "request") == [("$", kind, request_breaks)]
    assert verdicts(obj((), old, a=STR), obj((), new, a=STR), "response") == [("$", kind, response_breaks)]


def test_map_values_are_compared_as_schemas() -> None:
    old, new = obj((), {"type": "integer"}), obj((), {"type": "integer", "maximum": 3})
    assert verdicts(old, new, "request") == [("$.*", "maximum_added", True)]


# ---- defaults


def test_defaults() -> None:
    def with_default(value: Any) -> Schema:
        return obj((), a={"type": "integer", "default": value})

    assert verdicts(with_default(1), with_default(2), "request") == [("$.a", "default_changed", True)]
    assert verdicts(with_default(1), with_default(1.0), "request") == []  # same JSON number
    assert verdicts(with_default(1), obj((), a=INT), "request") == [("$.a", "default_removed", True)]
    assert verdicts(obj((), a=INT), with_default(1), "request") == [("$.a", "default_added", False)]
    assert verdicts(with_default(1), with_default(2), "response") == [("$.a", "default_changed", True)]


def test_defaults_of_fields_always_sent_do_not_matter() -> None:
    old = obj(("a",), a={"type": "integer", "default": 1})
    new = obj(("a",), a={"type": "integer", "default": 2})
    assert verdicts(old, new, "request") == []
    assert verdicts(old, new, "response") == []
    # a response field that becomes required: the server always sends it, the old default never applies
    assert verdicts(obj((), a={"type": "integer", "default": 1}), obj(("a",), a=INT), "response") == [
        ("$.a", "property_made_required", False)
    ]


def test_a_default_next_to_a_ref_is_the_fields_own() -> None:
    defs = {"$defs": {"Mode": {"enum": ["a", "b"], "type": "string"}}}
    old = {**defs, **obj((), mode={"$ref": "#/$defs/Mode", "default": "a"})}
    new = {**defs, **obj((), mode={"$ref": "#/$defs/Mode", "default": "b"})}
    assert verdicts(old, new, "request") == [("$.mode", "default_changed", True)]


# ---- enums, types, patterns


def test_enums() -> None:
    old = {"type": "string", "enum": ["a", "b"]}
    more = {"type": "string", "enum": ["a", "b", "c"]}
    assert verdicts(old, more, "request") == [("$", "enum_value_added", False)]
    assert verdicts(old, more, "response") == [("$", "enum_value_added", True)]
    assert verdicts(old, {"type": "string", "enum": ["a"]}, "request") == [("$", "enum_value_removed", True)]
    assert verdicts(old, {"enum": ["a"]}, "response") == [("$", "enum_value_removed", False)]
    assert verdicts(old, {"type": "string", "enum": ["b", "a"]}, "request") == []
    assert verdicts({"const": "a"}, {"enum": ["a"]}, "request") == []
    assert verdicts(STR, old, "request") == [("$", "enum_added", True)]
    assert verdicts(old, STR, "response") == [("$", "enum_removed", True)]


@pytest.mark.parametrize(
    ("old", "new", "kind", "request_breaks"),
    [
        ({"type": "number"}, INT, "type_narrowed", True),
        (INT, {"type": "number"}, "type_widened", False),
        ({}, STR, "type_narrowed", True),
        (STR, {}, "type_widened", False),
        (STR, INT, "type_changed", True),
    ],
)
def test_types(old: Schema, new: Schema, kind: str, request_breaks: bool) -> None:
    assert verdicts(old, new, "request") == [("$", kind, request_breaks)]
    expected_response = kind == "type_changed" or not request_breaks
    assert verdicts(old, new, "response") == [("$", kind, expected_response)]


def test_a_type_changed_anyof_branch_is_one_change_not_two() -> None:
    old = {"anyOf": [STR, {"type": "number"}]}
    new = {"anyOf": [STR, INT]}
    assert verdicts(old, new, "request") == [("$<integer>", "type_narrowed", True)]


def test_type_lists_and_anyof_are_the_same_union() -> None:
    assert verdicts({"type": ["string", "integer"]}, {"anyOf": [INT, STR]}, "request") == []
    assert verdicts({"type": ["string", "integer"]}, {"type": "string"}, "request") == [
        ("$", "branch_removed", True)
    ]
    assert verdicts({"type": "string"}, {"oneOf": [STR, {"type": "array", "items": STR}]}, "response") == [
        ("$", "branch_added", True)
    ]


@pytest.mark.parametrize("kw", ["pattern", "format"])
def test_pattern_and_format(kw: str) -> None:
    plain, a, b = {"type": "string"}, {"type": "string", kw: "x"}, {"type": "string", kw: "y"}
    assert verdicts(plain, a, "request") == [("$", f"{kw}_added", True)]
    assert verdicts(a, plain, "request") == [("$", f"{kw}_removed", False)]
    assert verdicts(a, b, "request") == [("$", f"{kw}_changed", True)]
    assert verdicts(plain, a, "response") == [("$", f"{kw}_added", False)]
    assert verdicts(a, plain, "response") == [("$", f"{kw}_removed", True)]
    assert verdicts(a, b, "response") == [("$", f"{kw}_changed", True)]


# ---- nullable, in every spelling


NULLABLE_INT = [
    {"anyOf": [INT, {"type": "null"}]},
    {"type": ["integer", "null"]},
    {"type": "integer", "nullable": True},  # OpenAPI 3.0
    {"oneOf": [{"type": "null"}, INT]},
]


@pytest.mark.parametrize("nullable", NULLABLE_INT)
def test_nullable_added(nullable: Schema) -> None:
    assert verdicts(INT, nullable, "request") == [("$", "nullable_added", False)]
    assert verdicts(INT, nullable, "response") == [("$", "nullable_added", True)]
    assert verdicts(nullable, INT, "request") == [("$", "nullable_removed", True)]
    assert verdicts(nullable, INT, "response") == [("$", "nullable_removed", False)]


@pytest.mark.parametrize("a", NULLABLE_INT)
@pytest.mark.parametrize("b", NULLABLE_INT)
def test_nullable_spellings_are_equivalent(a: Schema, b: Schema) -> None:
    assert verdicts(a, b, "request") == []


def test_nullable_enum_with_a_null_member() -> None:
    old = {"enum": ["a", None]}
    assert verdicts(old, {"enum": ["a"]}, "response") == [("$", "nullable_removed", False)]
    assert verdicts(old, {"anyOf": [{"enum": ["a"], "type": "string"}, {"type": "null"}]}, "request") == []


# ---- nesting, references, unions


def test_nested_arrays_and_objects_report_the_path() -> None:
    def doc(roles: list[str]) -> Schema:
        message = obj(("role",), role={"enum": roles, "type": "string"})
        return obj(messages={"type": "array", "items": message})

    old, new = doc(["user"]), doc(["user", "tool"])
    assert verdicts(old, new, "response") == [("$.messages[].role", "enum_value_added", True)]


def test_odd_property_names_are_quoted_in_paths() -> None:
    assert verdicts(obj(**{"x-y": INT}), obj(**{"x-y": STR}), "request") == [
        ('$["x-y"]', "type_changed", True)
    ]


@pytest.mark.parametrize("where", ["$defs", "definitions"])
def test_refs_resolve_against_the_documents_own_definitions(where: str) -> None:
    old = {where: {"Item": obj(("n",), n={"type": "integer", "maximum": 5})},
           **obj(item={"$ref": f"#/{where}/Item"})}
    new = {where: {"Thing": obj(("n",), n={"type": "integer", "maximum": 9})},
           **obj(item={"$ref": f"#/{where}/Thing"})}
    assert verdicts(old, new, "response") == [("$.item.n", "maximum_raised", True)]


def test_allof_wrapped_ref_equals_the_plain_ref() -> None:
    defs = {"$defs": {"A": obj(x=INT)}}
    old = {**defs, **obj(a={"$ref": "#/$defs/A"})}
    new = {**defs, **obj(a={"allOf": [{"$ref": "#/$defs/A"}], "description": "same thing"})}
    assert verdicts(old, new, "request") == []


def test_recursive_schemas_terminate_and_report_once() -> None:
    def tree(kinds: list[str]) -> Schema:
        node = obj(("kind",), kind={"enum": kinds, "type": "string"},
                   children={"type": "array", "items": {"$ref": "#/$defs/Node"}})
        return {"$defs": {"Node": node}, "$ref": "#/$defs/Node"}

    assert verdicts(tree(["a"]), tree(["a", "b"]), "response") == [("$.kind", "enum_value_added", True)]
    assert verdicts(tree(["a"]), tree(["a"]), "response") == []


def test_mutually_recursive_schemas_terminate() -> None:
    def doc(limit: int) -> Schema:
        return {"$defs": {"A": obj(b={"$ref": "#/$defs/B"}),
                          "B": obj(a={"$ref": "#/$defs/A"}, n={"type": "integer", "maximum": limit})},
                "$ref": "#/$defs/A"}

    assert verdicts(doc(1), doc(2), "request") == [("$.b.n", "maximum_raised", False)]


def test_discriminated_branches_pair_by_tag_even_when_renamed() -> None:
    def variant(tag: str, **props: Schema) -> Schema:
        return obj(("type",), type={"const": tag, "type": "string"}, **props)

    def union(defs: dict[str, Schema]) -> Schema:
        return {"$defs": defs, **obj(part={"oneOf": [{"$ref": f"#/$defs/{n}"} for n in defs],
                                           "discriminator": {"propertyName": "type"}})}

    old = union({"Text": variant("text", text={"type": "string", "maxLength": 5}), "Image": variant("image")})
    new = union({"TextPart": variant("text", text={"type": "string", "maxLength": 9}),
                 "Audio": variant("audio")})
    assert verdicts(old, new, "request") == [
        ("$.part", "branch_removed", True),
        ("$.part", "branch_added", False),
        ('$.part<type="text">.text', "maxLength_raised", False),
    ]


def test_union_of_refs_pairs_by_name() -> None:
    defs = {"A": obj(("a",), a=INT), "B": obj(("b",), b=INT), "C": obj(("c",), c=INT)}
    old = {"$defs": defs, "anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    new = {"$defs": defs, "anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}, {"$ref": "#/$defs/C"}]}
    assert verdicts(old, new, "request") == [("$", "branch_added", False)]
    assert verdicts(new, old, "request") == [("$", "branch_removed", True)]


def test_items_constraints() -> None:
    arr = {"type": "array", "items": STR}
    assert verdicts(arr, {"type": "array"}, "request") == [("$[]", "type_widened", False)]
    assert verdicts(arr, {**arr, "uniqueItems": True}, "request") == [("$", "uniqueItems_added", True)]
    assert verdicts({"type": "array", "items": False}, arr, "request") == [("$[]", "branch_added", False)]
    assert verdicts(arr, {"type": "array", "items": False}, "response") == [("$[]", "branch_removed", False)]


def test_unchanged_and_annotation_only_changes_are_silent() -> None:
    old = obj(("a",), a={"type": "string", "title": "A", "description": "one"})
    new = obj(("a",), a={"type": "string", "title": "Renamed", "description": "two", "examples": ["x"]})
    assert verdicts(old, new, "request") == []
    assert verdicts(old, new, "response", "strict") == []


def test_bad_input_is_reported() -> None:
    with pytest.raises(SchemaError, match="unresolvable"):
        diff_schemas({"$ref": "#/$defs/Nope"}, {}, "request")
    with pytest.raises(SchemaError, match="local"):
        diff_schemas({"$ref": "https://example.com/s.json"}, {}, "request")
    with pytest.raises(SchemaError, match="loop"):
        diff_schemas({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, {}, "request")
    with pytest.raises(ValueError, match="direction"):
        diff_schemas({}, {}, "sideways")  # type: ignore[arg-type]


def test_changes_are_frozen() -> None:
    change = Change("$.a", "enum_value_added", True, "why")
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.breaking = False  # type: ignore[misc]


# ---- whole OpenAPI documents


def _doc(paths: dict[str, Any], schemas: dict[str, Schema] | None = None) -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": paths,
            "components": {"schemas": schemas or {}}}


def _json(schema: Schema) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _op(body: Schema | None = None, responses: dict[str, Schema | None] | None = None,
        **extra: Any) -> dict[str, Any]:
    statuses = responses or {"200": STR}
    op: dict[str, Any] = {
        "responses": {s: {"description": s, **(_json(r) if r else {})} for s, r in statuses.items()},
        **extra,
    }
    if body is not None:
        op["requestBody"] = {"required": True, **_json(body)}
    return op


def openapi_verdicts(old: dict[str, Any], new: dict[str, Any], reader: Any = "tolerant") -> list[Verdict]:
    return [(c.path, c.kind, c.breaking) for c in diff_openapi(old, new, reader=reader)]


def test_openapi_operations_added_and_removed() -> None:
    old = _doc({"/v1/a": {"get": _op()}, "/v1/b": {"get": _op()}})
    new = _doc({"/v1/a": {"get": _op()}, "/v1/c": {"post": _op()}})
    assert openapi_verdicts(old, new) == [("GET /v1/b", "operation_removed", True),
                                          ("POST /v1/c", "operation_added", False)]


def test_openapi_bodies_are_compared_per_direction_through_component_refs() -> None:
    def doc(reasons: list[str], limit: int) -> dict[str, Any]:
        schemas = {"Req": obj(("n",), n={"type": "integer", "maximum": limit}),
                   "Resp": obj(("finish_reason",), finish_reason={"type": "string", "enum": reasons})}
        op = _op({"$ref": "#/components/schemas/Req"}, {"200": {"$ref": "#/components/schemas/Resp"}})
        return _doc({"/v1/generate": {"post": op}}, schemas)

    assert openapi_verdicts(doc(["stop"], 10), doc(["stop", "eos"], 20)) == [
        ("POST /v1/generate request $.n", "maximum_raised", False),
        ("POST /v1/generate response 200 $.finish_reason", "enum_value_added", True),
    ]
    assert openapi_verdicts(doc(["stop", "eos"], 20), doc(["stop"], 10)) == [
        ("POST /v1/generate request $.n", "maximum_lowered", True),
        ("POST /v1/generate response 200 $.finish_reason", "enum_value_removed", False),
    ]


def test_openapi_response_statuses() -> None:
    old = _doc({"/v1/x": {"get": _op(responses={"200": STR, "404": obj(error=STR)})}})
    new = _doc({"/v1/x": {"get": _op(responses={"200": STR, "503": obj(error=STR)})}})
    assert openapi_verdicts(old, new) == [("GET /v1/x response 404", "response_removed", False),
                                          ("GET /v1/x response 503", "response_added", False)]
    assert ("GET /v1/x response 503", "response_added", True) in openapi_verdicts(old, new, "strict")
    moved = _doc({"/v1/x": {"get": _op(responses={"201": STR, "404": obj(error=STR)})}})
    assert ("GET /v1/x response 200", "response_removed", True) in openapi_verdicts(old, moved)


def test_openapi_request_body_and_parameters() -> None:
    plain = _doc({"/v1/items/{id}": {"post": _op(STR)}})
    param = {"name": "verbose", "in": "query", "schema": {"type": "boolean"}}
    with_param = _doc({"/v1/items/{item_id}": {"post": _op(STR, parameters=[param])}})
    assert openapi_verdicts(plain, with_param) == [
        ("POST /v1/items/{item_id} parameter query.verbose", "parameter_added", False)
    ]
    required = _doc({"/v1/items/{id}": {"post": _op(STR, parameters=[{**param, "required": True}])}})
    assert openapi_verdicts(plain, required)[0][1:] == ("parameter_added", True)
    no_body = _doc({"/v1/items/{id}": {"post": _op()}})
    assert openapi_verdicts(plain, no_body) == [("POST /v1/items/{id} request", "request_body_removed", True)]
    assert openapi_verdicts(no_body, plain) == [("POST /v1/items/{id} request", "request_body_added", True)]


def test_openapi_identical_documents_have_no_changes() -> None:
    doc = _doc({"/v1/a": {"get": _op(responses={"200": obj(("a",), a={"anyOf": [INT, {"type": "null"}]})})}})
    assert diff_openapi(doc, doc) == []
