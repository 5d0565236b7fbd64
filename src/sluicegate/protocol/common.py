"""Shared schema pieces: the strict base model, model identity, usage, timing, the error envelope."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict


class StrictModel(BaseModel):
    """Requests: strict JSON types ("5", 5.5 and true are not a token count) and unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


WHOLE_NUMBER_RULE = (
    "Integer fields take JSON integers only: a number with a fraction part written, such as `8.0`, is refused "
    "(`wrong_type`) although JSON Schema counts it as an integer. Numbers are I-JSON anywhere in the body, "
    "free-form objects included: an integer of more than 64 digits is refused (`number_out_of_range`). This "
    "schema cannot say either (docs/errors.md)."
)
"""Part of every request schema's description: the number rules JSON Schema has no keyword for."""


def present(name: str, schema: JsonDict) -> JsonDict:
    """A JSON Schema condition: `name` is in the object and matches `schema`."""
    return {"required": [name], "properties": {name: schema}}


def when(condition: JsonDict, then: JsonDict) -> JsonDict:
    """A cross-field rule of a request schema (JSON Schema 2020-12 `if`/`then`), for its `allOf`."""
    return {"if": condition, "then": then}


NOT_NULL: JsonDict = {"not": {"type": "null"}}
NULL_OR_EMPTY: JsonDict = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}


class ResponseModel(BaseModel):
    model_config = ConfigDict(frozen=True)


class ModelInfo(ResponseModel):
    name: str
    version: str
    digest: str = Field(description="sha256 of the weights file, as `sha256:<hex>`; `unknown` for a model served "
                        "by an upstream engine whose operator gave none")


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = Field(description="prompt tokens whose KV was reused from the prefix cache")


class Usage(ResponseModel):
    """Counted from the token ids the engine processed, never by re-tokenising text."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class StageTiming(ResponseModel):
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    total_ms: float


class ErrorBody(ResponseModel):
    type: str = Field(description="stable; see docs/errors.md")
    code: str | None = None
    message: str
    param: str | None = None
    request_id: str
    docs_url: str = Field(description="the error catalog's entry for this type and code (docs/errors.md, "
                          "\"Every code\"); its base is the server's --error-docs-url")


class ErrorEnvelope(ResponseModel):
    error: ErrorBody


StopList = Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=4)]
