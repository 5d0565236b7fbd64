"""Pieces both OpenAI-compatible surfaces share: field refusal, stop and logit-bias types, usage, logprobs.

Honesty rule: every field a request may carry is either accepted (and changes what the engine does) or
refused by name. `refusal` walks the raw JSON before the schema sees it, so a known OpenAI parameter we do not
implement gets its own message ("not supported here"), and an unknown one is called unknown; both list what
the object does take. The schema (`extra="forbid"`) stays as the safety net.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel, StrictModel

MAX_SEED = 2**63 - 1
_PLAIN = re.compile(r"^[A-Za-z0-9_.\[\]-]{1,64}$")
MAX_N = 8  # choices per request (n); documented in docs/openai.md

StopField = Annotated[str, Field(min_length=1, max_length=64)]
Stop = StopField | Annotated[list[StopField], Field(max_length=4)]
# Keys are token ids written as decimal strings (serving/openai_common.py checks them against the vocabulary).
LogitBias = Annotated[
    dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]],
    Field(max_length=1024, json_schema_extra={"propertyNames": {"pattern": "^[0-9]{1,9}$"}}),
]


@dataclass(frozen=True, slots=True)
class FieldRefusal:
    """A field the server will not take: `code` is `invalid_request`'s code for it (`unsupported_parameter`,
    `unknown_field`, `unsupported_value`, ...: src/sluicegate/errorcatalog/invalid_request.py).

    Not a `sluicegate.refusal.Rejected`: a finding the raw-JSON check returns (its type always `invalid_request`),
    which the route raises as its error only after the check (api/batch_items.py `parse_openai`)."""

    param: str | None
    code: str
    message: str


def plain(name: str) -> str | None:
    """`name` when it is safe to repeat back (letters, digits, `_ . - [ ]`, at most 64), else None."""
    return name if _PLAIN.match(name) else None


def refusal(
    obj: Mapping[str, Any],
    where: str,
    supported: Sequence[str],
    unsupported: Mapping[str, str] | None = None,
) -> FieldRefusal | None:
    """The first field of `obj` that is not in `supported`, as a refusal naming it; None when all are fine.

    `unsupported` maps known-but-unimplemented names to the reason; `where` prefixes the param path. A key
    that is not a plain name is refused without being repeated.
    """
    for key in obj:
        if key in supported:
            continue
        param = plain(f"{where}.{key}" if where else key)
        takes = ", ".join(supported)
        if unsupported and key in unsupported:
            return FieldRefusal(
                param,
                "unsupported_parameter",
                f"{param} is not supported by this server ({unsupported[key]}); supported: {takes}",
            )
        if param is None:
            place = f" in {where}" if where else ""
            return FieldRefusal(
                None,
                "unknown_field",
                f"an unknown parameter{place} (its name is not repeated); supported: {takes}",
            )
        return FieldRefusal(param, "unknown_field", f"unknown parameter {param!r}; supported: {takes}")
    return None


def each_refusal(
    items: Any, where: str, check: Callable[[Mapping[str, Any], str], FieldRefusal | None]
) -> FieldRefusal | None:
    """The first refusal `check` gives for an object in the list `items`, each named `where[i]`; None when all
    are fine. What is not a list, or not an object in it, is left to the schema."""
    if not isinstance(items, list):
        return None
    for i, item in enumerate(items):
        if isinstance(item, dict) and (r := check(item, f"{where}[{i}]")) is not None:
            return r
    return None


_STREAM_UNSUPPORTED = {"include_obfuscation": "no obfuscation padding is sent"}


def stream_options_refusal(body: Mapping[str, Any]) -> FieldRefusal | None:
    """A field of `stream_options` that chat and completions do not take."""
    opts = body.get("stream_options")
    return refusal(opts, "stream_options", ("include_usage",), _STREAM_UNSUPPORTED) if isinstance(opts, dict) else None


def clean_loc(loc: Sequence[int | str], data: Any, *, missing: bool = False) -> tuple[int | str, ...]:
    """An error location as a path into the client's JSON: pydantic's union-member and tag entries (`str`,
    `list[TextPart]`, a role) are dropped by walking `data` and keeping only the keys and indices it has."""
    out: list[int | str] = []
    node = data
    for k, part in enumerate(loc):
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        if in_dict or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            node = node[part]
            out.append(part)
        elif missing and k == len(loc) - 1:
            out.append(part)
    return tuple(out)


class StreamOptions(StrictModel):
    include_usage: bool = Field(
        False, description="send one more chunk at the end, with usage and no choices"
    )


# -- responses ---------------------------------------------------------------------------------------------


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = Field(description="prompt tokens whose KV was reused from the prefix cache")


class OpenAIUsage(ResponseModel):
    """Counted from the token ids the engine processed; with n > 1 or several prompts, runs are summed."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


FinishReason = Literal["stop", "length", "tool_calls"]
