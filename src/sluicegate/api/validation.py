"""Turn a pydantic ValidationError into one envelope error naming the parameter, never echoing the input."""

from __future__ import annotations

from pydantic import ValidationError

from sluicegate.serving.errors import ApiError

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
}


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    out = out or "body"
    return out if len(out) <= 64 else out[:61] + "..."


def validation_error(exc: ValidationError) -> ApiError:
    err = exc.errors(include_input=False, include_url=False)[0]
    kind = err["type"]
    param = _param(tuple(err["loc"]))
    code = _CODES.get(kind, "wrong_type" if kind.endswith("_type") or "parsing" in kind else kind)
    if kind == "extra_forbidden":
        message = f"unknown parameter {param!r}"
    elif kind == "missing":
        message = f"{param} is required"
    else:
        ctx = err.get("ctx") or {}
        message = f"{param}: {err['msg'].rstrip('.')}"
        if ctx:
            message += " (" + ", ".join(f"{k} {v}" for k, v in ctx.items() if k != "error") + ")"
    more = len(exc.errors()) - 1
    if more:
        message += f"; and {more} more problem{'s' if more > 1 else ''}"
    return ApiError("invalid_request", message, param=param, code=code)
