"""Turn a pydantic ValidationError into one envelope error naming the parameter, never echoing the input.

Messages are written here from the error kind and the schema's own numbers (bounds, lengths), never from
pydantic's text (some of its messages quote the input). A parameter name is reported only when it is a
plain name (letters, digits, `_ . - [ ]`, at most 64 characters): an unknown key made of arbitrary text is
refused without repeating it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from sluicegate.serving.errors import ApiError

_PLAIN = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,64}$")

_CODES = {
    "extra_forbidden": "unknown_field",
    "missing": "missing_field",
    "greater_than": "out_of_range",
    "greater_than_equal": "out_of_range",
    "less_than": "out_of_range",
    "less_than_equal": "out_of_range",
    "too_long": "too_long",
    "too_short": "too_short",
    "string_too_long": "too_long",
    "string_too_short": "too_short",
    "finite_number": "not_finite",
    "string_unicode": "invalid_string",
    "literal_error": "not_allowed",
    "enum": "not_allowed",
}

_EXPECTED = {
    "int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "a boolean",
    "list_type": "an array", "tuple_type": "an array", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object", "none_required": "null", "int_from_float": "an integer",
    "float_parsing": "a number", "int_parsing": "an integer", "bool_parsing": "a boolean",
    "dataclass_type": "an object", "typed_dict_type": "an object",
}

_BOUNDS = {
    "greater_than": ("gt", "greater than"), "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"), "less_than_equal": ("le", "at most"),
}


def plain_name(name: str) -> str | None:
    """`name` when it is safe and short enough to repeat back, else None."""
    return name if _PLAIN.match(name) else None


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def _kind_of(value: Any) -> str:
    return {list: "an array", dict: "an object", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), "another type")


def _message(kind: str, name: str, ctx: dict[str, Any], given: Any) -> str:
    if kind == "missing":
        return f"{name} is required"
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"{name} must be {words} {ctx.get(key)}"
    if kind == "too_long":
        return f"{name} has {ctx.get('actual_length')} items; at most {ctx.get('max_length')} are accepted"
    if kind == "too_short":
        return f"{name} has {ctx.get('actual_length')} items; at least {ctx.get('min_length')} are required"
    if kind == "string_too_long":
        return f"{name} is longer than {ctx.get('max_length')} characters"
    if kind == "string_too_short":
        n = ctx.get("min_length")
        return f"{name} must have at least {n} character{'s' if n != 1 else ''}"
    if kind == "finite_number":
        return f"{name} must be a finite number"
    if kind == "string_unicode":
        return f"{name} must be valid Unicode text"
    if kind in ("literal_error", "enum"):
        return f"{name} must be one of {ctx.get('expected')}"
    if kind in _EXPECTED:
        return f"{name} must be {_EXPECTED[kind]}, not {_kind_of(given)}"
    return f"{name} is not acceptable ({kind})"


def refused(param: str, message: str, code: str = "invalid_combination") -> ApiError:
    """A 400 for a rule the schema cannot state: `param` is blamed, `code` names the rule (by default, parameters
    that cannot be combined)."""
    return ApiError("invalid_request", message, param=param, code=code)


def validation_error(exc: ValidationError) -> ApiError:
    return error_from_details(list(exc.errors(include_url=False)))


def error_from_details(details: Sequence[Mapping[str, Any]], *, strip: tuple[str, ...] = ()) -> ApiError:
    """One envelope error from pydantic's error list (FastAPI's too: pass `strip=("body", "query")`)."""
    if not details:
        return ApiError("invalid_request", "the request is not acceptable", code="invalid_value")
    # An unknown (often misspelt) parameter explains the other problems best: report it first.
    errors = sorted(details, key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    kind = err["type"]
    if kind == "json_invalid":
        return ApiError("invalid_json", "the body is not valid JSON", code="syntax_error")
    loc = tuple(p for i, p in enumerate(err.get("loc", ())) if not (i == 0 and p in strip))
    param = plain_name(_param(loc))
    code = _CODES.get(kind, "wrong_type" if kind.endswith("_type") or "parsing" in kind else "invalid_value")
    if kind == "extra_forbidden":
        message = (f"unknown parameter {param!r}; see the schema for the accepted ones" if param else
                   "the body has an unknown parameter (its name is not a plain name and is not repeated)")
    else:
        message = _message(kind, param or "a parameter", dict(err.get("ctx") or {}), err.get("input"))
    if len(errors) > 1:
        more = len(errors) - 1
        message += f"; and {more} more problem{'s' if more > 1 else ''}"
    return ApiError("invalid_request", message, param=param, code=code)
