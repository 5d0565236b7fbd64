"""Tool calls for any surface: the grammar a call is generated under, and the one parser of the output.

Three modes (docs/openai.md, "Tool calls"):
- `named`: the whole output is the named function's arguments (constrained to its `parameters`);
- `required`: the whole output is one `{"name": <a tool>, "arguments": <its parameters>}` object;
- `auto`: the model writes freely; the moment its text contains the trigger `<tool_call>` the rest is
  constrained to `{"name": ..., "arguments": ...}` followed by `</tool_call>` (Hermes' syntax, the one most
  open chat templates use), then, when parallel calls are allowed, optionally another call, then the end.
  This is llama.cpp's "lazy grammar" done in llguidance: the free text is a lazy lexeme that ends at the first
  trigger, so a call is always valid and free text can never contain a trigger that is not a call.

The parser reads the text as it arrives (a stream) or whole (one response) and gives the same events either
way: content text (held back while it could be the start of a trigger, and without the whitespace just before
a call), then per call its start (index, id, name) and its arguments in pieces, exactly as the model wrote
them (the grammar makes them compact JSON). A call the model did not finish (max_tokens) is reported by
`cut`, and a whole response leaves it out: never a half call.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance as llg

from sluicegate.backends.base import ModelRunner
from sluicegate.serving.constraints import JSON_OPTIONS, Grammar, GrammarError, compile_json

TRIGGER = "<tool_call>"
END = "</tool_call>"
Mode = Literal["named", "required", "auto"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function a request offers (surface-neutral)."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None

    @property
    def schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else {"type": "object"}


def call_schema(tools: list[ToolSpec]) -> dict[str, Any]:
    """The JSON schema of one call: `{"name": <one of tools>, "arguments": <its parameters>}`, in that order."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


def auto_lark(tools: list[ToolSpec], parallel: bool) -> str:
    """The llguidance grammar of `auto`: free text, or text then one call (or several, when `parallel`)."""
    schema = json.dumps({"x-guidance": JSON_OPTIONS, **call_schema(tools)}, ensure_ascii=False)
    more = ' ("\\n"? "<tool_call>" call)*' if parallel else ""
    return (
        "%llguidance {}\n"
        f"start: TEXT | head call{more}\n"
        "TEXT: /(.|\\n)*/\n"
        f'head[lazy]: TEXT "{TRIGGER}"\n'
        f'call: "\\n"? %json {schema} "\\n"? "{END}"\n'
    )


class AutoGrammar(Grammar):
    """`auto`'s grammar: there is no JSON schema to hand an upstream engine, so it is refused there by name."""

    refusal_param = "tool_choice"


def compile_auto(runner: ModelRunner, tools: list[ToolSpec], parallel: bool) -> Grammar:
    """Compile `auto`'s grammar for `runner` (blocking: call off the event loop)."""
    try:
        grammar = llg.LLMatcher.grammar_from_lark(auto_lark(tools, parallel))
    except (ValueError, TypeError) as exc:
        raise GrammarError(str(exc)) from None
    return AutoGrammar(runner, grammar)


def compile_tools(runner: ModelRunner, tools: list[ToolSpec], mode: Mode, name: str | None = None, *,
                  parallel: bool = True) -> Grammar:
    """The grammar of a tool mode (blocking: call off the event loop); GrammarError names no parameter, the
    surface does (a named function's schema, or the tool list)."""
    if mode == "auto":
        return compile_auto(runner, tools, parallel)
    if mode == "named":
        return compile_json(runner, next(t.schema for t in tools if t.name == name))
    return compile_json(runner, call_schema(tools))


def instructions(tools: list[ToolSpec], mode: Mode | Literal["none"], name: str | None, *,
                 listed: bool, template_syntax: bool) -> str:
    """What a request adds to the prompt about its tools. `listed`: the template already shows the tools;
    `template_syntax`: the template already teaches the `<tool_call>` syntax."""
    lines: list[str] = []
    if not listed:
        lines.append("You can call these functions (their arguments are described by JSON Schema):")
        for t in tools:
            spec: dict[str, Any] = {"name": t.name}
            if t.description:
                spec["description"] = t.description
            spec["parameters"] = t.schema
            lines.append(json.dumps(spec, ensure_ascii=False))
    if mode == "named":
        lines.append(f"Call the function {name} now: reply with only its arguments, as a JSON object.")
    elif mode == "required":
        lines.append('Call one of these functions now: reply with only {"name": <function name>, '
                     '"arguments": <its arguments>}, as JSON.')
    elif mode == "auto":
        if not template_syntax:
            lines.append(f'To call a function, write {TRIGGER}{{"name": <function name>, "arguments": <its '
                         f'arguments>}}{END}; otherwise answer in text.')
    else:
        lines.append("Do not call a function now; reply in text.")
    return "\n".join(lines)


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


# -- the parser --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgsPiece:
    index: int
    text: str


Event = TextPiece | CallStart | ArgsPiece


@dataclass(slots=True)
class ParsedCall:
    id: str
    name: str
    arguments: str = ""
    done: bool = False


_HEAD = re.compile(r'\s*\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')
_WS = " \t\r\n"


def _held(buf: str) -> int:
    """How many characters at the end of `buf` could still become a trigger, or the whitespace before one."""
    k = next((k for k in range(min(len(TRIGGER) - 1, len(buf)), 0, -1) if TRIGGER.startswith(buf[-k:])), 0)
    rest = buf[: len(buf) - k]
    return k + len(rest) - len(rest.rstrip(_WS))


@dataclass(slots=True)
class _Value:
    """Finds where a JSON value ends, a character at a time (the text is valid JSON: the grammar made it)."""

    depth: int = 0
    in_str: bool = False
    esc: bool = False
    seen: bool = False

    def feed(self, text: str) -> int | None:
        """How many characters of `text` belong to the value, if it ends within `text`; else None."""
        for i, c in enumerate(text):
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == '"':
                    self.in_str = False
                    if self.depth == 0:
                        return i + 1
            elif c == '"':
                self.in_str, self.seen = True, True
            elif c in "{[":
                self.depth, self.seen = self.depth + 1, True
            elif c in "}]":
                if self.depth == 0:
                    return i  # a scalar ended at the enclosing object's brace
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif c in _WS and not self.seen:
                continue
            else:
                self.seen = True
        return None


@dataclass(slots=True)
class ToolCallParser:
    """Turns a tool-mode output into events; `feed` each text delta, then `finish`."""

    mode: Mode
    name: str | None = None  # the function, in `named` mode
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    _state: str = "text"
    _buf: str = ""
    _value: _Value = field(default_factory=_Value)

    def __post_init__(self) -> None:
        if self.mode == "required":
            self._state = "head"
        elif self.mode == "named":
            self._state = "args"

    @property
    def cut(self) -> bool:
        """The output stopped inside a call."""
        return (bool(self.calls) and not self.calls[-1].done) or (self.mode != "auto" and not self.calls)

    def start(self) -> list[Event]:
        """`named` mode knows its call before any text."""
        if self.mode == "named" and not self.calls:
            return [self._begin(self.name or "")]
        return []

    def _begin(self, name: str) -> CallStart:
        call = ParsedCall(call_id(), name)
        self.calls.append(call)
        self._value = _Value()
        return CallStart(len(self.calls) - 1, call.id, name)

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = self.start()
        self._buf += text
        while True:
            before = (self._state, len(self._buf))
            self._step(events)
            if (self._state, len(self._buf)) == before:
                return events

    def _step(self, events: list[Event]) -> None:
        buf = self._buf
        if self._state == "text":
            i = buf.find(TRIGGER)
            if i >= 0:
                self._text(events, buf[:i].rstrip(_WS))
                self._buf, self._state = buf[i + len(TRIGGER):], "head"
            else:
                n = len(buf) - _held(buf)
                self._text(events, buf[:n])
                self._buf = buf[n:]
        elif self._state == "head":
            m = _HEAD.match(buf)
            if m is not None:
                events.append(self._begin(json.loads(m.group(1))))
                self._buf, self._state = buf[m.end():], "args"
        elif self._state == "args":
            stop = self._value.feed(buf)
            piece = buf if stop is None else buf[:stop]
            call = self.calls[-1]
            if piece:
                call.arguments += piece
                events.append(ArgsPiece(len(self.calls) - 1, piece))
            self._buf = "" if stop is None else buf[stop:]
            if stop is not None:
                if self.mode == "named":
                    call.done, self._state = True, "end"
                else:
                    self._state = "tail"
        elif self._state == "tail":
            if self.mode == "required":
                if buf.lstrip(_WS).startswith("}"):
                    self.calls[-1].done, self._state, self._buf = True, "end", ""
            else:
                j = buf.find(END)
                if j >= 0:
                    self.calls[-1].done = True
                    self._buf, self._state = buf[j + len(END):], "between"
        elif self._state == "between":
            i = buf.find(TRIGGER)
            if i >= 0:
                self._buf, self._state = buf[i + len(TRIGGER):], "head"
        # "end": nothing more is read

    def _text(self, events: list[Event], text: str) -> None:
        if text:
            self.content += text
            events.append(TextPiece(text))

    def finish(self) -> list[Event]:
        """The end of the output: text held back is released (it was no trigger)."""
        events: list[Event] = self.start()
        if self._state == "text" and self._buf:
            self._text(events, self._buf)
            self._buf = ""
        return events

    def complete_calls(self) -> list[ParsedCall]:
        return [c for c in self.calls if c.done]


def parse(mode: Mode, text: str, name: str | None = None) -> ToolCallParser:
    """A whole output, parsed (the same events a stream of it gives)."""
    p = ToolCallParser(mode, name)
    p.feed(text)
    p.finish()
    return p
