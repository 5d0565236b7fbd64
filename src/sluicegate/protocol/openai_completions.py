"""`POST /v1/completions`: OpenAI's legacy text completions, the subset this server implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.config import JsonValue

from sluicegate.protocol.common import ModelName, ResponseModel, StrictModel
from sluicegate.protocol.openai_chat import ResponseFormat
from sluicegate.protocol.openai_common import (
    MAX_N,
    MAX_SEED,
    FieldRefusal,
    LogitBias,
    OpenAIUsage,
    Stop,
    StreamOptions,
    refusal,
    stream_options_refusal,
)
from sluicegate.protocol.rules import NULL_OR_EMPTY, present, request_schema, when

MAX_PROMPTS = 16  # prompts in one request, times n: at most this many choices

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=1 << 17)]
Prompt = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
)


# Combinations the server refuses (serving/openai_completions.py), stated where JSON Schema can state them.
COMPLETION_RULES: list[JsonValue] = [
    when(present("stream_options", {"type": "object"}), present("stream", {"const": True})),
    when(present("echo", {"const": True}), {"properties": {"logprobs": {"type": "null"}, "suffix": {"type": "null"}}}),
    when(present("response_format", {"type": "object", "properties": {
        "type": {"enum": ["json_object", "json_schema"]}}}), {"properties": {"stop": NULL_OR_EMPTY}}),
]
COMPLETION_DESCRIPTION = (
    "Refused combinations this schema states (`allOf`): `stream_options` without `stream: true`; `echo` with "
    "`logprobs` or `suffix`; `stop` with JSON output (`response_format`). Refused rules it cannot state (400, "
    "`code` names the rule): more than 16 prompts times `n` (`too_many_choices`); `suffix` on a model without "
    "fill-in-the-middle tokens (`unsupported_parameter`); token ids or `logit_bias` ids outside the model's vocabulary "
    "(`invalid_token_id`); prompt plus `max_tokens` over the model's window (`context_length_exceeded`)."
)


class CompletionRequest(StrictModel):
    model_config = request_schema(COMPLETION_DESCRIPTION, COMPLETION_RULES)

    model: ModelName
    prompt: Prompt = Field(description="text, texts, token ids, or lists of token ids")
    max_tokens: int = Field(16, ge=1, le=1 << 17)
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy")
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1 << 20, description="vLLM's and llama-server's extension; 0 is off")
    n: int = Field(1, ge=1, le=MAX_N, description="choices per prompt; run i uses seed + i when seeded")
    stop: Stop | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = None
    logprobs: int | None = Field(
        None, ge=0, le=5, description="the chosen token's logprob and this many others"
    )
    echo: bool = Field(False, description="return the prompt before the completion")
    suffix: str | None = Field(
        None, min_length=1, description="fill in the middle; needs a model with FIM tokens"
    )
    return_tokens_as_token_ids: bool = Field(False, description="vLLM's extension: logprobs name tokens as "
                                             "`token_id:<id>` instead of their text")
    response_format: ResponseFormat | None = Field(None, description="JSON output, as chat completions (and vLLM) "
                                                   "take it")
    return_token_ids: bool = Field(False, description="vLLM's extension: each choice (each stream chunk) carries its "
                                   "new token ids as `token_ids`")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256, description="recorded with the request in the log")
    parse_special: bool = Field(
        True,
        description="read control-token text in the prompt (`<|im_start|>`) as the model's control tokens, as "
        "llama.cpp's server and vLLM do; false tokenises it as plain text (a sluicegate extension)",
    )

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one list entry each."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        out: list[str | list[int]] = []
        for item in p:
            if isinstance(item, int):
                return [[x for x in p if isinstance(x, int)]]
            out.append(item)
        return out


COMPLETION_FIELDS = tuple(CompletionRequest.model_fields)
UNSUPPORTED: Mapping[str, str] = {"best_of": "no server-side ranking; use n"}


def completion_refusal(body: Mapping[str, Any]) -> FieldRefusal | None:
    return refusal(body, "", COMPLETION_FIELDS, UNSUPPORTED) or stream_options_refusal(body)


class CompletionLogprobs(ResponseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(ResponseModel):
    index: int
    text: str
    token_ids: list[int] | None = Field(None, description="with return_token_ids: this choice's (chunk's) token ids")
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None


class Completion(ResponseModel):
    id: str = Field(description="`cmpl-` + the request id (X-Request-Id)")
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: OpenAIUsage | None = Field(description="null in stream chunks but the last (with include_usage)")
