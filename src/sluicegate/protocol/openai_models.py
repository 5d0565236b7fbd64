"""`GET /v1/models` and `GET /v1/models/{id}` in OpenAI's shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel

ModelState = Literal["loaded", "loading", "unloaded"]


class OpenAIModel(ResponseModel):
    id: str = Field(description="the served name; `name@version` is accepted wherever a model is named")
    object: Literal["model"] = "model"
    created: int = Field(description="when this server process started serving it (Unix seconds)")
    owned_by: str = "sluicegate"
    state: ModelState = Field(
        "loaded", description="a local model under a memory budget or keep_alive loads on its first request and "
        "may be unloaded when idle (docs/models.md); an upstream's is always loaded")


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]


class ModelLimits(ResponseModel):
    """Every limit a request or a job of this model must fit, with its number (docs/predictions.md)."""

    max_body_bytes: int = Field(description="a JSON request body, in bytes")
    max_prompt_tokens: int = Field(description="prompt tokens one request may send")
    max_new_tokens: int = Field(description="new tokens one request may ask for")
    max_batch_items: int = Field(description="requests in one batch job")
    max_file_bytes: int = Field(description="one uploaded batch file (or batch-predictions JSONL body), in bytes")
    max_stored_bytes: int = Field(description="batch files one API key may keep stored (uploads and outputs), in "
                                  "bytes")
    max_concurrent_jobs: int = Field(description="batch jobs one API key may have queued or running")
    max_enqueued_tokens: int = Field(description="estimated tokens one API key may have in unfinished jobs")


class ModelSchemas(ResponseModel):
    input: dict[str, Any] = Field(description="JSON schema of a prediction's `input`")
    options: dict[str, Any] = Field(description="JSON schema of a prediction's `options` (/v1/generate's)")


class ChatInfo(ResponseModel):
    """How the model reads a conversation (docs/models.md)."""

    template: Literal["model", "file"] | None = Field(
        description="where its chat template comes from: the GGUF (`model`), --chat-template-file (`file`); null: it "
        "has none and cannot take messages")
    tool_format: str = Field(description="the syntax its tool calls are written and read in (hermes, llama3, "
                             "mistral, granite, firefunction, command-r7b, deepseek-r1; generic: Hermes' syntax for a "
                             "template that teaches none)")
    template_renders: list[str] = Field(description="what the template renders itself, of system, tools, tool_calls, "
                                        "tool_responses; the rest is written for it")
    reasoning: list[str] | None = Field(description="the markers a thinking model reasons between (returned apart); "
                                        "null: none, or --reasoning-format none")


class KvInfo(ResponseModel):
    """What the model's KV cache costs and what the exactness guarantee covers for it (docs/models.md)."""

    slots: int = Field(description="sequences held at once")
    bytes_per_slot: int | None = Field(description="one slot's K and V cache at the whole window; null: not known "
                                       "(a model an upstream engine serves)")
    sliding_window: int | None = Field(description="the window of the model's sliding-window layers; null: none. "
                                       "Those layers keep the whole window here (llama.cpp's swa_full), so a cached "
                                       "prefix cut back below the window stays exact")
    exact: list[str] = Field(description="what never changes an output for this model: `batching` (what else is in "
                                         "a step), `decoded_kv` (a finished reply reused as the next turn's prompt), "
                                         "`drafts` (speculative decoding's verification)")
    inexact: str | None = Field(None, description="why what is left out of `exact` is not exact for this model, as "
                                "measured when it loaded (docs/engine.md, \"Earned per model\"); null: nothing was "
                                "found")


class ModelDetails(OpenAIModel):
    """`GET /v1/models/{id}`: OpenAI's four fields, then what this server knows (clients ignore the rest)."""

    name: str
    version: str
    ref: str = Field(description="`name@version`")
    digest: str = Field(description="sha256 of the weights file, as `sha256:<hex>`")
    versions: list[str] = Field(description="the versions this server serves of this model")
    aliases: list[str] = Field(description="every id that names this model here")
    context_window: int = Field(description="positions per request: prompt plus new tokens")
    limits: ModelLimits
    schemas: ModelSchemas
    defaults: dict[str, Any] = Field(description="what a prediction gets when it leaves a field out")
    chat: ChatInfo
    kv: KvInfo
