"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's shapes, the subset this server implements
(docs/anthropic.md). The request converts to a chat request (serving/anthropic_messages.py); the response and
stream events are Anthropic's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.config import JsonDict, JsonValue

from sluicegate.protocol.common import ModelName, ResponseModel, StrictModel
from sluicegate.protocol.openai_chat import FunctionName, JsonSchema
from sluicegate.protocol.openai_common import FieldRefusal, StopField, each_refusal, refusal
from sluicegate.protocol.rules import NOT_NULL, NULL_OR_EMPTY, present, request_schema, when

# -- content blocks ----------------------------------------------------------------------------------------


class CacheControl(StrictModel):
    """Accepted and satisfied as it stands: the prefix cache keeps every prompt's prefix, marked or not."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlockParam(StrictModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class ToolUseBlockParam(StrictModel):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: FunctionName
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlockParam(StrictModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | Annotated[list[TextBlockParam], Field(max_length=256)] | None = None
    is_error: bool | None = Field(None, description="rendered as `Error: ` before the result's text")
    cache_control: CacheControl | None = None


ContentBlockParam = Annotated[
    TextBlockParam | ToolUseBlockParam | ToolResultBlockParam, Field(discriminator="type")
]


class MessageParam(StrictModel):
    """Blocks by role (`tool_use` in the assistant's, `tool_result` in the user's) are checked by the server
    (`misplaced_block`), not by this schema: one content schema for both roles keeps it one a fuzzer can draw
    from (a role-discriminated pair defeats schemathesis's negative generation)."""

    role: Literal["user", "assistant"]
    content: str | Annotated[list[ContentBlockParam], Field(min_length=1, max_length=256)]


# -- tools -------------------------------------------------------------------------------------------------


class ToolParam(StrictModel):
    name: FunctionName
    description: str | None = Field(None, max_length=4096)
    input_schema: JsonSchema
    type: Literal["custom"] | None = None
    strict: bool | None = Field(None, description="the input always follows `input_schema`, whatever this says")
    cache_control: CacheControl | None = None


_PARALLEL = "a forced call is always one call, whatever this says"


class ToolChoiceAuto(StrictModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = Field(None, description="true: at most one call (default: several "
                                                   "may follow one another)")


class ToolChoiceAny(StrictModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = Field(None, description=_PARALLEL)


class ToolChoiceTool(StrictModel):
    type: Literal["tool"]
    name: FunctionName
    disable_parallel_tool_use: bool | None = Field(None, description=_PARALLEL)


class ToolChoiceNone(StrictModel):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class Metadata(StrictModel):
    user_id: str | None = Field(None, max_length=256, description="recorded with the request in the log")


# -- the requests ------------------------------------------------------------------------------------------

# Tools with any choice but none (including none given: `auto`) make the output tool calls.
_TOOL_CALLS: JsonDict = {"allOf": [present("tools", {"type": "array"}), {"not": present(
    "tool_choice", {"properties": {"type": {"const": "none"}}, "required": ["type"]})}]}
# Rules the server enforces (serving/anthropic_messages.py), stated where JSON Schema can state them.
COUNT_RULES: list[JsonValue] = [
    when(present("tool_choice", NOT_NULL), present("tools", {"type": "array"})),
]
MESSAGES_RULES: list[JsonValue] = [
    *COUNT_RULES,
    when(_TOOL_CALLS, {"properties": {"stop_sequences": NULL_OR_EMPTY}}),
]
MESSAGES_DESCRIPTION = (
    "Anthropic's Messages API, the subset this server implements (docs/anthropic.md). Refused combinations "
    "this schema states (`allOf`): `tool_choice` without `tools`; `stop_sequences` with tools whose choice is "
    "not `none` (`auto`, the default, `any`, `tool`: a stop sequence could cut a call). Refused "
    "rules it does not state (400 `invalid_request_error`, our kind in `error.code`): a `tool_use` block in a user "
    "message or a `tool_result` block in an assistant message (`misplaced_block`); a `tool_choice.name` not in "
    "`tools` (`unknown_function`); two tools with one name (`duplicate_function`); a last message from the "
    "assistant, as prefill is not supported (`unsupported_value`); an `input_schema` outside the subset the "
    "server enforces (`unsupported_schema`); prompt plus `max_tokens` over the model's window "
    "(`context_length_exceeded`)."
)

System = str | Annotated[list[TextBlockParam], Field(min_length=1, max_length=256)]
Messages = Annotated[list[MessageParam], Field(min_length=1, max_length=1024)]
Tools = Annotated[list[ToolParam], Field(min_length=1, max_length=64)]


class CountTokensRequest(StrictModel):
    model_config = request_schema("The prompt `POST /v1/messages` would run, counted. " + MESSAGES_DESCRIPTION,
                                  COUNT_RULES)

    model: ModelName
    messages: Messages
    system: System | None = None
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None


class MessagesRequest(CountTokensRequest):
    model_config = request_schema(MESSAGES_DESCRIPTION, MESSAGES_RULES)

    max_tokens: int = Field(ge=1, le=1 << 17, description="new tokens at most (required, as on Anthropic)")
    stop_sequences: Annotated[list[StopField], Field(max_length=4)] | None = None
    temperature: float = Field(1.0, ge=0.0, le=1.0, description="0 is greedy")
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1 << 20, description="0 is off")
    metadata: Metadata | None = None
    stream: bool = False


COUNT_FIELDS = tuple(CountTokensRequest.model_fields)
MESSAGES_FIELDS = tuple(MessagesRequest.model_fields)

UNSUPPORTED: Mapping[str, str] = {
    "thinking": "a model's reasoning is its own, not set per request",
    "output_config": "no structured output on this route; use a tool with tool_choice 'tool'",
    "output_format": "no structured output on this route; use a tool with tool_choice 'tool'",
    "container": "no code execution",
    "mcp_servers": "no MCP connector",
    "context_management": "no context management",
    "service_tier": "one tier",
    "inference_geo": "one place",
    "speed": "one speed",
    "diagnostics": "no diagnostics",
    "user_profile_id": "no user profiles",
    "workspace_id": "no workspaces",
}
_BLOCK_FIELDS: Mapping[str, tuple[str, ...]] = {
    "text": ("type", "text", "cache_control"),
    "tool_use": ("type", "id", "name", "input", "cache_control"),
    "tool_result": ("type", "tool_use_id", "content", "is_error", "cache_control"),
}
_BLOCK_UNSUPPORTED = {"citations": "no citations"}
_ROLES = ("user", "assistant")
_TOOL_FIELDS = ("name", "description", "input_schema", "type", "strict", "cache_control")
_TOOL_UNSUPPORTED = {
    "input_examples": "not rendered",
    "defer_loading": "no tool search",
    "allowed_callers": "no programmatic tool calling",
    "eager_input_streaming": "no fine-grained tool streaming",
}
_CHOICE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "auto": ("type", "disable_parallel_tool_use"),
    "any": ("type", "disable_parallel_tool_use"),
    "tool": ("type", "name", "disable_parallel_tool_use"),
    "none": ("type",),
}


def _blocks_refusal(blocks: Any, where: str, kinds: tuple[str, ...]) -> FieldRefusal | None:
    """The first content block of a type this server does not take, or with a field it does not take."""

    def block_refusal(block: Mapping[str, Any], here: str) -> FieldRefusal | None:
        kind = block.get("type")
        if not isinstance(kind, str):
            return None
        if kind not in kinds:
            return FieldRefusal(f"{here}.type", "unsupported_content",
                                f"{here}.type is not supported here; supported block types: " + ", ".join(kinds))
        r = refusal(block, here, _BLOCK_FIELDS[kind], _BLOCK_UNSUPPORTED)
        if r is None and kind == "tool_result":
            r = _blocks_refusal(block.get("content"), f"{here}.content", ("text",))
        return r

    return each_refusal(blocks, where, block_refusal)


def _message_refusal(msg: Mapping[str, Any], where: str) -> FieldRefusal | None:
    role = msg.get("role")
    if isinstance(role, str) and role not in _ROLES:
        return FieldRefusal(f"{where}.role", "unsupported_role", f"{where}.role is not supported; "
                            "supported roles: user, assistant (the system prompt is the field `system`)")
    return (refusal(msg, where, ("role", "content"))
            or _blocks_refusal(msg.get("content"), f"{where}.content", tuple(_BLOCK_FIELDS)))


def _tool_refusal(tool: Mapping[str, Any], where: str) -> FieldRefusal | None:
    kind = tool.get("type")
    if isinstance(kind, str) and kind != "custom":
        return FieldRefusal(f"{where}.type", "unsupported_tool",
                            f"{where}.type is not supported (no server tools); supported: custom")
    return refusal(tool, where, _TOOL_FIELDS, _TOOL_UNSUPPORTED)


def _choice_refusal(choice: Any) -> FieldRefusal | None:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(kind, str) and kind in _CHOICE_FIELDS:
        return refusal(choice, "tool_choice", _CHOICE_FIELDS[kind])
    return None


def _metadata_refusal(metadata: Any) -> FieldRefusal | None:
    return refusal(metadata, "metadata", ("user_id",)) if isinstance(metadata, dict) else None


def messages_refusal(body: Mapping[str, Any], fields: tuple[str, ...] = MESSAGES_FIELDS) -> FieldRefusal | None:
    """The first parameter of a raw Messages request this server will not take, named, with what it takes."""
    return (refusal(body, "", fields, UNSUPPORTED)
            or _blocks_refusal(body.get("system"), "system", ("text",))
            or each_refusal(body.get("messages"), "messages", _message_refusal)
            or _metadata_refusal(body.get("metadata"))
            or each_refusal(body.get("tools"), "tools", _tool_refusal)
            or _choice_refusal(body.get("tool_choice")))


def count_tokens_refusal(body: Mapping[str, Any]) -> FieldRefusal | None:
    return messages_refusal(body, COUNT_FIELDS)


# -- the response ------------------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextBlock(ResponseModel):
    type: Literal["text"]
    text: str


class ToolUseBlock(ResponseModel):
    type: Literal["tool_use"]
    id: str = Field(description="`toolu_` and 24 hex digits")
    name: str
    input: dict[str, Any]


class ThinkingBlock(ResponseModel):
    """A thinking model's reasoning (docs/models.md); `signature` is empty: there is no Anthropic key to sign
    with, and a thinking block sent back is read as the reasoning text it holds."""

    type: Literal["thinking"]
    thinking: str
    signature: str = ""


ContentBlock = Annotated[TextBlock | ToolUseBlock | ThinkingBlock, Field(discriminator="type")]


class MessageUsage(ResponseModel):
    """Anthropic's names: `input_tokens` are the prompt tokens computed, `cache_read_input_tokens` those whose
    KV came from the prefix cache (their sum is the whole prompt); counted from the token ids."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int = Field(description="always 0: caching costs nothing extra here")


class Message(ResponseModel):
    id: str = Field(description="`msg_` + the request id")
    type: Literal["message"]
    role: Literal["assistant"]
    model: str = Field(description="`name@version` of the model that answered")
    content: list[ContentBlock]
    stop_reason: StopReason | None = Field(description="null only in a stream's message_start")
    stop_sequence: str | None = Field(description="the stop sequence that ended the message, if one did")
    usage: MessageUsage


class MessageTokensCount(ResponseModel):
    input_tokens: int = Field(description="the prompt `POST /v1/messages` would run, in the model's tokens")


# -- stream events (Anthropic's names; each event's SSE name is its `type`) -------------------------------


class MessageStartEvent(ResponseModel):
    type: Literal["message_start"]
    message: Message


class ContentBlockStartEvent(ResponseModel):
    type: Literal["content_block_start"]
    index: int
    content_block: ContentBlock


class TextDelta(ResponseModel):
    type: Literal["text_delta"]
    text: str


class InputJsonDelta(ResponseModel):
    type: Literal["input_json_delta"]
    partial_json: str


class ThinkingDelta(ResponseModel):
    type: Literal["thinking_delta"]
    thinking: str


class ContentBlockDeltaEvent(ResponseModel):
    type: Literal["content_block_delta"]
    index: int
    delta: Annotated[TextDelta | InputJsonDelta | ThinkingDelta, Field(discriminator="type")]


class ContentBlockStopEvent(ResponseModel):
    type: Literal["content_block_stop"]
    index: int


class MessageDelta(ResponseModel):
    stop_reason: StopReason
    stop_sequence: str | None


class DeltaUsage(ResponseModel):
    """Cumulative: the final counts (message_start's `input_tokens` is the whole prompt, before the prefix
    cache was consulted)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int


class MessageDeltaEvent(ResponseModel):
    type: Literal["message_delta"]
    delta: MessageDelta
    usage: DeltaUsage


StreamEvent = (
    MessageStartEvent | ContentBlockStartEvent | ContentBlockDeltaEvent | ContentBlockStopEvent | MessageDeltaEvent
)
