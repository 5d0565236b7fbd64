"""Reading JSON strictly and safely (a request body, a batch input line): the body must be I-JSON (RFC 7493).

Decisions (docs/errors.md has the table):
- NaN, Infinity and -Infinity literals are refused: they are not JSON.
- A number that does not fit a double (1e400) is refused, and so is an integer literal longer than
  `MAX_NUMBER_CHARS` (Python refuses to convert >4300 digits; we refuse long before, cheaply).
- Duplicate object keys are refused: which one wins differs between parsers, so the request is ambiguous.
- Nesting deeper than `MAX_DEPTH` is refused before parsing, by a scan that skips string contents.
- A lone UTF-16 surrogate escape (`"\\ud800"`) is refused: it is not Unicode text, no tokenizer can take it,
  and it cannot be encoded back to UTF-8 (a response echoing it would fail to serialise).
- NUL (`"\\u0000"`) is ordinary text: valid JSON, valid Unicode, tokenized like any other character.
  A raw (unescaped) control character inside a string is invalid JSON and refused.
- The body must be UTF-8 (no BOM); a JSON document must be one object for every route that takes one.

Every refusal is a 400 `invalid_json` (or 422 `invalid_request` for a well-formed body of the wrong shape)
that names the problem and at most a plain parameter name, never the input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from sluicegate.serving.errors import ApiError
from sluicegate.serving.validation import plain_name

MAX_DEPTH = 64
MAX_NUMBER_CHARS = 64

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)  # possessive: linear time on any input
_NOT_BRACKET = bytes(range(256)).translate(None, b"[]{}")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _invalid(message: str, code: str, param: str | None = None) -> ApiError:
    return ApiError("invalid_json", message, param=param, code=code)


def _no_constants(name: str) -> Any:
    raise _invalid(f"{name} is not a JSON number; send a finite number", "invalid_number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _invalid("a number in the body is outside the range of a double", "number_out_of_range")
    return value


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _invalid(f"a number in the body has more than {MAX_NUMBER_CHARS} digits", "number_out_of_range")
    return int(text)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _invalid("the body has a duplicate object key; send each key once", "duplicate_key",
                               param=plain_name(key))
            seen.add(key)
    return out


def nesting_depth_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when arrays/objects nest deeper than `limit` (brackets inside strings do not count)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    skeleton = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    depth = 0
    for b in skeleton:
        depth += 1 if b in (0x5B, 0x7B) else -1
        if depth > limit:
            return True
    return False


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield path, k
            yield from _strings(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def _check_surrogates(text: str, data: Any) -> None:
    if not _SURROGATE_ESCAPE.search(text):  # the only way a surrogate gets in: UTF-8 input cannot carry one
        return
    for path, s in _strings(data, ""):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise _invalid("a string in the body has an unpaired UTF-16 surrogate escape; send valid Unicode",
                           "invalid_unicode", param=plain_name(path) if path else None) from None


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse a request body (or a batch input line: `max_depth` one more, for the line's envelope around the
    request body); every refusal is an ApiError that never contains the input."""
    if not raw.strip():
        raise _invalid("the body is empty; a JSON object is required", "empty_body")
    if nesting_depth_exceeds(raw, max_depth):
        raise _invalid(f"the body nests deeper than {max_depth} levels", "too_deep")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"the body is not UTF-8 (invalid byte at offset {exc.start})",
                       "invalid_encoding") from None
    if text.startswith("\ufeff"):
        raise _invalid("the body starts with a byte order mark; send UTF-8 without one", "invalid_encoding")
    try:
        data = json.loads(text, parse_constant=_no_constants, parse_float=_float, parse_int=_int,
                          object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise _invalid(f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                       "syntax_error") from None
    except RecursionError:  # pragma: no cover - the depth scan refuses first
        raise _invalid(f"the body nests deeper than {max_depth} levels", "too_deep") from None
    _check_surrogates(text, data)
    return data


