"""Anthropic's `/v1/messages`: an adapter on the chat path (serving/openai_chat.py).

A Messages request becomes the chat request it means (system -> a system message; text blocks -> content;
`tool_use` blocks -> the assistant's tool calls; `tool_result` blocks -> tool messages; `tools[].input_schema`
-> function parameters; `tool_choice` `tool` -> a named function, `any` -> `required`, `none` -> `none`), and
chat renders, budgets, constrains and starts it. Only the answer's shape is this module's: content blocks,
`stop_reason`, usage in Anthropic's names, and the stream's typed events.

`tool_choice: auto` (Anthropic's default when `tools` are given) is refused by name, as on chat: without a
constraint this server could only guess whether free text is a call (docs/anthropic.md says what it waits on).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sluicegate.engine import FinishReason
from sluicegate.engine.types import RequestOutput
from sluicegate.protocol.anthropic_messages import (
    ContentBlock,
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    CountTokensRequest,
    DeltaUsage,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageDeltaEvent,
    MessageParam,
    MessagesRequest,
    MessageStartEvent,
    MessageTokensCount,
    MessageUsage,
    StopReason,
    StreamEvent,
    TextBlock,
    TextBlockParam,
    TextDelta,
    ToolChoiceAny,
    ToolChoiceTool,
    ToolResultBlockParam,
    ToolUseBlock,
    ToolUseBlockParam,
)
from sluicegate.protocol.openai_chat import (
    AssistantMessage,
    ChatCompletionRequest,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    SystemMessage,
    TextPart,
    Tool,
    ToolCall,
    ToolCallFunction,
    ToolMessage,
    UserMessage,
)
from sluicegate.protocol.openai_chat import (
    Message as ChatMessage,
)
from sluicegate.serving import openai_chat as chat
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import HEARTBEAT_S, Runs, collect_finished, finish_error
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel


@dataclass(slots=True)
class MessagesPlan:
    request: MessagesRequest
    chat: chat.ChatPlan

    @property
    def runs(self) -> Runs:  # the chat plan's runs (the route meters and closes them)
        return self.chat.runs


def _bad(param: str, message: str, code: str = "invalid_combination") -> ApiError:
    return ApiError("invalid_request", message, param=param, code=code)


def _misplaced(i: int, j: int, why: str) -> ApiError:
    return _bad(f"messages[{i}].content[{j}].type", f"messages[{i}].content[{j}]: {why}", code="misplaced_block")


def _text(blocks: list[TextBlockParam]) -> str:
    return "".join(b.text for b in blocks)


def _check(req: CountTokensRequest) -> None:
    """The rules chat would enforce under its own names, stated in this surface's names."""
    choice = req.tool_choice
    names = [t.name for t in req.tools or ()]
    if choice is not None and not req.tools:
        raise _bad("tool_choice", "tool_choice needs tools")
    if len(set(names)) != len(names):
        raise _bad("tools", "two tools have the same name", code="duplicate_function")
    if isinstance(choice, ToolChoiceTool) and choice.name not in names:
        raise _bad("tool_choice.name", "tool_choice names a tool that is not in tools", code="unknown_function")
    forced = isinstance(choice, ToolChoiceAny | ToolChoiceTool)
    if forced and isinstance(req, MessagesRequest) and req.stop_sequences:
        raise _bad("stop_sequences", "stop_sequences cannot be combined with a forced tool call: it could cut "
                   "the call's JSON")
    if req.messages[-1].role == "assistant":
        raise _bad("messages", "the last message must not be the assistant's: prefilling (continuing) an "
                   "assistant message is not supported", code="unsupported_value")


def _user(msg: MessageParam, i: int) -> list[ChatMessage]:
    if isinstance(msg.content, str):
        return [UserMessage(role="user", content=msg.content)]
    out: list[ChatMessage] = []
    texts: list[TextPart] = []
    for j, block in enumerate(msg.content):
        if isinstance(block, ToolResultBlockParam):
            content = block.content if isinstance(block.content, str) else _text(block.content or [])
            if block.is_error:
                content = f"Error: {content}"
            out.append(ToolMessage(role="tool", content=content, tool_call_id=block.tool_use_id))
        elif isinstance(block, ToolUseBlockParam):
            raise _misplaced(i, j, "a tool_use block belongs in an assistant message")
        else:
            texts.append(TextPart(type="text", text=block.text))
    if texts:
        out.append(UserMessage(role="user", content=texts))
    return out


def _assistant(msg: MessageParam, i: int) -> AssistantMessage:
    if isinstance(msg.content, str):
        return AssistantMessage(role="assistant", content=msg.content)
    for j, b in enumerate(msg.content):
        if isinstance(b, ToolResultBlockParam):
            raise _misplaced(i, j, "a tool_result block belongs in a user message")
    texts = [TextPart(type="text", text=b.text) for b in msg.content if isinstance(b, TextBlockParam)]
    calls = [
        ToolCall(id=b.id, type="function", function=ToolCallFunction(
            name=b.name, arguments=json.dumps(b.input, ensure_ascii=False, separators=(", ", ": "))))
        for b in msg.content if isinstance(b, ToolUseBlockParam)
    ]
    return AssistantMessage(role="assistant", content=texts or None, tool_calls=calls or None)


def to_chat(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request a Messages request means (module doc)."""
    _check(req)
    messages: list[ChatMessage] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else _text(req.system)
        messages.append(SystemMessage(role="system", content=system))
    for i, msg in enumerate(req.messages):
        if msg.role == "user":
            messages.extend(_user(msg, i))
        else:
            messages.append(_assistant(msg, i))
    fields: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        fields["tools"] = [
            Tool(type="function", function=FunctionDef(name=t.name, description=t.description,
                                                       parameters=t.input_schema, strict=None))
            for t in req.tools
        ]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceTool):
        fields["tool_choice"] = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    elif choice is not None:
        fields["tool_choice"] = "required" if isinstance(choice, ToolChoiceAny) else "none"
    if isinstance(req, MessagesRequest):
        fields.update(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                      stop=req.stop_sequences or None, stream=req.stream)
        if req.metadata is not None and req.metadata.user_id is not None:
            fields["user"] = req.metadata.user_id
    return ChatCompletionRequest(**fields)


def _renamed(exc: ApiError) -> ApiError:
    """A chat refusal in this surface's names (a message index may differ: blocks split into messages)."""
    param = exc.param
    if param is None:
        return exc
    if param.startswith("messages["):
        new = "messages"
    elif param.startswith("tools[") and param.endswith(".function.parameters"):
        new = param.replace(".function.parameters", ".input_schema")
    else:
        return exc
    exc.message = exc.message.replace(param, new)
    exc.param = new
    return exc


async def count_tokens(model: ServedModel, req: CountTokensRequest) -> MessageTokensCount:
    model.resolve(req.model)
    chat_req = to_chat(req)  # its refusals are in this surface's names already
    try:
        prompt = await chat.prompt_of(model, chat_req)
    except ApiError as exc:
        raise _renamed(exc) from None
    return MessageTokensCount(input_tokens=len(prompt.token_ids))


async def prepare(model: ServedModel, req: MessagesRequest, ctx: RequestContext) -> MessagesPlan:
    chat_req = to_chat(req)  # its refusals are in this surface's names already
    try:
        plan = await chat.prepare(model, chat_req, ctx, top_k=req.top_k)
    except ApiError as exc:
        raise _renamed(exc) from None
    return MessagesPlan(req, plan)


def tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


def _stop(plan: MessagesPlan, final: RequestOutput | None) -> tuple[StopReason, str | None]:
    reason = final.finish_reason if final is not None else None
    if reason is FinishReason.LENGTH:
        return "max_tokens", None
    if plan.chat.tool is not None:
        return "tool_use", None
    if reason is FinishReason.STOP:
        stops = plan.request.stop_sequences or []
        matched = final.stop_string if final is not None else None
        return "stop_sequence", matched if matched is not None else (stops[0] if len(stops) == 1 else None)
    return "end_turn", None


def _blocks(plan: MessagesPlan, text: str, stop: StopReason) -> list[ContentBlock]:
    """The answer's content: text, or one tool_use block. A call cut by max_tokens is its text, never half a
    call."""
    tool = plan.chat.tool
    if tool is None or stop != "tool_use":
        return [TextBlock(type="text", text=text)]
    if tool.name is not None:
        return [ToolUseBlock(type="tool_use", id=tool_use_id(), name=tool.name, input=json.loads(text))]
    obj = json.loads(text)  # the grammar's {"name", "arguments"} (anyOf over the tools)
    return [ToolUseBlock(type="tool_use", id=tool_use_id(), name=obj["name"], input=obj["arguments"])]


def _usage(final: RequestOutput | None) -> MessageUsage:
    prompt = final.prompt_tokens if final is not None else 0
    cached = final.cached_tokens if final is not None else 0
    return MessageUsage(input_tokens=prompt - cached, output_tokens=final.completion_tokens if final else 0,
                        cache_read_input_tokens=cached, cache_creation_input_tokens=0)


def _message(plan: MessagesPlan, ctx: RequestContext, content: list[ContentBlock], stop: StopReason | None,
             stop_sequence: str | None, usage: MessageUsage) -> Message:
    return Message(id=f"msg_{ctx.request_id}", type="message", role="assistant", model=plan.chat.model_ref,
                   content=content, stop_reason=stop, stop_sequence=stop_sequence, usage=usage)


async def complete(model: ServedModel, plan: MessagesPlan, ctx: RequestContext) -> Message:
    """Run to the end and return one message (the runs are already started)."""
    r = (await collect_finished(plan.chat.runs, ctx))[0]
    chat.check_constraint(plan.chat, 0)
    stop, sequence = _stop(plan, r.final)
    return _message(plan, ctx, _blocks(plan, r.text, stop), stop, sequence, _usage(r.final))


async def stream(model: ServedModel, plan: MessagesPlan, ctx: RequestContext) -> AsyncIterator[StreamEvent | None]:
    """Anthropic's events (the runs are already started): message_start; one content block (text deltas, or
    a named tool's input as input_json_delta pieces; an `any` call is sent whole when it ends: it is a call
    only once it parses); message_delta with the stop reason and usage. The route's framing adds
    message_stop last, and turns `None` (nothing to send for a while) into a ping."""
    n_prompt = len(plan.chat.runs.requests[0].prompt_ids)
    start_usage = MessageUsage(input_tokens=n_prompt, output_tokens=0, cache_read_input_tokens=0,
                               cache_creation_input_tokens=0)
    yield MessageStartEvent(type="message_start", message=_message(plan, ctx, [], None, None, start_usage))
    tool = plan.chat.tool
    open_block = False
    if tool is None:
        yield ContentBlockStartEvent(type="content_block_start", index=0,
                                     content_block=TextBlock(type="text", text=""))
        open_block = True
    elif tool.name is not None:
        yield ContentBlockStartEvent(type="content_block_start", index=0, content_block=ToolUseBlock(
            type="tool_use", id=tool_use_id(), name=tool.name, input={}))
        open_block = True
    buffered = ""
    final: RequestOutput | None = None
    async for ev in plan.chat.runs.events(HEARTBEAT_S):
        if ev is None:
            yield None
            continue
        _, out = ev
        err = finish_error(out) if out.finished else None
        if out.text:
            if tool is None:
                yield ContentBlockDeltaEvent(type="content_block_delta", index=0,
                                             delta=TextDelta(type="text_delta", text=out.text))
            elif tool.name is not None:
                yield ContentBlockDeltaEvent(type="content_block_delta", index=0,
                                             delta=InputJsonDelta(type="input_json_delta", partial_json=out.text))
            else:
                buffered += out.text
        if err is not None:
            raise err
        if out.finished:
            chat.check_constraint(plan.chat, 0)
            final = out
    stop, sequence = _stop(plan, final)
    if not open_block:  # an `any` call, whole; or its text when cut by max_tokens
        block = _blocks(plan, buffered, stop)[0]
        if isinstance(block, ToolUseBlock):
            yield ContentBlockStartEvent(type="content_block_start", index=0, content_block=block.model_copy(
                update={"input": {}}))
            yield ContentBlockDeltaEvent(type="content_block_delta", index=0, delta=InputJsonDelta(
                type="input_json_delta", partial_json=json.dumps(block.input, ensure_ascii=False)))
        else:
            yield ContentBlockStartEvent(type="content_block_start", index=0,
                                         content_block=TextBlock(type="text", text=""))
            yield ContentBlockDeltaEvent(type="content_block_delta", index=0,
                                         delta=TextDelta(type="text_delta", text=block.text))
    yield ContentBlockStopEvent(type="content_block_stop", index=0)
    usage = _usage(final)
    yield MessageDeltaEvent(type="message_delta", delta=MessageDelta(stop_reason=stop, stop_sequence=sequence),
                            usage=DeltaUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                                             cache_read_input_tokens=usage.cache_read_input_tokens))
