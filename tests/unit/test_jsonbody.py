"""Strict, safe JSON body parsing: every decision in api/jsonbody.py, and that refusals never echo."""

from __future__ import annotations

import time

import pytest

from sluicegate.api.jsonbody import MAX_DEPTH, nesting_depth_exceeds, parse_json, parse_model
from sluicegate.protocol.generate import GenerateRequest
from sluicegate.serving.errors import ApiError

SECRET = "s3cr3t-input"


def refused(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_json(raw)
    assert SECRET not in info.value.message and SECRET not in (info.value.param or "")
    return info.value


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "empty_body"),
        (b"  \n\t", "empty_body"),
        (b'{"a": NaN}', "invalid_number"),
        (b'{"a": Infinity}', "invalid_number"),
        (b'{"a": -Infinity}', "invalid_number"),
        (b'{"a": 1e400}', "number_out_of_range"),
        (b'{"a": -1e400}', "number_out_of_range"),
        (b'{"a": 1' + b"0" * 5000 + b"}", "number_out_of_range"),
        (b'{"a": 1, "a": 2}', "duplicate_key"),
        (b'{"a": "\xff\xfe"}', "invalid_encoding"),
        (b'\xef\xbb\xbf{"a": 1}', "invalid_encoding"),
        (b'{"a": "' + SECRET.encode() + b'"', "syntax_error"),
        (b'{"a": "x\x01y"}', "syntax_error"),  # a raw control character
        (b'{"a": 1} {}', "syntax_error"),
        (b'{"prompt": "\\ud800' + SECRET.encode() + b'"}', "invalid_unicode"),
        (b'{"\\udfff": 1}', "invalid_unicode"),
        (b'{"a": ["ok", "\\udc00"]}', "invalid_unicode"),
    ],
)
def test_refusals(raw: bytes, code: str) -> None:
    err = refused(raw)
    assert err.type == "invalid_json" and err.status == 400 and err.code == code


def test_the_surrogate_refusal_names_where() -> None:
    assert refused(b'{"prompt": "\\ud800"}').param == "prompt"
    assert refused(b'{"stop": ["a", "\\udbff"]}').param == "stop[1]"


def test_a_valid_surrogate_pair_and_an_escaped_backslash_are_fine() -> None:
    assert parse_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "😀"}
    assert parse_json(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # a backslash, then text


def test_nul_is_ordinary_text() -> None:
    assert parse_json(b'{"prompt": "a\\u0000b"}') == {"prompt": "a\x00b"}


def test_duplicate_key_names_only_a_plain_name() -> None:
    assert refused(b'{"max_new_tokens": 1, "max_new_tokens": 2}').param == "max_new_tokens"
    assert refused(b'{"<' + SECRET.encode() + b'>": 1, "<' + SECRET.encode() + b'>": 2}').param is None


def test_duplicates_are_found_in_nested_objects() -> None:
    assert refused(b'{"a": {"b": 1, "b": 1}}').code == "duplicate_key"


def test_depth_limit_is_exact_and_ignores_brackets_in_strings() -> None:
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert parse_json(ok) is not None
    too = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    assert refused(too).code == "too_deep"
    in_string = b'{"prompt": "' + b"[{" * 10_000 + b'"}'
    assert parse_json(in_string) == {"prompt": "[{" * 10_000}
    escaped_quote = b'{"p": "\\"' + b"[" * 100 + b'"}'
    assert not nesting_depth_exceeds(escaped_quote)


def test_deep_nesting_is_refused_fast_without_recursion() -> None:
    start = time.perf_counter()
    assert refused(b"[" * 100_000 + b"]" * 100_000).code == "too_deep"
    assert refused(b'{"a":' * 100_000 + b"1" + b"}" * 100_000).code == "too_deep"
    assert time.perf_counter() - start < 2.0  # a recursive parse would hit RecursionError or take far longer


def test_large_prompt_with_many_brackets_parses_in_linear_time() -> None:
    raw = b'{"prompt": "' + b"{[" * 50_000 + b"a" * 1_000_000 + b'"}'
    start = time.perf_counter()
    assert nesting_depth_exceeds(raw) is False
    assert len(parse_json(raw)["prompt"]) == 1_100_000
    assert time.perf_counter() - start < 2.0


def test_parse_model_refuses_non_objects_as_422() -> None:
    for raw, kind in (
        (b"[]", "an array"),
        (b'"x"', "a string"),
        (b"null", "null"),
        (b"3", "a number"),
        (b"true", "a boolean"),
    ):
        with pytest.raises(ApiError) as info:
            parse_model(raw, GenerateRequest)
        assert info.value.status == 422 and info.value.code == "wrong_type"
        assert info.value.message == f"the body must be a JSON object, not {kind}"


def test_parse_model_is_strict() -> None:
    assert parse_model(b'{"prompt": "x", "max_new_tokens": 2}', GenerateRequest).max_new_tokens == 2
    for value in (b'"5"', b"5.5", b"true", b"5.0", b"null"):
        with pytest.raises(ApiError) as info:
            parse_model(b'{"prompt": "x", "max_new_tokens": ' + value + b"}", GenerateRequest)
        assert info.value.param == "max_new_tokens" and info.value.status == 422
