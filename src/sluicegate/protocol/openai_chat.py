"""`POST /v1/chat/completions`: OpenAI's shapes, the subset this server implements (docs/openai.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.config import JsonDict, JsonValue

from sluicegate.protocol.common import ModelName, ResponseModel, StrictModel
from sluicegate.protocol.openai_common import (
    MAX_N,
    MAX_SEED,
    FieldRefusal,
    FinishReason,
    LogitBias,
    OpenAIUsage,
    Stop,
    StreamOptions,
    TokenLogprob,
    each_refusal,
    refusal,
    stream_options_refusal,
)
from sluicegate.protocol.rules import NOT_NULL, NULL_OR_EMPTY, present, request_schema, when

FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
JsonSchema = dict[str, Any]

# -- messages ----------------------------------------------------------------------------------------------


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


Content = str | Annotated[list[TextPart], Field(min_length=1, max_length=256)]


class SystemMessage(StrictModel):
    role: Literal["system"]
    content: Content


class DeveloperMessage(StrictModel):
    """Rendered exactly like a system message (the model's template knows no developer role)."""

    role: Literal["developer"]
    content: Content


class UserMessage(StrictModel):
    role: Literal["user"]
    content: Content


class ToolCallFunction(StrictModel):
    name: FunctionName
    arguments: str = Field(max_length=1 << 20, description="JSON text, as the model produced it")


class ToolCall(StrictModel):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"]
    function: ToolCallFunction


class AssistantMessage(StrictModel):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1, max_length=64)] | None = None


class ToolMessage(StrictModel):
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(min_length=1, max_length=256)


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]

# -- structured output and tools ---------------------------------------------------------------------------


class ResponseFormatText(StrictModel):
    type: Literal["text"]


class ResponseFormatJsonObject(StrictModel):
    type: Literal["json_object"]


class JsonSchemaFormat(StrictModel):
    name: FunctionName
    description: str | None = Field(None, max_length=4096)
    schema_: JsonSchema = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = Field(None, description="the schema is always enforced, whatever this says")


class ResponseFormatJsonSchema(StrictModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema, Field(discriminator="type")
]


class FunctionDef(StrictModel):
    name: FunctionName
    description: str | None = Field(None, max_length=4096)
    parameters: JsonSchema | None = None
    strict: bool | None = Field(None, description="arguments always follow `parameters`, whatever this says")


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(StrictModel):
    name: FunctionName


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
# Tools with any choice but "none" (including none given: "auto") make the output tool calls.
_TOOL_CALLS: JsonDict = {"allOf": [present("tools", {"type": "array"}),
                                   {"not": present("tool_choice", {"const": "none"})}]}
_JSON_FORMAT: JsonDict = {"type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}}}

# Combinations the server refuses (serving/openai_chat.py), stated where JSON Schema can state them.
CHAT_RULES: list[JsonValue] = [
    when(present("stream_options", {"type": "object"}), present("stream", {"const": True})),
    when(present("top_logprobs", {"type": "integer"}), present("logprobs", {"const": True})),
    when(present("max_tokens", {"type": "integer"}), {"properties": {"max_completion_tokens": {"type": "null"}}}),
    when(present("tool_choice", NOT_NULL), present("tools", {"type": "array"})),
    when(_TOOL_CALLS, {"properties": {
        "response_format": {"anyOf": [{"type": "null"}, {"properties": {"type": {"const": "text"}}}]},
        "stop": NULL_OR_EMPTY}}),
    when(present("response_format", _JSON_FORMAT), {"properties": {"stop": NULL_OR_EMPTY}}),
]
CHAT_DESCRIPTION = (
    "Refused combinations this schema states (`allOf`): `stream_options` without `stream: true`; `top_logprobs` "
    "without `logprobs: true`; both `max_tokens` and `max_completion_tokens`; `tool_choice` without `tools` and "
    "tools that may be called (any `tool_choice` but 'none'; none given is 'auto') with JSON "
    "`response_format`, or with `stop`; `stop` with JSON output. Refused rules it cannot state (400, `code` "
    "names the rule): a named `tool_choice` not in `tools` (`unknown_function`); two tools with one name "
    "(`duplicate_function`); a last message from the assistant (`unsupported_value`); a `parameters` or "
    "`json_schema.schema` outside the subset the server enforces (`unsupported_schema`); a tool with `strict: true` "
    "whose `parameters` are not a strict schema: every object with `additionalProperties: false` and all its "
    "properties required (`invalid_strict_schema`); `logit_bias` ids "
    "outside the model's vocabulary (`invalid_token_id`); prompt plus new tokens over the model's window "
    "(`context_length_exceeded`)."
)

# -- the request -------------------------------------------------------------------------------------------


class ChatCompletionRequest(StrictModel):
    model_config = request_schema(CHAT_DESCRIPTION, CHAT_RULES)

    model: ModelName
    messages: Annotated[list[Message], Field(min_length=1, max_length=1024)]
    max_tokens: int | None = Field(None, ge=1, le=1 << 17, description="deprecated spelling of the next")
    max_completion_tokens: int | None = Field(
        None, ge=1, le=1 << 17, description="default: the rest of the window"
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy")
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N, description="choices; run i uses seed + i when seeded")
    stop: Stop | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = Field(
        None, description="token id (as a string) -> bias added to its logit"
    )
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=64)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = Field(
        None, description="true permits several calls, false at most one; a choice here makes at most one either way"
    )
    user: str | None = Field(None, max_length=256, description="recorded with the request in the log")
    safety_identifier: str | None = Field(None, max_length=256, description="recorded like `user`")

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


CHAT_FIELDS = tuple(ChatCompletionRequest.model_fields)

UNSUPPORTED: Mapping[str, str] = {
    "audio": "text only",
    "modalities": "text only",
    "prediction": "no predicted outputs",
    "service_tier": "one tier",
    "store": "completions are not stored",
    "metadata": "completions are not stored",
    "reasoning_effort": "a model's reasoning is its own, not set per request",
    "verbosity": "a model's reasoning is its own, not set per request",
    "web_search_options": "no web search",
    "functions": "deprecated; use tools",
    "function_call": "deprecated; use tool_choice",
    "prompt_cache_key": "the prefix cache is automatic",
    "prompt_cache_retention": "the prefix cache is automatic",
    "prompt_cache_options": "the prefix cache is automatic",
}

_MESSAGE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "system": ("role", "content"),
    "developer": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}
_MESSAGE_UNSUPPORTED = {
    "name": "participant names are not rendered",
    "refusal": "no refusals",
    "audio": "text only",
    "function_call": "deprecated; use tool_calls",
}
_TOOL_CHOICE_STRINGS = ("none", "auto", "required")


def _part_refusal(part: Mapping[str, Any], where: str) -> FieldRefusal | None:
    kind = part.get("type")
    if isinstance(kind, str) and kind != "text":
        return FieldRefusal(f"{where}.type", "unsupported_content",
                            f"{where}.type is not supported; supported part types: text")
    return refusal(part, where, ("type", "text"))


def _message_refusal(msg: Mapping[str, Any], where: str) -> FieldRefusal | None:
    role = msg.get("role")
    if not isinstance(role, str):
        return None
    if role not in _MESSAGE_FIELDS:
        why = "deprecated; use tool" if role == "function" else "no such role"
        return FieldRefusal(
            f"{where}.role",
            "unsupported_role",
            f"{where}.role is not supported ({why}); supported roles: " + ", ".join(_MESSAGE_FIELDS),
        )
    return (refusal(msg, where, _MESSAGE_FIELDS[role], _MESSAGE_UNSUPPORTED)
            or each_refusal(msg.get("content"), f"{where}.content", _part_refusal))


def _tool_refusal(tool: Mapping[str, Any], where: str) -> FieldRefusal | None:
    if tool.get("type") not in (None, "function"):
        return FieldRefusal(f"{where}.type", "unsupported_tool",
                            f"{where}.type is not supported; supported tool types: function")
    r = refusal(tool, where, ("type", "function"))
    if r is None and isinstance(fn := tool.get("function"), dict):
        r = refusal(fn, f"{where}.function", ("name", "description", "parameters", "strict"))
    return r


def _format_refusal(fmt: Any) -> FieldRefusal | None:
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if isinstance(kind, str) and kind not in ("text", "json_object", "json_schema"):
        return FieldRefusal("response_format.type", "unsupported_value",
                            "response_format.type is not supported; supported: text, json_object, json_schema")
    r = refusal(fmt, "response_format", ("type", "json_schema") if kind == "json_schema" else ("type",))
    if r is None and isinstance(js := fmt.get("json_schema"), dict):
        r = refusal(js, "response_format.json_schema", ("name", "description", "schema", "strict"))
    return r


def _choice_refusal(choice: Any) -> FieldRefusal | None:
    if isinstance(choice, dict) and choice.get("type") not in (None, "function"):
        return FieldRefusal(
            "tool_choice.type", "unsupported_tool_choice",
            "tool_choice.type is not supported; supported: 'none', 'auto', 'required', or a named function")
    return None


def chat_refusal(body: Mapping[str, Any]) -> FieldRefusal | None:
    """The first parameter of a raw chat request this server will not take, named, with what it takes."""
    return (refusal(body, "", CHAT_FIELDS, UNSUPPORTED)
            or each_refusal(body.get("messages"), "messages", _message_refusal)
            or each_refusal(body.get("tools"), "tools", _tool_refusal)
            or _choice_refusal(body.get("tool_choice"))
            or _format_refusal(body.get("response_format"))
            or stream_options_refusal(body))


# -- the response ------------------------------------------------------------------------------------------


class ToolCallFunctionOut(ResponseModel):
    name: str
    arguments: str


class ToolCallOut(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunctionOut


REASONING = ("a thinking model's reasoning, read apart from its answer (docs/models.md, `--reasoning-format`); "
             "present only when it wrote some")


class ChatMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | None = None
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None, description=REASONING)


class ChoiceLogprobs(ResponseModel):
    content: list[TokenLogprob] | None
    refusal: None = None


class ChatChoice(ResponseModel):
    index: int
    message: ChatMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(ResponseModel):
    id: str = Field(description="`chatcmpl-` + the request id (X-Request-Id)")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(description="`name@version` of the model that answered")
    system_fingerprint: str = Field(description="changes when the weights or the engine configuration change")
    choices: list[ChatChoice]
    usage: OpenAIUsage


class DeltaFunction(ResponseModel):
    name: str | None = None
    arguments: str


class DeltaToolCall(ResponseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class ChoiceDelta(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None, description=REASONING)


class ChunkChoice(ResponseModel):
    index: int
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(ResponseModel):
    """One SSE event; serialised with `exclude_unset`, so a delta carries only what it sets."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChunkChoice]
    usage: OpenAIUsage | None = Field(
        None, description="with include_usage: null, then set in the last chunk"
    )
