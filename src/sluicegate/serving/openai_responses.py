"""`/v1/responses` as an adapter on the chat path: a Responses request becomes a chat completion request
(items -> messages, flat tools -> chat tools, `text.format` -> `response_format`), runs through
serving/openai_chat.py, and its answer or its stream of chunks is reshaped into Responses output items and
typed events.

The stored conversation (`previous_response_id`) is read and written by the caller (`Conversation`): this
layer sees items only. Items are kept as plain dicts, each with an id, in the order the model reads them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from sluicegate.protocol.openai_chat import ChatCompletionRequest
from sluicegate.protocol.openai_common import OpenAIUsage
from sluicegate.protocol.openai_responses import (
    FormatJsonObject,
    FormatJsonSchema,
    FunctionCallOut,
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputMessage,
    OutputTextPart,
    OutputTokensDetails,
    ReasoningOut,
    ReasoningOutPart,
    ResponseCreateRequest,
    ResponseObject,
    ResponseUsage,
    TextConfigOut,
)
from sluicegate.serving import openai_chat as chat
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel

Item = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(slots=True)
class Conversation:
    """What the caller gives this layer: the items before this request's input (from `previous_response_id`),
    and where the finished response goes (`save(response, items)`: whether it was stored; None: not stored)."""

    history: list[Item] = field(default_factory=list)
    save: Callable[[ResponseObject, list[Item]], Awaitable[bool]] | None = None


@dataclass(slots=True)
class ResponsesPlan:
    request: ResponseCreateRequest
    chat: chat.ChatPlan
    id: str
    items: list[Item]  # every input item the model read, history first

    @property
    def runs(self) -> Any:
        return self.chat.runs


def input_items(req: ResponseCreateRequest) -> list[Item]:
    """This request's input as items, each with an id (`msg_...` for messages, as OpenAI lists them)."""
    if isinstance(req.input, str):
        return [{"type": "message", "id": new_id("msg"), "role": "user",
                 "content": [{"type": "input_text", "text": req.input}]}]
    out: list[Item] = []
    for item in req.input:
        d = item.model_dump(exclude_none=True, by_alias=True)
        if d["type"] == "message" and isinstance(d["content"], str):
            kind = "output_text" if d["role"] == "assistant" else "input_text"
            d["content"] = [{"type": kind, "text": d["content"]}]
        if "id" not in d:
            d["id"] = new_id({"message": "msg", "function_call": "fc", "function_call_output": "fco",
                              "reasoning": "rs"}[d["type"]])
        out.append(d)
    return out


def _messages(instructions: str | None, items: list[Item]) -> list[dict[str, Any]]:
    """Items as chat messages: consecutive function calls join the assistant message before them."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item["type"]
        if kind == "message":
            messages.append({"role": item["role"], "content": "".join(p["text"] for p in item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]})
        # a reasoning item is left out: thinking models' templates drop earlier turns' reasoning too
    return messages


def to_chat(req: ResponseCreateRequest, items: list[Item]) -> ChatCompletionRequest:
    body: dict[str, Any] = {
        "model": req.model,
        "messages": _messages(req.instructions, items),
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
    }
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                         for t in req.tools]
    if req.tool_choice is not None:
        c = req.tool_choice
        body["tool_choice"] = c if isinstance(c, str) else {"type": "function", "function": {"name": c.name}}
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    fmt = req.text.format if req.text is not None else None
    if isinstance(fmt, FormatJsonSchema):
        js = fmt.model_dump(exclude_none=True, by_alias=True, exclude={"type"})
        body["response_format"] = {"type": "json_schema", "json_schema": js}
    elif isinstance(fmt, FormatJsonObject):
        body["response_format"] = {"type": "json_object"}
    for name in ("user", "safety_identifier"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError:
        raise ApiError("invalid_request", "the conversation cannot be served: more than 1024 messages, or a "
                       "message with more than 256 parts", param="input", code="conversation_too_long") from None


_RENAMES = (
    (re.compile(r"^messages\b.*"), "input"),
    (re.compile(r"^max_completion_tokens$"), "max_output_tokens"),
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"^tool_choice\.function\."), "tool_choice."),
    (re.compile(r"^response_format\.json_schema\."), "text.format."),
    (re.compile(r"^response_format$"), "text.format"),
)


def _renamed(exc: ApiError) -> ApiError:
    """A chat refusal in this surface's names (`messages` -> `input`, `max_completion_tokens` ->
    `max_output_tokens`, ...)."""
    param, message = exc.param, exc.message
    if param is None:
        return exc
    new = param
    for pattern, repl in _RENAMES:
        new = pattern.sub(repl, new)
    if new == param:
        return exc
    return dataclasses.replace(exc, param=new, message=message.replace(param, new))


async def prepare(
    model: ServedModel, req: ResponseCreateRequest, ctx: RequestContext, conversation: Conversation,
    admission: Admission = OPEN,
) -> ResponsesPlan:
    items = conversation.history + input_items(req)
    creq = to_chat(req, items)
    try:
        plan = await chat.prepare(model, creq, ctx, admission)
    except ApiError as exc:
        raise _renamed(exc) from None
    return ResponsesPlan(req, plan, new_id("resp"), items)


def _usage(u: OpenAIUsage | None) -> ResponseUsage | None:
    if u is None:
        return None
    return ResponseUsage(
        input_tokens=u.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=u.prompt_tokens_details.cached_tokens),
        output_tokens=u.completion_tokens,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=u.total_tokens,
    )


def response_object(
    plan: ResponsesPlan, ctx: RequestContext, output: list[OutputItem], *, status: str, usage: ResponseUsage | None
) -> ResponseObject:
    req = plan.request
    fmt = req.text.format if req.text is not None else None
    tool_choice: Any = req.tool_choice if req.tool_choice is not None else "auto"
    return ResponseObject(
        id=plan.id,
        created_at=ctx.created,
        status=status,  # type: ignore[arg-type]
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        model=plan.chat.model_ref,
        output=output,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        previous_response_id=req.previous_response_id,
        temperature=req.temperature,
        top_p=req.top_p,
        text=TextConfigOut(format={"type": "text"} if fmt is None else fmt.model_dump(by_alias=True,
                                                                                        exclude_none=True)),
        tool_choice=tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
        tools=[t.model_dump(exclude_none=True) for t in req.tools or ()],
        store=req.store,
        metadata=req.metadata or {},
        user=req.user,
        usage=usage,
    )


async def _finish(plan: ResponsesPlan, conversation: Conversation, response: ResponseObject) -> ResponseObject:
    """The response as answered: stored when asked, or, when storing failed after the work, delivered all the
    same with `store: false` (the answer is never thrown away, nor computed again by a retry)."""
    if conversation.save is not None and plan.request.store and not await conversation.save(response, plan.items):
        return response.model_copy(update={"store": False})
    return response


async def complete(
    model: ServedModel, plan: ResponsesPlan, ctx: RequestContext, conversation: Conversation
) -> ResponseObject:
    answer = await chat.complete(model, plan.chat, ctx)
    choice = answer.choices[0]
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    item_status: Literal["completed", "incomplete"] = "incomplete" if status == "incomplete" else "completed"
    output: list[OutputItem] = []
    msg = choice.message
    if msg.reasoning_content is not None:
        output.append(ReasoningOut(id=new_id("rs"), content=[ReasoningOutPart(text=msg.reasoning_content)],
                                   status="completed" if msg.content or msg.tool_calls else item_status))
    if msg.content or not msg.tool_calls:
        output.append(OutputMessage(id=new_id("msg"), status=item_status,
                                    content=[OutputTextPart(text=msg.content or "")]))
    calls = msg.tool_calls or []
    for k, call in enumerate(calls):  # a call cut by max_tokens is the last, as far as it got
        cut = status == "incomplete" and k == len(calls) - 1
        output.append(FunctionCallOut(id=new_id("fc"), call_id=call.id, name=call.function.name,
                                      arguments=call.function.arguments, status="incomplete" if cut else "completed"))
    response = response_object(plan, ctx, output, status=status, usage=_usage(answer.usage))
    return await _finish(plan, conversation, response)


class _Events:
    """The typed events of one streamed response, numbered in order (`sequence_number`)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return json.dumps(event, ensure_ascii=False, separators=(",", ":"))


def _chunk(item: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(item) if isinstance(item, str) else item.model_dump(exclude_unset=True)
    return out


def _item(d: Item) -> OutputItem:
    kinds: dict[str, type[OutputMessage | FunctionCallOut | ReasoningOut]] = {
        "message": OutputMessage, "function_call": FunctionCallOut, "reasoning": ReasoningOut}
    return kinds[d["type"]].model_validate(d)


async def stream(
    model: ServedModel, plan: ResponsesPlan, ctx: RequestContext, conversation: Conversation
) -> AsyncIterator[str | None]:
    """The typed events of a streamed response, from the chat stream's chunks: `response.created` and
    `response.in_progress`; per output item `response.output_item.added`, its text (`content_part.added`,
    `output_text.delta`..., `output_text.done`, `content_part.done`) or its call's arguments
    (`function_call_arguments.delta`..., `.done`), `response.output_item.done`; then `response.completed`
    (or `response.incomplete`) with the whole response. `None` is a heartbeat cue."""
    ev = _Events()
    output: list[Item] = []  # the output items so far, as dicts (the last one may be open)
    open_item: Item | None = None
    status = "completed"

    def snapshot(status: str, usage: ResponseUsage | None = None) -> ResponseObject:
        return response_object(plan, ctx, [_item(d) for d in output], status=status, usage=usage)

    def add(item: Item) -> list[str]:
        nonlocal open_item
        out = close()
        output.append(item)
        open_item = item
        i = len(output) - 1
        out.append(ev("response.output_item.added", output_index=i, item=dict(item, content=[])
                      if item["type"] in ("message", "reasoning") else dict(item)))
        if item["type"] == "message":
            out.append(ev("response.content_part.added", item_id=item["id"], output_index=i, content_index=0,
                          part=dict(item["content"][0])))
        return out

    def close() -> list[str]:
        nonlocal open_item
        item, open_item = open_item, None
        if item is None:
            return []
        i = len(output) - 1
        out: list[str] = []
        if item["type"] == "reasoning":
            item["status"] = "completed"
            out.append(ev("response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0,
                          text=item["content"][0]["text"]))
        elif item["type"] == "message":
            item["status"] = "incomplete" if status == "incomplete" else "completed"
            part = item["content"][0]
            out.append(ev("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                          text=part["text"], logprobs=[]))
            out.append(ev("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                          part=dict(part)))
        else:
            item["status"] = "incomplete" if status == "incomplete" else "completed"
            out.append(ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                          name=item["name"], arguments=item["arguments"]))
        out.append(ev("response.output_item.done", output_index=i, item=json.loads(json.dumps(item))))
        return out

    def message() -> Item:
        return {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}

    yield ev("response.created", response=snapshot("in_progress").model_dump(mode="json"))
    yield ev("response.in_progress", response=snapshot("in_progress").model_dump(mode="json"))
    usage: ResponseUsage | None = None
    async for chunk_item in chat.stream(model, plan.chat, ctx):
        if chunk_item is None:
            yield None
            continue
        chunk = _chunk(chunk_item)
        if chunk.get("usage"):
            usage = _usage(OpenAIUsage.model_validate(chunk["usage"]))
        for choice in chunk.get("choices", ()):
            delta = choice.get("delta", {})
            if thought := delta.get("reasoning_content"):
                if open_item is None or open_item["type"] != "reasoning":
                    for e in add({"type": "reasoning", "id": new_id("rs"), "summary": [], "status": "in_progress",
                                  "content": [{"type": "reasoning_text", "text": ""}]}):
                        yield e
                assert open_item is not None
                open_item["content"][0]["text"] += thought
                yield ev("response.reasoning_text.delta", item_id=open_item["id"], output_index=len(output) - 1,
                         content_index=0, delta=thought)
            piece = delta.get("content")
            if piece:
                if open_item is None or open_item["type"] != "message":
                    for e in add(message()):
                        yield e
                assert open_item is not None
                open_item["content"][0]["text"] += piece
                yield ev("response.output_text.delta", item_id=open_item["id"], output_index=len(output) - 1,
                         content_index=0, delta=piece, logprobs=[])
            for tc in delta.get("tool_calls") or ():
                fn = tc.get("function") or {}
                if tc.get("id"):
                    call = {"type": "function_call", "id": new_id("fc"), "call_id": tc["id"],
                            "name": fn.get("name") or "", "arguments": "", "status": "in_progress"}
                    for e in add(call):
                        yield e
                args = fn.get("arguments") or ""
                if args and open_item is not None and open_item["type"] == "function_call":
                    open_item["arguments"] += args
                    yield ev("response.function_call_arguments.delta", item_id=open_item["id"],
                             output_index=len(output) - 1, delta=args)
            if choice.get("finish_reason") == "length":
                status = "incomplete"
    if not output:  # an empty answer is still one (empty) message, as the whole answer has
        for e in add(message()):
            yield e
    for e in close():
        yield e
    response = await _finish(plan, conversation, snapshot(status, usage))
    kind = "response.completed" if status == "completed" else "response.incomplete"
    yield ev(kind, response=response.model_dump(mode="json"))
