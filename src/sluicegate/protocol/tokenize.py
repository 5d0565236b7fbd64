"""`POST /tokenize` and `POST /detokenize`, in vLLM's shape (at the server root, as vLLM and llama-server
put them), so another sluicegate can count our tokens exactly when we are its upstream."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from sluicegate.protocol.common import ResponseModel, StrictModel
from sluicegate.protocol.openai_chat import Message, Tool
from sluicegate.protocol.rules import NOT_NULL, present


class TokenizeRequest(StrictModel):
    model_config = StrictModel.model_config | {"json_schema_extra": {
        "oneOf": [present("prompt", NOT_NULL), present("messages", NOT_NULL)],
    }}

    model: str | None = Field(None, min_length=1, max_length=256, description="`name` or `name@version`")
    prompt: str | None = Field(None, description="text to tokenise (exactly one of prompt and messages)")
    messages: Annotated[list[Message], Field(min_length=1, max_length=1024)] | None = Field(
        None, description="chat messages, rendered with the model's chat template as chat completions does")
    tools: Annotated[list[Tool], Field(max_length=64)] | None = Field(
        None, description="messages: the tools a chat request would offer (part of its prompt), as vLLM takes them")
    add_special_tokens: bool | None = Field(
        None, description="add the model's BOS; default true for prompt, false for messages (the template's)")
    add_generation_prompt: bool = Field(True, description="messages: end with the assistant turn's opening")
    parse_special: bool = Field(True, description="prompt: read control-token text (`<|im_start|>`) as the model's "
                                "control tokens, as /v1/completions and /v1/generate do (false: as text); messages "
                                "follow the chat rule (docs/models.md)")


class TokenizeResponse(ResponseModel):
    count: int = Field(description="how many tokens")
    max_model_len: int = Field(description="the model's context window")
    tokens: list[int]


class DetokenizeRequest(StrictModel):
    model_config = StrictModel.model_config | {"json_schema_extra": {"description": (
        "A rule this schema cannot state, as it depends on the model: every id must be below the model's "
        "vocabulary size (`invalid_token_id`, naming the id: `tokens[i]`).")}}

    model: str | None = Field(None, min_length=1, max_length=256, description="`name` or `name@version`")
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=1 << 17)]


class DetokenizeResponse(ResponseModel):
    prompt: str
