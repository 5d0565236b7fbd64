"""Anthropic's `/v1/messages`: an adapter on the chat path (serving/openai_chat.py).

A Messages request becomes the chat request it means (system -> a system message; text blocks -> content;
`tool_use` blocks -> the assistant's tool calls; `tool_result` blocks -> tool messages; `tools[].input_schema`
-> function parameters; `tool_choice` `auto` (the default with tools) -> `auto`, `tool` -> a named function,
`any` -> `required`, `none` -> `none`; `disable_parallel_tool_use` -> `parallel_tool_calls: false`), and chat
renders, budgets, constrains and starts it. Only the answer's shape is this module's: content blocks (the output
read by the one tool-call parser, serving/tool_calls.py), `stop_reason`, usage in Anthropic's names, and the
stream's typed events.
"""

from __future__ import annotations

import json
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
    ThinkingBlock,
    ThinkingDelta,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
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
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import HEARTBEAT_S, Runs, collect_finished, finish_error
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel
from sluicegate.serving.output_reader import ArgsPiece, CallStart, Event, ReasoningPiece, TextPiece
from sluicegate.serving.tool_calls import partial_object
from sluicegate.serving.validation import refused


@dataclass(slots=True)
class MessagesPlan:
    request: MessagesRequest
    chat: chat.ChatPlan

    @property
    def runs(self) -> Runs:  # the chat plan's runs (the work lifecycle meters and closes them)
        return self.chat.runs


def _misplaced(i: int, j: int, why: str) -> ApiError:
    return refused(f"messages[{i}].content[{j}].type", f"messages[{i}].content[{j}]: {why}", code="misplaced_block")


def _text(blocks: list[TextBlockParam]) -> str:
    return "".join(b.text for b in blocks)


def _check(req: CountTokensRequest) -> None:
    """The rules chat would enforce under its own names, stated in this surface's names."""
    choice = req.tool_choice
    names = [t.name for t in req.tools or ()]
    if choice is not None and not req.tools:
        raise refused("tool_choice", "tool_choice needs tools")
    if len(set(names)) != len(names):
        raise refused("tools", "two tools have the same name", code="duplicate_function")
    if isinstance(choice, ToolChoiceTool) and choice.name not in names:
        raise refused("tool_choice.name", "tool_choice names a tool that is not in tools", code="unknown_function")
    calls = bool(req.tools) and not isinstance(choice, ToolChoiceNone)
    if calls and isinstance(req, MessagesRequest) and req.stop_sequences:
        raise refused("stop_sequences", "stop_sequences cannot be combined with tools whose tool_choice is not "
                      "none: a stop sequence could cut a call's JSON")
    if req.messages[-1].role == "assistant":
        raise refused("messages", "the last message must not be the assistant's: prefilling (continuing) an "
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
    elif isinstance(choice, ToolChoiceAny):
        fields["tool_choice"] = "required"
    elif isinstance(choice, ToolChoiceNone):
        fields["tool_choice"] = "none"
    elif req.tools:  # auto, given or by default
        fields["tool_choice"] = "auto"
    if isinstance(choice, ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool) and choice.disable_parallel_tool_use:
        fields["parallel_tool_calls"] = False
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


async def prepare(model: ServedModel, req: MessagesRequest, ctx: RequestContext,
                  admission: Admission = OPEN) -> MessagesPlan:
    chat_req = to_chat(req)  # its refusals are in this surface's names already
    try:
        plan = await chat.prepare(model, chat_req, ctx, admission, top_k=req.top_k)
    except ApiError as exc:
        raise _renamed(exc) from None
    return MessagesPlan(req, plan)


def _tool_use_id(call_id: str) -> str:
    """Anthropic's spelling of a call id (the parser's `call_` and 24 hex digits)."""
    return "toolu_" + call_id.removeprefix("call_")


def _stop(plan: MessagesPlan, final: RequestOutput | None, calls: bool) -> tuple[StopReason, str | None]:
    """`calls`: the output holds whole tool calls."""
    reason = final.finish_reason if final is not None else None
    if reason is FinishReason.LENGTH:
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if reason is FinishReason.STOP:
        stops = plan.request.stop_sequences or []
        matched = final.stop_string if final is not None else None
        return "stop_sequence", matched if matched is not None else (stops[0] if len(stops) == 1 else None)
    return "end_turn", None


def _blocks(plan: MessagesPlan, text: str, final: RequestOutput | None) -> tuple[list[ContentBlock], bool]:
    """The answer's content: the reasoning (a thinking block), text, then the tool calls as tool_use blocks (a
    call cut by max_tokens as far as it got, its input closed where it was cut); and whether there are whole
    calls."""
    if plan.chat.tool is None and plan.chat.format.reasoning is None:
        return [TextBlock(type="text", text=text)], False
    reader = plan.chat.read(text)
    cut = final is not None and final.finish_reason is FinishReason.LENGTH
    calls = reader.tool.reported("length" if cut else None) if reader.tool is not None else []
    blocks: list[ContentBlock] = []
    if reader.reasoning is not None:
        blocks.append(ThinkingBlock(type="thinking", thinking=reader.reasoning))
    if reader.text or not calls:
        blocks.append(TextBlock(type="text", text=reader.text))
    blocks += [ToolUseBlock(type="tool_use", id=_tool_use_id(c.id), name=c.name,
                            input=json.loads(c.arguments) if c.done else partial_object(c.arguments))
               for c in calls]
    return blocks, any(c.done for c in calls)


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
    blocks, calls = _blocks(plan, r.text, r.final)
    stop, sequence = _stop(plan, r.final, calls)
    return _message(plan, ctx, blocks, stop, sequence, _usage(r.final))


class _Blocks:
    """The stream's content blocks: opened as the parser's events arrive, one at a time, indexed in order."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" or "tool_use"

    def close(self) -> list[StreamEvent]:
        if self.open is None:
            return []
        self.open = None
        return [ContentBlockStopEvent(type="content_block_stop", index=self.index)]

    def start(self, block: ContentBlock) -> list[StreamEvent]:
        out = self.close()
        self.index += 1
        self.open = block.type
        out.append(ContentBlockStartEvent(type="content_block_start", index=self.index, content_block=block))
        return out

    def text(self, text: str) -> list[StreamEvent]:
        out = [] if self.open == "text" else self.start(TextBlock(type="text", text=""))
        out.append(ContentBlockDeltaEvent(type="content_block_delta", index=self.index,
                                          delta=TextDelta(type="text_delta", text=text)))
        return out

    def thinking(self, text: str) -> list[StreamEvent]:
        out = [] if self.open == "thinking" else self.start(ThinkingBlock(type="thinking", thinking=""))
        out.append(ContentBlockDeltaEvent(type="content_block_delta", index=self.index,
                                          delta=ThinkingDelta(type="thinking_delta", thinking=text)))
        return out

    def events(self, parsed: list[Event]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for ev in parsed:
            if isinstance(ev, ReasoningPiece):
                out += self.thinking(ev.text)
            elif isinstance(ev, TextPiece):
                out += self.text(ev.text)
            elif isinstance(ev, CallStart):
                out += self.start(ToolUseBlock(type="tool_use", id=_tool_use_id(ev.id), name=ev.name, input={}))
            elif isinstance(ev, ArgsPiece):
                out.append(ContentBlockDeltaEvent(type="content_block_delta", index=self.index, delta=InputJsonDelta(
                    type="input_json_delta", partial_json=ev.text)))
        return out


async def stream(model: ServedModel, plan: MessagesPlan, ctx: RequestContext) -> AsyncIterator[StreamEvent | None]:
    """Anthropic's events (the runs are already started): message_start; the content blocks as the output
    arrives (text deltas; a tool_use block per call, its input in input_json_delta pieces as generated); then
    message_delta with the stop reason and usage. The route's framing adds message_stop last, and turns `None`
    (nothing to send for a while) into a ping."""
    n_prompt = len(plan.chat.runs.requests[0].prompt_ids)
    start_usage = MessageUsage(input_tokens=n_prompt, output_tokens=0, cache_read_input_tokens=0,
                               cache_creation_input_tokens=0)
    yield MessageStartEvent(type="message_start", message=_message(plan, ctx, [], None, None, start_usage))
    parser = plan.chat.reader()
    blocks = _Blocks()
    if parser is None:
        for e in blocks.start(TextBlock(type="text", text="")):
            yield e
    else:
        for e in blocks.events(parser.start()):
            yield e
    final: RequestOutput | None = None
    async for ev in plan.chat.runs.events(HEARTBEAT_S):
        if ev is None:
            yield None
            continue
        _, out = ev
        err = finish_error(out) if out.finished else None
        if out.text:
            for e in blocks.text(out.text) if parser is None else blocks.events(parser.feed(out.text)):
                yield e
        if err is not None:
            raise err
        if out.finished:
            chat.check_constraint(plan.chat, 0)
            final = out
    if parser is not None:
        for e in blocks.events(parser.finish()):
            yield e
    if blocks.index < 0:  # nothing at all: one empty text block, as the whole answer has
        for e in blocks.start(TextBlock(type="text", text="")):
            yield e
    for e in blocks.close():
        yield e
    stop, sequence = _stop(plan, final, parser is not None and any(c.done for c in parser.calls))
    usage = _usage(final)
    yield MessageDeltaEvent(type="message_delta", delta=MessageDelta(stop_reason=stop, stop_sequence=sequence),
                            usage=DeltaUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                                             cache_read_input_tokens=usage.cache_read_input_tokens))
