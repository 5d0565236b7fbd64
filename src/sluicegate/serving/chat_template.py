"""The model's chat template (Jinja, from the GGUF or `--chat-template-file`), rendered in a sandbox, then
tokenised exactly as the model's reference does.

The environment matches Hugging Face's `apply_chat_template`: `ImmutableSandboxedEnvironment` with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` tag that renders its
body, `tojson` with `ensure_ascii=False`, and the globals `raise_exception` and `strftime_now`. The template
comes from the operator, the messages from the client: the sandbox keeps a hostile template or message from
reaching Python internals, and `raise_exception` becomes a 400 that quotes the template's own message.

Tokenising (`tokenize_prompt`): the whole rendered text with control tokens parsed, as Hugging Face and
llama-server do, so the prompt tokens are exactly the ones the model was trained on: tokenising the client's
text apart from the template's would split tokens at the seams (Gemma: a system prompt ending in `\n` before
the template's `\n\n` is [107, 108] where the model saw [109]). The one exception keeps a client from writing
control tokens: the template is rendered a second time with every message's content wrapped in per-request
random markers, which locate the client's text; a control token's written form found there (`<|im_end|>`
typed by a user) is tokenised as text, alone, and the rest as before. If the template transforms content (so the
marked rendering does not match the plain one) the whole text is tokenised with special parsing.

What a template cannot render itself (probed once per template, as minja does for llama-server: a system role,
tools, earlier calls, tool results) is written for it by `template_messages`: the tool list and the family's
call syntax in the system message, earlier calls in the family's syntax, tool results as a user turn. The tools
go first, not last: a conversation's earlier turns stay a byte-identical prefix that the prefix cache reuses, and
an agent's final answer is not written right after a call instruction it would repeat.

A request's messages reach the template through `template_messages` (chat completions, and the surfaces that
render as chat; tokenize counts the same messages) and become a tokenised prompt through `render` (predictions
render their `input.messages` here too), so every surface's prompt is the one chat completions would run.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sluicegate.protocol.openai_chat import (
    AssistantMessage,
    ChatCompletionRequest,
    Content,
    NamedToolChoice,
    ToolMessage,
)
from sluicegate.serving import reasoning, tool_formats
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel, check_text
from sluicegate.serving.reasoning import Reasoning
from sluicegate.serving.tool_calls import Mode, ToolSpec
from sluicegate.serving.tool_calls import instructions as tool_instructions
from sluicegate.serving.tool_formats import ToolFormat


class TemplateRenderError(Exception):
    """The template refused these messages (its `raise_exception`) or failed on them."""


def _raise_exception(message: str) -> None:
    raise TemplateRenderError(str(message)[:300])


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _GenerationTag(Extension):
    """Hugging Face's `{% generation %}...{% endgeneration %}` (marks text for training): a no-op."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    text: str  # the rendered prompt, exactly what the model reads
    token_ids: list[int]
    split: bool  # True: client text was tokenised without special-token parsing


class ChatTemplate:
    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[loopcontrols, _GenerationTag],
            undefined=jinja2.Undefined,
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: now().strftime(str(fmt))
        self.source = source
        self._template = env.from_string(source)
        self._variables = meta.find_undeclared_variables(env.parse(source))
        self._bos, self._eos = bos_token, eos_token
        self._now = now

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        context: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._bos,
            "eos_token": self._eos,
        }
        if tools is not None:
            context["tools"] = tools
        if "functions" in self._variables:  # Firefunction's names for the tools and the date (as llama.cpp gives)
            context["functions"] = json.dumps(tools or [], ensure_ascii=False, indent=2)
        if "datetime" in self._variables:
            context["datetime"] = self._now().strftime("%b %d %Y %H:%M:%S GMT")
        try:
            return self._template.render(**context)
        except TemplateRenderError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateRenderError(f"the chat template failed: {type(exc).__name__}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise TemplateRenderError(
                f"the chat template cannot render these messages ({type(exc).__name__})"
            ) from None

    def segments_merging(
        self, messages: Sequence[dict[str, Any]], **kw: Any
    ) -> tuple[str, list[tuple[str, bool]] | None]:
        """`segments`; if the template refuses, once more with consecutive user turns merged (`merge_runs`)."""
        try:
            return self.segments(messages, **kw)
        except TemplateRenderError:
            merged = merge_runs(list(messages))
            if len(merged) == len(messages):
                raise
            return self.segments(merged, **kw)

    def segments(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> tuple[str, list[tuple[str, bool]] | None]:
        """The plain rendering, and its pieces as (text, is_client_text); or None."""
        plain = self.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        nonce = secrets.token_hex(8)
        start, end = f"\ufdd0{nonce}\ufdd1", f"\ufdd1{nonce}\ufdd0"
        wrapped = [
            {**m, "content": start + m["content"] + end}
            if isinstance(m.get("content"), str) and m["content"]
            else m
            for m in messages
        ]
        try:
            marked = self.render(wrapped, tools=tools, add_generation_prompt=add_generation_prompt)
        except TemplateRenderError:
            return plain, None
        pieces: list[tuple[str, bool]] = []
        pos = 0
        while (i := marked.find(start, pos)) >= 0:
            j = marked.find(end, i)
            if j < 0:
                return plain, None
            pieces += [(marked[pos:i], False), (marked[i + len(start) : j], True)]
            pos = j + len(end)
        pieces.append((marked[pos:], False))
        if "".join(t for t, _ in pieces) != plain:
            return plain, None
        return plain, [(t, c) for t, c in pieces if t]


# -- what a template can do (probed once, as minja does for llama-server) -----------------------------------

_TOOL = {"type": "function", "function": {"name": "some_tool_xyz", "description": "A tool.", "parameters": {
    "type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}}}
_CALL_ID = "call12345"  # nine letters and digits: Mistral's templates refuse any other id


def _call(arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": _CALL_ID, "type": "function", "function": {"name": "ipython_xyz", "arguments": arguments}}]}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a template renders itself; the rest is written for it (`template_messages`)."""

    system: bool = True  # a system message
    tools: bool = False  # the `tools` list
    tool_calls: bool = False  # an assistant message's `tool_calls`
    tool_responses: bool = False  # a `tool` message after a call
    string_arguments: bool = False  # calls' arguments as the JSON text (not as an object)

    @classmethod
    def probe(cls, template: ChatTemplate) -> Capabilities:
        def shows(needle: str, messages: list[dict[str, Any]], **kw: Any) -> bool:
            try:
                return needle in template.render(messages, add_generation_prompt=False, **kw)
            except TemplateRenderError:
                return False

        user = {"role": "user", "content": "Hey"}
        args = {"code": "print('Hello, World!')"}
        objects = shows("ipython_xyz", [user, _call(args)]) and shows("Hello, World", [user, _call(args)])
        strings = not objects and shows("ipython_xyz", [user, _call(json.dumps(args))])
        call = _call(json.dumps(args) if strings else args)
        result = {"role": "tool", "content": "Some response!", "tool_call_id": _CALL_ID, "name": "ipython_xyz"}
        return cls(
            system=shows("System Needle", [{"role": "system", "content": "System Needle"}, user]),
            tools=shows("some_tool_xyz", [user], tools=[_TOOL]),
            tool_calls=objects or strings,
            tool_responses=shows("Some response!", [user, call, result]),
            string_arguments=strings,
        )


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """How one served model reads a conversation: its template (None: it has none), what the template renders
    itself, its tool-call syntax and its reasoning markers (computed once per model: `chat_format`)."""

    template: ChatTemplate | None
    caps: Capabilities
    tools: ToolFormat
    reasoning: Reasoning | None
    source: str = "model"  # where the template came from: "model" (the GGUF) or "file" (--chat-template-file)


def build_format(source: str | None, *, bos: str = "", eos: str = "", reasoning_format: str = "auto",
                 origin: str = "model") -> ChatFormat:
    """A template's chat format (`source` None: no template)."""
    template = None if not source else ChatTemplate(source, bos_token=bos, eos_token=eos)
    return ChatFormat(
        template,
        Capabilities.probe(template) if template is not None else Capabilities(),
        tool_formats.detect(source),
        reasoning.detect(source, "none" if reasoning_format == "none" else "auto"),
        origin,
    )


def chat_format(model: ServedModel) -> ChatFormat:
    """The served model's chat format, built on first use and kept on the model."""
    found = model.chat_cache
    if isinstance(found, ChatFormat):
        return found
    runner = model.runner
    source = model.chat_template_source or runner.chat_template
    bos = eos = ""
    if source:
        limits = runner.limits
        bos = runner.token_text(limits.bos_id) if limits.bos_id is not None else ""
        eos_texts = [runner.token_text(i) for i in sorted(limits.eos_ids)]
        eos = next((t for t in eos_texts if t and t in source), eos_texts[0] if eos_texts else "")
    fmt = build_format(source, bos=bos, eos=eos, reasoning_format=model.reasoning_format,
                       origin="file" if model.chat_template_source else "model")
    model.chat_cache = fmt
    return fmt


def template_for(model: ServedModel, param: str = "messages") -> ChatTemplate:
    """The model's template, or the 400 that says it has none and how to give it one."""
    template = chat_format(model).template
    if template is None:
        raise ApiError(
            "invalid_request",
            "this model ships no chat template, so it cannot take messages: the operator can give it one "
            "(--chat-template-file), or send a prompt to /v1/completions",
            param=param,
            code="no_chat_template",
        )
    return template


# -- tokenising ------------------------------------------------------------------------------------------


def tokenize_prompt(model: ServedModel, plain: str, pieces: list[tuple[str, bool]] | None) -> ChatPrompt:
    """Token ids for a rendered prompt, exactly the model's reference (the whole text with control tokens parsed,
    as Hugging Face and llama-server tokenise it) unless the client's text holds a control token's written form:
    then that string alone is tokenised as text. A BOS is added when the model adds one and the template did
    not."""
    runner = model.runner
    bos = runner.tokenize("", add_special=True, parse_special=False)
    segments = _segments(plain, pieces, model.control_pattern())
    ids: list[int] = []
    for text, special in segments:
        ids += runner.tokenize(text, add_special=False, parse_special=special)
    if bos and ids[: len(bos)] != bos:
        ids = bos + ids
    return ChatPrompt(plain, ids, len(segments) > 1)


def _segments(plain: str, pieces: list[tuple[str, bool]] | None,
              control: re.Pattern[str] | None) -> list[tuple[str, bool]]:
    """The prompt as (text, parse control tokens) runs: one run unless client text holds control-token text."""
    if pieces is None or control is None:
        return [(plain, True)]
    out: list[tuple[str, bool]] = []
    run = ""
    for text, client in pieces:
        pos = 0
        if client:
            for m in control.finditer(text):
                run += text[pos:m.start()]
                if run:
                    out.append((run, True))
                out.append((m.group(0), False))
                run, pos = "", m.end()
        run += text[pos:]
    if run or not out:
        out.append((run, True))
    return out


# A request's messages and tools as the template reads them, and their rendering into a prompt.


@dataclass(frozen=True, slots=True)
class ToolMode:
    """How output becomes tool calls (serving/tool_calls.py): `named` (one call to `name`), `required` (calls
    to any tool) or `auto` (text, then calls after the format's trigger)."""

    mode: Mode
    name: str | None = None


def message_text(content: Content | None) -> str:
    """A message's content as one string (its text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content)


def _arguments_value(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def tool_specs(req: ChatCompletionRequest) -> list[ToolSpec]:
    return [ToolSpec(t.function.name, t.function.description, t.function.parameters, bool(t.function.strict))
            for t in req.tools or ()]


def _choice(req: ChatCompletionRequest) -> str | NamedToolChoice | None:
    """The request's tool choice; with tools and none given, `auto` (OpenAI's default)."""
    if req.tool_choice is None and req.tools:
        return "auto"
    return req.tool_choice


def tool_mode(req: ChatCompletionRequest) -> ToolMode | None:
    choice = _choice(req)
    if isinstance(choice, NamedToolChoice):
        return ToolMode("named", choice.function.name)
    if choice in ("required", "auto"):
        return ToolMode("required" if choice == "required" else "auto")
    return None


def template_messages(req: ChatCompletionRequest, fmt: ChatFormat) -> list[dict[str, Any]]:
    """The request's messages as the template reads them; what it cannot render itself is written for it: the
    tools and their syntax in the system message, earlier calls in the family's own syntax (a conversation shows
    the model the syntax it is to use), tool results as a user turn holding `{"tool_response": ...}` JSON and a
    system message folded into the next user turn (both as llama-server's polyfills, minja, write them)."""
    caps = fmt.caps
    out: list[dict[str, Any]] = []
    for msg in req.messages:
        role = "system" if msg.role == "developer" else msg.role
        item: dict[str, Any] = {"role": role, "content": message_text(msg.content)}
        if isinstance(msg, AssistantMessage) and msg.tool_calls:
            if caps.tool_calls:
                item["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {
                        "name": c.function.name,
                        "arguments": c.function.arguments if caps.string_arguments
                        else _arguments_value(c.function.arguments)}}
                    for c in msg.tool_calls
                ]
            else:  # in the family's own syntax: the conversation shows the model the syntax it is to use
                calls = fmt.tools.render([(c.function.name, _arguments_value(c.function.arguments))
                                          for c in msg.tool_calls])
                item["content"] = f"{item['content']}\n{calls}" if item["content"] else calls
        if isinstance(msg, ToolMessage):
            if caps.tool_responses:
                item["tool_call_id"] = msg.tool_call_id
            else:
                response = {"content": item["content"], "tool_call_id": msg.tool_call_id}
                item = {"role": "user",
                        "content": json.dumps({"tool_response": response}, ensure_ascii=False, indent=2)}
        out.append(item)
    if req.tools and not caps.tools:
        _system_note(out, tool_instructions(fmt.tools, tool_specs(req)))
    if not caps.system:
        out = _fold_system(out)
    return out


def _system_note(messages: list[dict[str, Any]], note: str) -> None:
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        first["content"] = f"{first['content']}\n\n{note}" if first["content"] else note
    else:
        messages.insert(0, {"role": "system", "content": note})


def _fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A template without a system role: system text opens the next user turn, or is a user turn of its own
    before any other role (minja's polyfill)."""
    out: list[dict[str, Any]] = []
    pending = ""
    for m in messages:
        if m["role"] == "system":
            pending = f"{pending}\n{m['content']}" if pending else m["content"]
            continue
        if pending and m["role"] == "user":
            m = {**m, "content": f"{pending}\n{m['content']}"}
        elif pending:
            out.append({"role": "user", "content": pending})
        pending = ""
        out.append(m)
    if pending:
        out.append({"role": "user", "content": pending})
    return out


def merge_runs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two user turns in a row become one (tool results written as user turns, for a template that requires
    turns to alternate and refused them: Gemma)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if out and m["role"] == "user" == out[-1]["role"] and set(m) == set(out[-1]) == {"role", "content"}:
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{m['content']}"}
        else:
            out.append(m)
    return out


def template_tools(req: ChatCompletionRequest, fmt: ChatFormat) -> list[dict[str, Any]] | None:
    """The tools as the template reads them (None: it does not render tools; they are in the system message)."""
    if not req.tools or not fmt.caps.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


async def render(
    model: ServedModel,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    param: str = "messages",
    add_generation_prompt: bool = True,
) -> ChatPrompt:
    """The template's prompt for these messages, tokenised (client text never parsed for control tokens);
    its refusal is a 422 naming `param`. Predictions render their `input.messages` here too."""

    def work() -> ChatPrompt:
        plain, pieces = template.segments_merging(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        check_text(plain, param)
        return tokenize_prompt(model, plain, pieces)

    try:
        if sum(len(m["content"]) for m in messages) > 16_384:
            return await asyncio.to_thread(work)
        return work()
    except TemplateRenderError as exc:
        raise ApiError(
            "invalid_request",
            f"the model's chat template refused these messages: {exc}",
            param=param,
            code="template_error",
        ) from None


MAX_TEMPLATE_BYTES = 1 << 20


def read_chat_template(path: Path) -> str:
    """An operator's template file (`--chat-template-file`), checked: readable UTF-8 Jinja of at most 1 MiB
    that compiles (ValueError says what is wrong, OSError that it cannot be read)."""
    with path.open("rb") as f:
        data = f.read(MAX_TEMPLATE_BYTES + 1)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"the chat template file is larger than {MAX_TEMPLATE_BYTES} bytes")
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the chat template file is not UTF-8 text") from None
    try:
        ChatTemplate(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"the chat template does not compile: {exc.message} (line {exc.lineno})") from None
    return source
