"""`/v1/chat/completions`: validate -> render the template -> budget -> constrain -> submit -> shape.

Tool calls (docs/openai.md, docs/models.md; the grammar and the parser are serving/tool_calls.py, shared by every
surface, in the served model's own syntax: serving/tool_formats.py): `tool_choice` may be a named function (one
call to it, its arguments constrained to its `parameters`), `required` (calls to any of the tools), `auto` (the
default with tools: free text, and from the family's trigger on, calls constrained as `required`'s), or `none`
(tools are shown, text is generated). A thinking model's reasoning is read apart (`reasoning_content`;
serving/reasoning.py) before the answer's text and calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sluicegate.backends.base import Tokenizer
from sluicegate.engine import FinishReason
from sluicegate.protocol.openai_chat import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    DeltaFunction,
    DeltaToolCall,
    NamedToolChoice,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    ToolCallFunctionOut,
    ToolCallOut,
)
from sluicegate.protocol.openai_common import FinishReason as OpenAIFinish
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.chat_template import (
    ChatFormat,
    ChatPrompt,
    ToolMode,
    chat_format,
    message_text,
    render,
    template_for,
    template_messages,
    template_tools,
    tool_mode,
    tool_specs,
)
from sluicegate.serving.constraints import Grammar, GrammarConstraint, GrammarError, compile_json
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import Runs, check_tokens, collect_finished, default_new_tokens, start_runs
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel, check_text
from sluicegate.serving.openai_common import (
    TextDeltas,
    arrivals,
    chat_logprobs,
    fingerprint,
    openai_finish,
    record_user,
    sampling_params,
    usage,
)
from sluicegate.serving.output_reader import (
    ArgsPiece,
    CallStart,
    OutputReader,
    ReasoningPiece,
    read_whole,
    reader_for,
)
from sluicegate.serving.reasoning import opened
from sluicegate.serving.tool_calls import ToolCallParser, compile_tools, strict_problem
from sluicegate.serving.tool_formats import JSON_CALL
from sluicegate.serving.validation import refused


@dataclass(slots=True)
class ChatPlan:
    request: ChatCompletionRequest
    prompt_text: str
    runs: Runs
    tool: ToolMode | None
    format: ChatFormat
    model_ref: str = ""
    fingerprint: str = ""

    def reader(self) -> OutputReader | None:
        """A fresh reader of one output (None: plain text)."""
        tool = self.tool
        parser = None if tool is None else ToolCallParser(tool.mode, tool.name, self.format.tools)
        return reader_for(parser, self.format.reasoning, self.prompt_text)

    def read(self, text: str) -> OutputReader:
        """A whole output, read."""
        tool = self.tool
        parser = None if tool is None else ToolCallParser(tool.mode, tool.name, self.format.tools)
        return read_whole(parser, self.format.reasoning, self.prompt_text, text)


def _check_combinations(req: ChatCompletionRequest) -> None:
    if req.max_tokens is not None and req.max_completion_tokens is not None:
        raise refused("max_tokens", "give max_completion_tokens or max_tokens (its old name), not both")
    if req.stream_options is not None and not req.stream:
        raise refused("stream_options", "stream_options is only allowed when stream is true")
    if req.top_logprobs is not None and not req.logprobs:
        raise refused("top_logprobs", "top_logprobs needs logprobs: true")
    forced = tool_mode(req) is not None
    if req.tool_choice is not None and not req.tools:
        raise refused("tool_choice", "tool_choice needs tools")
    if isinstance(req.tool_choice, NamedToolChoice):
        names = [t.function.name for t in req.tools or ()]
        if req.tool_choice.function.name not in names:
            raise refused(
                "tool_choice.function.name",
                "tool_choice names a function that is not in tools",
                code="unknown_function",
            )
    if req.tools and len({t.function.name for t in req.tools}) != len(req.tools):
        raise refused("tools", "two tools have the same name", code="duplicate_function")
    for i, t in enumerate(req.tools or ()):
        if t.function.strict and t.function.parameters is not None and (why := strict_problem(t.function.parameters)):
            raise refused(f"tools[{i}].function.parameters", f"strict is true, but {why}",
                          code="invalid_strict_schema")
    structured = isinstance(req.response_format, ResponseFormatJsonObject | ResponseFormatJsonSchema)
    if forced and structured:
        raise refused("response_format", "response_format cannot be combined with tool calls (tools without "
                      "tool_choice 'none')")
    if req.stop and (forced or structured):
        raise refused(
            "stop", "stop cannot be combined with JSON output or tool calls (tools without tool_choice 'none'): "
            "it could cut the JSON"
        )
    if req.messages[-1].role == "assistant":
        raise refused(
            "messages",
            "the last message must not be the assistant's: continuing an assistant message is not supported",
            code="unsupported_value",
        )


def _grammar_param(req: ChatCompletionRequest, tool: ToolMode | None) -> str:
    """The param to blame when the output's grammar cannot be compiled."""
    if tool is not None and tool.mode == "named":
        return next(f"tools[{i}].function.parameters" for i, t in enumerate(req.tools or ())
                    if t.function.name == tool.name)
    if tool is not None:
        return "tools"
    if isinstance(req.response_format, ResponseFormatJsonSchema):
        return "response_format.json_schema.schema"
    return "response_format"


def _format(model: ServedModel) -> ChatFormat:
    """The model's chat format; an upstream engine's calls are bare JSON (a schema is all it can be given)."""
    fmt = chat_format(model)
    return dataclasses.replace(fmt, tools=JSON_CALL) if model.upstream else fmt


def _compile(runner: Tokenizer, req: ChatCompletionRequest, tool: ToolMode | None, chat: ChatFormat,
             prompt: str) -> Grammar | None:
    """The grammar the output is generated under (blocking), or None for free text."""
    if tool is not None:
        think = chat.reasoning.end if chat.reasoning is not None and opened(chat.reasoning, prompt) else None
        return compile_tools(runner, tool_specs(req), tool.mode, tool.name,
                             parallel=req.parallel_tool_calls is not False, fmt=chat.tools, think_end=think)
    fmt = req.response_format
    if isinstance(fmt, ResponseFormatJsonSchema):
        return compile_json(runner, fmt.json_schema.schema_)
    if isinstance(fmt, ResponseFormatJsonObject):
        return compile_json(runner, {"type": "object"})
    return None


async def prompt_of(model: ServedModel, req: ChatCompletionRequest) -> ChatPrompt:
    """The request's prompt: its messages (and tools) through the model's chat template, tokenised."""
    template = template_for(model, "model")
    fmt = _format(model)
    n_bytes = 0
    for i, msg in enumerate(req.messages):
        n_bytes += check_text(message_text(msg.content), f"messages[{i}].content")
    model.token_budget.check_prompt_bytes(n_bytes, param="messages")  # the contents alone are this many tokens
    return await render(model, template, template_messages(req, fmt), template_tools(req, fmt))


async def prepare(
    model: ServedModel, req: ChatCompletionRequest, ctx: RequestContext, admission: Admission = OPEN, *,
    top_k: int = 0,
) -> ChatPlan:
    """Check, render, budget, constrain, admit and start the runs. `top_k`: a sampling cut chat does not take
    (0: off), for the surfaces that render as chat and do (Anthropic's Messages)."""
    ident = model.resolve(req.model)
    _check_combinations(req)
    record_user(ctx.request_id, user=req.user, safety_identifier=req.safety_identifier)
    runner = model.runner
    t = time.perf_counter()
    prompt = await prompt_of(model, req)
    t = ctx.record.stage("tokenize", t)
    n_prompt = len(prompt.token_ids)
    requested = req.max_new_tokens
    new_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    check_tokens(model, n_prompt, requested or 1, prompt_param="messages", new_param=new_param)
    tool = tool_mode(req)
    grammar: Grammar | None = None
    if tool is not None or isinstance(req.response_format, ResponseFormatJsonObject | ResponseFormatJsonSchema):
        try:
            grammar = await asyncio.to_thread(_compile, runner, req, tool, _format(model), prompt.text)
        except GrammarError:
            param = _grammar_param(req, tool)
            raise ApiError(
                "invalid_request",
                f"{param} is not a JSON schema this server can enforce "
                "(see docs/openai.md for the supported subset)",
                param=param,
                code="unsupported_schema",
            ) from None
        ctx.record.stage("grammar", t)
    params = sampling_params(
        req, model.limits.n_vocab, max_new_tokens=requested or default_new_tokens(model, n_prompt),
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
    )
    if top_k:
        params = dataclasses.replace(params, top_k=top_k)
    runs = await start_runs(
        model, ctx, [prompt.token_ids], params, n=req.n, requested_new=requested, new_param=new_param,
        constraint=None if grammar is None else grammar.constraint, stream=req.stream, admission=admission,
    )
    return ChatPlan(req, prompt.text, runs, tool, _format(model), ident.ref, fingerprint(model))


def check_constraint(plan: ChatPlan, i: int) -> None:
    c = plan.runs.requests[i].constraint
    if isinstance(c, GrammarConstraint) and c.failed:
        raise ApiError("internal_error", "internal error; report the request id")


def tool_finish(reader: OutputReader | None, reason: FinishReason | None) -> OpenAIFinish:
    """`tool_calls` when the output ended after whole calls; a call cut short is `length`."""
    finish = openai_finish(reason)
    if finish == "stop" and reader is not None and reader.tool is not None and reader.tool.complete_calls():
        return "tool_calls"
    return finish


def _message(plan: ChatPlan, text: str, reason: FinishReason | None) -> tuple[ChatMessage, OpenAIFinish]:
    if plan.tool is None and plan.format.reasoning is None:
        return ChatMessage(content=text), openai_finish(reason)
    reader = plan.read(text)
    finish = tool_finish(reader, reason)
    calls = [
        ToolCallOut(id=c.id, function=ToolCallFunctionOut(name=c.name, arguments=c.arguments))
        for c in (reader.tool.reported(finish) if reader.tool is not None else ())
    ]
    content = reader.text
    return (
        ChatMessage(content=(content or None) if calls else content, tool_calls=calls or None,
                    reasoning_content=reader.reasoning),
        finish,
    )


async def complete(model: ServedModel, plan: ChatPlan, ctx: RequestContext) -> ChatCompletion:
    """Run to the end and return one response (the runs are already started)."""
    results = await collect_finished(plan.runs, ctx)
    choices: list[ChatChoice] = []
    for i, r in enumerate(results):
        assert r.final is not None
        check_constraint(plan, i)
        message, finish = _message(plan, r.text, r.final.finish_reason)
        lps = (
            ChoiceLogprobs(content=chat_logprobs(model.runner, r.logprobs)) if plan.request.logprobs else None
        )
        choices.append(ChatChoice(index=i, message=message, logprobs=lps, finish_reason=finish))
    return ChatCompletion(
        id=f"chatcmpl-{ctx.request_id}",
        created=ctx.created,
        model=plan.model_ref,
        system_fingerprint=plan.fingerprint,
        choices=choices,
        usage=usage([r.final for r in results]),
    )


@dataclass(frozen=True, slots=True)
class _Chunks:
    """Builds the chunks of one streamed answer."""

    id: str
    created: int
    model: str
    fingerprint: str
    include_usage: bool

    def __call__(self, choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        fields: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }
        if self.include_usage:
            fields["usage"] = None
        fields.update(extra)
        return ChatCompletionChunk(**fields)

    def one(
        self,
        i: int,
        delta: ChoiceDelta,
        finish: OpenAIFinish | None = None,
        lps: ChoiceLogprobs | None = None,
    ) -> ChatCompletionChunk:
        return self([ChunkChoice(index=i, delta=delta, logprobs=lps, finish_reason=finish)])


def _tool_deltas(events: list[Any]) -> list[ChoiceDelta]:
    """The deltas of a run of reader events: reasoning, content and argument pieces merge; each call's start
    (index, id, name, empty arguments) is a delta of its own, as OpenAI sends it."""
    deltas: list[ChoiceDelta] = []
    content = thought = ""
    calls: list[DeltaToolCall] = []

    def flush() -> None:
        nonlocal content, calls, thought
        if thought:
            deltas.append(ChoiceDelta(reasoning_content=thought))
        if content or calls:
            deltas.append(ChoiceDelta(content=content or None, tool_calls=calls or None))
        content, calls, thought = "", [], ""

    for e in events:
        if isinstance(e, ReasoningPiece):
            if content or calls:
                flush()
            thought += e.text
            continue
        if isinstance(e, CallStart):
            flush()
            start = DeltaToolCall(index=e.index, id=e.id, type="function",
                                  function=DeltaFunction(name=e.name, arguments=""))
            deltas.append(ChoiceDelta(tool_calls=[start]))
        elif isinstance(e, ArgsPiece):
            if calls and calls[-1].index == e.index:
                joined = calls[-1].function.arguments + e.text
                calls[-1] = DeltaToolCall(index=e.index, function=DeltaFunction(arguments=joined))
            else:
                calls.append(DeltaToolCall(index=e.index, function=DeltaFunction(arguments=e.text)))
        else:
            content += e.text
    flush()
    return deltas


async def stream(
    model: ServedModel, plan: ChatPlan, ctx: RequestContext
) -> AsyncIterator[ChatCompletionChunk | str | None]:
    """The chunks of a streamed answer (the runs are already started), a model or its JSON already
    serialised (a plain text delta: `TextDeltas`). Errors raise ApiError mid-stream; `None` is a heartbeat
    cue (nothing to send for a while).

    Every choice first gets its role (and, for a named tool, the call's id and name); then text deltas as the
    engine releases them, or, in a tool mode, what the tool-call parser makes of them: content, each call's
    index, id and name once its name is written, then its arguments in pieces (OpenAI's deltas); then an
    empty delta with the finish reason. Usage comes last, once.
    """
    req = plan.request
    chunks = _Chunks(
        f"chatcmpl-{ctx.request_id}",
        ctx.created,
        plan.model_ref,
        plan.fingerprint,
        bool(req.stream_options and req.stream_options.include_usage),
    )
    texts = TextDeltas(lambda i, text: chunks.one(i, ChoiceDelta(content=text)))
    readers = [r for r in (plan.reader() for _ in range(req.n)) if r is not None]
    finals: list[Any] = [None] * req.n
    for i in range(req.n):
        first = _tool_deltas(readers[i].start()) if readers else []
        if first:
            yield chunks.one(i, first[0].model_copy(update={"role": "assistant"}))
        elif plan.tool is not None:  # no content yet: a message that turns out to be calls only has none (null)
            yield chunks.one(i, ChoiceDelta(role="assistant"))
        else:
            yield chunks.one(i, ChoiceDelta(role="assistant", content=""))
    async for ev in arrivals(plan.runs, finals, lambda i: check_constraint(plan, i)):
        if ev is None:
            yield None
            continue
        i, out, err = ev
        lps = ChoiceLogprobs(content=chat_logprobs(model.runner, out.logprobs)) if req.logprobs else None
        if readers:
            events = readers[i].feed(out.text) if out.text else []
            if out.finished and err is None:
                events += readers[i].finish()
            deltas = _tool_deltas(events)
            if lps is not None and lps.content:  # the logprobs ride on the last delta of their text
                deltas = deltas or [ChoiceDelta()]
            for k, delta in enumerate(deltas):
                yield chunks.one(i, delta, lps=lps if k == len(deltas) - 1 else None)
        elif out.text or (lps is not None and lps.content):
            yield texts(i, out.text) if lps is None else chunks.one(i, ChoiceDelta(content=out.text), lps=lps)
        if err is not None:  # after the text it came with: a merged last delta loses nothing
            raise err
        if out.finished:
            finish: OpenAIFinish = (
                tool_finish(readers[i], out.finish_reason) if readers else openai_finish(out.finish_reason)
            )
            yield chunks.one(i, ChoiceDelta(), finish)
    if chunks.include_usage:
        yield chunks([], usage=usage(finals))
