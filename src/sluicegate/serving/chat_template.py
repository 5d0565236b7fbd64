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
"""

from __future__ import annotations

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
