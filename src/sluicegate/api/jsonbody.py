"""Reading a JSON request body strictly and safely.

Decisions (docs/errors.md): NaN/Infinity literals are refused (they are not JSON); duplicate keys are refused
(which one wins is undefined across parsers, so a request that has them is ambiguous); nesting deeper than
`MAX_DEPTH` is refused before parsing; lone surrogate escapes parse, and are refused by the field that gets
them; NUL characters are ordinary text. Every refusal is a 400 that names the problem, never the input.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sluicegate.api.validation import validation_error
from sluicegate.serving.errors import ApiError

MAX_DEPTH = 64
M = TypeVar("M", bound=BaseModel)


def _no_constants(name: str) -> Any:
    raise ApiError("invalid_json", f"{name} is not valid JSON", code="invalid_number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ApiError("invalid_json", "the body has a duplicate object key", code="duplicate_key")
        out[key] = value
    return out


def _depth_ok(raw: bytes) -> bool:
    depth = 0
    in_string = escaped = False
    for b in raw:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:
                escaped = True
            elif b == 0x22:
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise ApiError("invalid_json", "the body is empty; a JSON object is required", code="empty_body")
    if (raw.count(b"[") + raw.count(b"{")) > MAX_DEPTH and not _depth_ok(raw):
        raise ApiError("invalid_json", f"the body nests deeper than {MAX_DEPTH} levels", code="too_deep")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError("invalid_json", f"the body is not UTF-8 (bad byte at offset {exc.start})",
                       code="invalid_encoding") from None
    try:
        return json.loads(text, parse_constant=_no_constants, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ApiError("invalid_json", f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                       code="syntax_error") from None
    except RecursionError:
        raise ApiError("invalid_json", f"the body nests deeper than {MAX_DEPTH} levels", code="too_deep") from None


def parse_model(raw: bytes, model: type[M]) -> M:
    data = parse_json(raw)
    if not isinstance(data, dict):
        raise ApiError("invalid_request", f"the body must be a JSON object, not {_json_kind(data)}",
                       code="wrong_type")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
