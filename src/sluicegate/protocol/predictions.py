"""`/v1/predictions`: a prediction request (input, model, native options, metadata) and the stored record.

The options are `/v1/generate`'s own (`GenerateOptions`), so a prediction is validated exactly as strictly.
`metadata` follows OpenAI's rule for it: at most 16 string pairs, keys up to 64 characters, values up to 512.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel, StrictModel
from sluicegate.protocol.generate import GenerateOptions
from sluicegate.protocol.rules import NOT_NULL, present, when

MetadataKey = Annotated[str, Field(min_length=1, max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class PredictionMessage(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1 << 20, description="the message's text (read by the model's chat template)")


class PredictionInput(StrictModel):
    """Exactly one of `prompt` (text to continue) or `messages` (a conversation, rendered by the model's
    chat template, answered as the assistant); the serving adapter refuses both or neither, naming `input`."""

    model_config = StrictModel.model_config | {"json_schema_extra": {
        "oneOf": [present("prompt", NOT_NULL), present("messages", NOT_NULL)],
    }}

    prompt: str | None = Field(None, min_length=1, description="text to continue")
    messages: list[PredictionMessage] | None = Field(None, min_length=1, max_length=1024)


class PredictionRequest(StrictModel):
    """`options.parse_special` applies to `input.prompt` only (a chat template decides the control tokens of
    messages): refused with `messages` (`invalid_combination`), as the schema's `allOf` states."""

    model_config = StrictModel.model_config | {"json_schema_extra": {"allOf": [
        when(present("input", present("messages", NOT_NULL)),
             {"properties": {"options": {"properties": {"parse_special": {"const": False}}}}}),
    ]}}

    input: PredictionInput
    model: str | None = Field(None, min_length=1, max_length=256, description="`name` or `name@version`; "
                              "absent: the served model's current version (docs/predictions.md)")
    options: GenerateOptions = Field(
        default_factory=lambda: GenerateOptions.model_validate({}),
        description="the native sampling options of /v1/generate, with its defaults",
    )
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=16,
                                                       description="yours, stored and returned as given")


class PredictionModel(ResponseModel):
    ref: str = Field(description="`name@version`: pin it to get this exact model again")
    name: str
    version: str
    digest: str = Field(description="sha256 of the weights file, as `sha256:<hex>`")


class PredictionResult(ResponseModel):
    text: str
    token_ids: list[int]
    finish_reason: Literal["length", "stop", "eos", "cancelled"]
    seed: int | None = Field(description="the seed the sampler used (drawn by the server when not given)")


class PredictionUsage(ResponseModel):
    input_tokens: int = Field(description="prompt tokens, counted by the engine")
    cached_tokens: int = Field(description="input tokens whose KV came from the prefix cache")
    output_tokens: int
    compute_ms: float = Field(description="prefill plus decode time (queueing excluded)")


class PredictionTiming(ResponseModel):
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    total_ms: float


class Prediction(ResponseModel):
    id: str = Field(description="`pred_` and 24 hex digits")
    object: Literal["prediction"] = "prediction"
    created_at: str = Field(description="RFC 3339, UTC")
    model: PredictionModel
    metadata: dict[str, str]
    result: PredictionResult
    usage: PredictionUsage
    warnings: list[str]
    timing: PredictionTiming


class PredictionList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[Prediction]
    has_more: bool
    first_id: str | None
    last_id: str | None = Field(description="pass it as `after` for the next page")


def input_schema() -> dict[str, Any]:
    """The JSON schema of `input` (for `GET /v1/models/{id}`)."""
    return PredictionInput.model_json_schema()


def options_schema() -> dict[str, Any]:
    return GenerateOptions.model_json_schema()
