"""Shared schema pieces: the strict base model, model identity, usage, timing, the error envelope (a request's
cross-field rules: protocol/rules.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Requests: strict JSON types ("5", 5.5 and true are not a token count) and unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


ModelName = Annotated[str, Field(min_length=1, max_length=256, description="`name` or `name@version`")]


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
