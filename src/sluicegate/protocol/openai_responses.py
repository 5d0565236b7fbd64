"""`/v1/responses`: OpenAI's Responses shapes, the subset this server implements (docs/openai.md).

A Responses request is served as a chat completion (serving/openai_responses.py translates it); what chat
does not take is refused here, by name, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StringConstraints, Tag

from sluicegate.protocol.common import ResponseModel, StrictModel
from sluicegate.protocol.openai_chat import FunctionName, JsonSchema
from sluicegate.protocol.openai_common import FieldRefusal, each_refusal, refusal

ID_PATTERN = r"^resp_[0-9a-f]{24}$"
MAX_ITEMS = 1024

# -- input items -------------------------------------------------------------------------------------------


class InputText(StrictModel):
    type: Literal["input_text"]
    text: str


class OutputText(StrictModel):
    """An earlier answer's text, passed back as input (its annotations and logprobs are not read)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


ContentPart = Annotated[InputText | OutputText, Field(discriminator="type")]
ItemId = Annotated[str | None, Field(max_length=256)]
ItemStatus = Literal["in_progress", "completed", "incomplete"] | None
CallId = Annotated[str, Field(min_length=1, max_length=256)]


class FunctionCallItem(StrictModel):
    type: Literal["function_call"]
    call_id: CallId
    name: FunctionName
    arguments: str = Field(max_length=1 << 20, description="JSON text, as the model produced it")
    id: ItemId = None
    status: ItemStatus = None


class FunctionCallOutputItem(StrictModel):
    type: Literal["function_call_output"]
    call_id: CallId
    output: str
    id: ItemId = None
    status: ItemStatus = None


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | Annotated[list[ContentPart], Field(min_length=1, max_length=256)]
    id: ItemId = None
    status: ItemStatus = None


class ReasoningTextPart(StrictModel):
    type: Literal["reasoning_text"]
    text: str = Field(max_length=1 << 20)


class ReasoningItem(StrictModel):
    """A thinking model's reasoning sent back (an earlier response's output): accepted, and left out of the
    prompt, as thinking models' templates leave earlier turns' reasoning out (docs/models.md)."""

    type: Literal["reasoning"]
    id: ItemId = None
    summary: Annotated[list[dict[str, Any]], Field(max_length=256)] = Field(default_factory=list)
    content: Annotated[list[ReasoningTextPart], Field(max_length=256)] | None = None
    encrypted_content: None = None
    status: ItemStatus = None


def _item_kind(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if isinstance(kind, str) else "message"
    return getattr(value, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]
ITEM_FIELDS: Mapping[str, tuple[str, ...]] = {
    name: tuple(model.model_fields)
    for name, model in (("message", MessageItem), ("function_call", FunctionCallItem),
                        ("function_call_output", FunctionCallOutputItem), ("reasoning", ReasoningItem))
}

# -- tools and formats -------------------------------------------------------------------------------------


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: FunctionName
    description: str | None = Field(None, max_length=4096)
    parameters: JsonSchema | None = None
    strict: bool | None = Field(None, description="arguments always follow `parameters`, whatever this says")


class FunctionChoice(StrictModel):
    type: Literal["function"]
    name: FunctionName


ToolChoice = Literal["none", "auto", "required"] | FunctionChoice


class FormatText(StrictModel):
    type: Literal["text"]


class FormatJsonObject(StrictModel):
    type: Literal["json_object"]


class FormatJsonSchema(StrictModel):
    type: Literal["json_schema"]
    name: FunctionName
    schema_: JsonSchema = Field(alias="schema")
    description: str | None = Field(None, max_length=4096)
    strict: bool | None = Field(None, description="the schema is always enforced, whatever this says")


TextFormat = Annotated[FormatText | FormatJsonObject | FormatJsonSchema, Field(discriminator="type")]


class TextConfig(StrictModel):
    format: TextFormat = Field(default_factory=lambda: FormatText(type="text"))


MetaKey = Annotated[str, StringConstraints(max_length=64)]
MetaValue = Annotated[str, StringConstraints(max_length=512)]

# -- the request -------------------------------------------------------------------------------------------


class ResponseCreateRequest(StrictModel):
    model: str = Field(min_length=1, max_length=256, description="`name` or `name@version`")
    input: str | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_ITEMS)]
    instructions: str | None = Field(None, description="a system message before the input; not carried over "
                                     "by `previous_response_id`")
    previous_response_id: str | None = Field(None, pattern=ID_PATTERN, description="continue a stored "
                                             "response of this key: its input and output come before `input`")
    tools: Annotated[list[FunctionTool], Field(max_length=64)] | None = None
    tool_choice: ToolChoice | None = Field(None, description="default `auto` with tools")
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=1 << 17, description="default: the rest of the window")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy")
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    stream: bool = False
    store: bool = Field(True, description="keep the response for GET and `previous_response_id`")
    metadata: Annotated[dict[MetaKey, MetaValue], Field(max_length=16)] | None = None
    user: str | None = Field(None, max_length=256, description="recorded with the request in the log")
    safety_identifier: str | None = Field(None, max_length=256, description="recorded like `user`")
    truncation: Literal["disabled"] = Field("disabled", description="a conversation over the window is refused")
    include: Annotated[list[str], Field(max_length=0)] | None = Field(
        None, description="no extra output can be included; only an empty list is taken")


RESPONSE_FIELDS = tuple(ResponseCreateRequest.model_fields)

UNSUPPORTED: Mapping[str, str] = {
    "background": "no background responses; use the Batch API",
    "reasoning": "a model's reasoning is its own, not set per request",
    "conversation": "no conversation objects; use previous_response_id",
    "prompt": "no stored prompt templates",
    "prompt_cache_key": "the prefix cache is automatic",
    "prompt_cache_retention": "the prefix cache is automatic",
    "service_tier": "one tier",
    "max_tool_calls": "no built-in tools",
    "top_logprobs": "no logprobs on this surface; use /v1/chat/completions",
    "stream_options": "no obfuscation padding is sent",
    "context_management": "a conversation over the window is refused",
}
_ITEM_UNSUPPORTED = {
    "item_reference": "no item references; send the item or use previous_response_id",
    "reasoning": "a model's reasoning is its own, not set per request",
}
_PART_TYPES = ("input_text", "output_text")


def _part_refusal(part: Mapping[str, Any], where: str) -> FieldRefusal | None:
    ptype = part.get("type")
    if isinstance(ptype, str) and ptype not in _PART_TYPES:
        return FieldRefusal(
            f"{where}.type", "unsupported_content",
            f"{where}.type is not supported (text only); supported part types: " + ", ".join(_PART_TYPES))
    fields = ("type", "text") if ptype == "input_text" else ("type", "text", "annotations", "logprobs")
    return refusal(part, where, fields)


def _item_refusal(item: Mapping[str, Any], where: str) -> FieldRefusal | None:
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        return None
    if kind not in ITEM_FIELDS:
        why = _ITEM_UNSUPPORTED.get(kind, "no built-in tools" if kind.endswith("_call") or
                                    kind.endswith("_output") else "no such item type")
        return FieldRefusal(f"{where}.type", "unsupported_value",
                            f"{where}.type is not supported ({why}); supported item types: " + ", ".join(ITEM_FIELDS))
    r = refusal(item, where, ITEM_FIELDS[kind])
    if r is None and kind == "message":
        r = each_refusal(item.get("content"), f"{where}.content", _part_refusal)
    return r


def _tool_refusal(tool: Mapping[str, Any], where: str) -> FieldRefusal | None:
    kind = tool.get("type")
    if isinstance(kind, str) and kind != "function":
        return FieldRefusal(f"{where}.type", "unsupported_tool",
                            f"{where}.type is not supported (no built-in tools); supported tool types: function")
    return refusal(tool, where, tuple(FunctionTool.model_fields))


def _choice_refusal(choice: Any) -> FieldRefusal | None:
    if not isinstance(choice, dict):
        return None
    if choice.get("type") != "function":
        return FieldRefusal("tool_choice.type", "unsupported_tool_choice", "tool_choice.type is not supported; "
                            "supported: 'none', 'auto', 'required', or {type: function, name}")
    return refusal(choice, "tool_choice", ("type", "name"))


def _text_refusal(text: Any) -> FieldRefusal | None:
    if not isinstance(text, dict):
        return None
    r = refusal(text, "text", ("format",), {"verbosity": "a model's reasoning is its own, not set per request"})
    fmt = text.get("format")
    if r is not None or not isinstance(fmt, dict):
        return r
    kind = fmt.get("type")
    if isinstance(kind, str) and kind not in ("text", "json_object", "json_schema"):
        return FieldRefusal("text.format.type", "unsupported_value",
                            "text.format.type is not supported; supported: text, json_object, json_schema")
    fields = ("type", "name", "schema", "description", "strict") if kind == "json_schema" else ("type",)
    return refusal(fmt, "text.format", fields)


def _include_refusal(include: Any) -> FieldRefusal | None:
    if isinstance(include, list) and include:
        return FieldRefusal(
            "include", "unsupported_value",
            "include is not supported: this server has no extra output to include; send [] or leave it out")
    return None


def responses_refusal(body: Mapping[str, Any]) -> FieldRefusal | None:
    """The first parameter of a raw Responses request this server will not take, named, with what it takes."""
    items = body.get("input")
    return (refusal(body, "", RESPONSE_FIELDS, UNSUPPORTED)
            or each_refusal(items[:MAX_ITEMS] if isinstance(items, list) else None, "input", _item_refusal)
            or each_refusal(body.get("tools"), "tools", _tool_refusal)
            or _choice_refusal(body.get("tool_choice"))
            or _text_refusal(body.get("text"))
            or _include_refusal(body.get("include")))


# -- the response ------------------------------------------------------------------------------------------


class OutputTextPart(ResponseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(ResponseModel):
    type: Literal["message"] = "message"
    id: str = Field(description="`msg_...`")
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputTextPart]


class FunctionCallOut(ResponseModel):
    type: Literal["function_call"] = "function_call"
    id: str = Field(description="`fc_...`")
    call_id: str = Field(description="the id a `function_call_output` item answers")
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningOutPart(ResponseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningOut(ResponseModel):
    """A thinking model's reasoning (docs/models.md, `--reasoning-format`)."""

    type: Literal["reasoning"] = "reasoning"
    id: str = Field(description="`rs_...`")
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningOutPart]
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = Annotated[OutputMessage | FunctionCallOut | ReasoningOut, Field(discriminator="type")]


class InputTokensDetails(ResponseModel):
    cached_tokens: int = Field(description="input tokens whose KV was reused from the prefix cache")


class OutputTokensDetails(ResponseModel):
    reasoning_tokens: int = 0


class ResponseUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(ResponseModel):
    reason: Literal["max_output_tokens"]


class TextConfigOut(ResponseModel):
    format: dict[str, Any]


class ResponseObject(ResponseModel):
    id: str = Field(description="`resp_...`")
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str = Field(description="`name@version` of the model that answered")
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    temperature: float
    top_p: float
    text: TextConfigOut
    tool_choice: Any
    tools: list[dict[str, Any]]
    truncation: Literal["disabled"] = "disabled"
    store: bool
    metadata: dict[str, str]
    user: str | None
    usage: ResponseUsage | None


class ResponseDeleted(ResponseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputItemList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]] = Field(description="input items as given, each with its `id`")
    first_id: str | None
    last_id: str | None
    has_more: bool
