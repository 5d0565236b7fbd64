"""The model's own chat template (Jinja, from the GGUF), rendered in a sandbox, then tokenised safely.

The environment matches Hugging Face's `apply_chat_template`: `ImmutableSandboxedEnvironment` with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` tag that renders its
body, `tojson` with `ensure_ascii=False`, and the globals `raise_exception` and `strftime_now`. The template
comes from the model file, the messages from the client: the sandbox keeps a hostile template or message from
reaching Python internals, and `raise_exception` becomes a 400 that quotes the template's own message.

Tokenising: the text a client wrote is never parsed for special tokens. The template is rendered a second
time with every message's content wrapped in per-request random markers; the pieces between markers are the
client's text (tokenised with `parse_special=False`), the rest is the template's (`parse_special=True`). A
user who types `<|im_end|>` gets those characters, not the control token. If the template transforms content
(so the marked rendering does not match the plain one) the whole text is tokenised with special parsing, as
llama.cpp's server and Hugging Face do; `ChatPrompt.split` says which happened.

Ordering rule (docs/openai.md): the template renders the conversation as sent, shared text first; whatever
this server adds per request (a tool list, the call instruction) is appended to the *last* message, so a
conversation's earlier turns stay a byte-identical prefix that the prefix cache can reuse.

A request's messages reach the template through `template_messages` (chat completions, and the surfaces that
render as chat; tokenize counts the same messages) and become a tokenised prompt through `render` (predictions
render their `input.messages` here too), so every surface's prompt is the one chat completions would run.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sluicegate.backends.base import ModelRunner
from sluicegate.protocol.openai_chat import (
    AssistantMessage,
    ChatCompletionRequest,
    Content,
    NamedToolChoice,
    ToolMessage,
)
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel, check_text
from sluicegate.serving.tool_calls import TRIGGER, Mode, ToolSpec, instructions


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
        variables = meta.find_undeclared_variables(env.parse(source))
        self.uses_tools = "tools" in variables
        self._bos, self._eos = bos_token, eos_token

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


def tokenize_prompt(runner: ModelRunner, plain: str, pieces: list[tuple[str, bool]] | None) -> ChatPrompt:
    """Token ids for a rendered prompt; a BOS is added when the model adds one and the template did not."""
    bos = runner.tokenize("", add_special=True, parse_special=False)
    ids: list[int] = []
    if pieces is None:
        ids = runner.tokenize(plain, add_special=False, parse_special=True)
    else:
        for text, client in pieces:
            ids += runner.tokenize(text, add_special=False, parse_special=not client)
    if bos and ids[: len(bos)] != bos:
        ids = bos + ids
    return ChatPrompt(plain, ids, pieces is not None)


def template_for(runner: ModelRunner) -> ChatTemplate | None:
    """The runner's template, compiled once (None: the model ships none)."""
    if runner in _CACHE:
        return _CACHE[runner]
    source = runner.chat_template
    tmpl = None
    if source:
        limits = runner.limits
        bos = runner.token_text(limits.bos_id) if limits.bos_id is not None else ""
        eos_texts = [runner.token_text(i) for i in sorted(limits.eos_ids)]
        eos = next((t for t in eos_texts if t and t in source), eos_texts[0] if eos_texts else "")
        tmpl = ChatTemplate(source, bos_token=bos, eos_token=eos)
    _CACHE[runner] = tmpl
    return tmpl


_CACHE: weakref.WeakKeyDictionary[ModelRunner, ChatTemplate | None] = weakref.WeakKeyDictionary()


# A request's messages and tools as the template reads them, and their rendering into a prompt.


@dataclass(frozen=True, slots=True)
class ToolMode:
    """How output becomes tool calls (serving/tool_calls.py): `named` (the output is `name`'s arguments),
    `required` (one {name, arguments} object) or `auto` (text, then calls after the trigger)."""

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
    return [ToolSpec(t.function.name, t.function.description, t.function.parameters) for t in req.tools or ()]


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


def _tool_instructions(req: ChatCompletionRequest, template: ChatTemplate | None, native: bool) -> str:
    """What this request adds to the prompt about tools (appended to the last message)."""
    if not req.tools:
        return ""
    mode = tool_mode(req)
    teaches = template is not None and native and TRIGGER in template.source
    return instructions(tool_specs(req), "none" if mode is None else mode.mode,
                        None if mode is None else mode.name, listed=native, template_syntax=teaches)


def template_messages(
    req: ChatCompletionRequest, native_tools: bool, template: ChatTemplate | None = None
) -> list[dict[str, Any]]:
    """The request's messages as the template reads them; per-request text is appended to the last one."""
    out: list[dict[str, Any]] = []
    for msg in req.messages:
        role = "system" if msg.role == "developer" else msg.role
        text = message_text(msg.content)
        item: dict[str, Any] = {"role": role, "content": text}
        if isinstance(msg, AssistantMessage) and msg.tool_calls:
            if native_tools:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": _arguments_value(c.function.arguments),
                        },
                    }
                    for c in msg.tool_calls
                ]
            else:  # as `auto` writes them, so a conversation shows the model the syntax it uses
                calls = "\n".join(
                    TRIGGER + json.dumps(
                        {"name": c.function.name, "arguments": _arguments_value(c.function.arguments)},
                        ensure_ascii=False,
                    ) + "</tool_call>"
                    for c in msg.tool_calls
                )
                item["content"] = f"{text}\n{calls}" if text else calls
        if isinstance(msg, ToolMessage) and native_tools:
            item["tool_call_id"] = msg.tool_call_id
        out.append(item)
    extra = _tool_instructions(req, template, native_tools)
    if extra:
        last = out[-1]
        last["content"] = f"{last['content']}\n\n{extra}" if last["content"] else extra
    return out


async def render(
    model: ServedModel,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    param: str = "messages",
) -> ChatPrompt:
    """The template's prompt for these messages, tokenised (client text never parsed for control tokens);
    its refusal is a 422 naming `param`. Predictions render their `input.messages` here too."""

    def work() -> ChatPrompt:
        plain, pieces = template.segments(messages, tools=tools)
        check_text(plain, param)
        return tokenize_prompt(model.runner, plain, pieces)

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
