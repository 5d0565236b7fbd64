"""Tool calls for any surface: the grammar a call is generated under, and the one parser of the output.

Every call is written in the served model's own syntax (`ToolFormat`, serving/tool_formats.py: Hermes'
`<tool_call>` for a template that teaches none). Three modes (docs/openai.md, "Tool calls"):
- `named`: the output is one call to the named function, its arguments constrained to its `parameters`;
- `required`: the output is one call to any of the tools;
- `auto`: the model writes freely; the moment its text contains the format's trigger (`<tool_call>`,
  `[TOOL_CALLS]`, ...) the rest is constrained to calls in the format's syntax. This is llama.cpp's "lazy
  grammar" done in llguidance: the free text is a lazy lexeme that ends at the first trigger, so a call is always
  valid and free text can never contain a trigger that is not a call.

Arguments are held to the function's schema with `additionalProperties` read as false where a schema leaves it
out (`closed_schema`), as llama.cpp's converter and xgrammar read it: `get_weather(**args)` never meets an
argument it does not declare.

The parser reads the text as it arrives (a stream) or whole (one response) and gives the same events either
way: content text (held back while it could be the start of a trigger, and without the whitespace just before
a call), then per call its start (index, id, name) and its arguments in pieces, exactly as the model wrote
them (the grammar makes them compact JSON). A call the model did not finish (max_tokens) is `cut`; the
surfaces return it as far as it got with finish reason `length` (`ToolCallParser.reported`).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance as llg

from sluicegate.backends.base import Tokenizer
from sluicegate.serving.constraints import JSON_OPTIONS, Grammar, GrammarError, compile_json
from sluicegate.serving.reasoning import partial_marker
from sluicegate.serving.tool_formats import GENERIC, JSON_CALL, IdStyle, Name, ToolFormat, part_lark, part_regex

Mode = Literal["named", "required", "auto"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function a request offers (surface-neutral)."""

    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool = False

    @property
    def schema(self) -> dict[str, Any]:
        if self.parameters is None:  # no parameters: an empty object (closed when strict)
            return {"type": "object", "properties": {}, "additionalProperties": False} if self.strict else {
                "type": "object"}
        closed: dict[str, Any] = closed_schema(self.parameters)
        return closed


_SUBSCHEMAS = ("items", "additionalItems", "contains", "not", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed_schema(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that declares `properties` and says
    nothing of more (a copy; the caller's is untouched). An object with no `properties` stays open: it
    declares nothing, so anything is what it asks for."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = closed_schema(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_schema(s) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_schema(v) for k, v in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed_schema(out["additionalProperties"])
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def strict_problem(schema: dict[str, Any] | None, path: str = "") -> str | None:
    """Why `schema` is not a strict schema as OpenAI defines it (every object lists all its properties in
    `required` and sets `additionalProperties: false`), or None."""
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object" or "properties" in schema:
        if schema.get("additionalProperties", True) is not False:
            return f"{path or 'the schema'}: an object must set additionalProperties to false"
        props = schema.get("properties") or {}
        missing = [k for k in props if k not in (schema.get("required") or [])]
        if missing:
            return f"{path or 'the schema'}: every property must be required ({len(missing)} are not)"
    for key in _SUBSCHEMAS:
        if (why := strict_problem(schema.get(key), f"{path}.{key}".lstrip("."))) is not None:
            return why
    for key in _SCHEMA_LISTS:
        for i, s in enumerate(schema.get(key) or ()):
            if (why := strict_problem(s, f"{path}.{key}[{i}]".lstrip("."))) is not None:
                return why
    for key in _SCHEMA_MAPS:
        for k, s in (schema.get(key) or {}).items():
            if (why := strict_problem(s, f"{path}.{key}.{k}".lstrip("."))) is not None:
                return why
    return None


def call_schema(tools: list[ToolSpec]) -> dict[str, Any]:
    """The JSON schema of one call in the bare JSON syntax (`JSON_CALL`): `{"name": <one of tools>,
    "arguments": <its parameters>}`, in that order (what an upstream engine is asked for)."""
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


def _json_arg(schema: dict[str, Any]) -> str:
    return json.dumps({"x-guidance": JSON_OPTIONS, **schema}, ensure_ascii=False)


def tools_lark(fmt: ToolFormat, tools: list[ToolSpec], mode: Mode, parallel: bool, *,
               think_end: str | None = None) -> str:
    """The llguidance grammar of a tool mode in `fmt`'s syntax. `auto`: free text, or text then the trigger and
    calls; the forced modes: calls only. `think_end`: the prompt opened the model's reasoning; a forced call
    closes it at once (empty reasoning, then the call: a forced call and reasoning do not combine, as in
    Anthropic's API, and a small model left to reason may never stop)."""
    open_rest = part_lark(fmt.open[1:])
    calls = " | ".join(f"c{i}" for i in range(len(tools)))
    rules = [f"c{i}: {fmt.lark_call(t.name, _json_arg(t.schema))}" for i, t in enumerate(tools)]
    more = f" ({part_lark(fmt.sep)} call)*" if parallel and fmt.sep is not None else ""
    section = f"{open_rest} call{more} {part_lark(fmt.close)}"
    trigger = json.dumps(fmt.trigger, ensure_ascii=False)
    lines = ["%llguidance {}"]
    if mode == "auto":
        lines += ["start: TEXT | head section", "TEXT: /(.|\\n)*/", f"head[lazy]: TEXT {trigger}"]
    elif think_end is not None:
        lines += [f'start: {json.dumps(think_end, ensure_ascii=False)} "\\n\\n"? {trigger} section']
    else:
        lines += [f"start: {trigger} section"]
    lines += [f"section: {section}", f"call: {calls}", *rules]
    return "\n".join(lines) + "\n"


class ToolGrammar(Grammar):
    """A tool mode's grammar: there is no JSON schema to hand an upstream engine, so it is refused there by
    name."""

    refusal_param = "tool_choice"


def compile_tools(runner: Tokenizer, tools: list[ToolSpec], mode: Mode, name: str | None = None, *,
                  parallel: bool = True, fmt: ToolFormat = GENERIC, think_end: str | None = None) -> Grammar:
    """The grammar of a tool mode in `fmt`'s syntax (blocking: call off the event loop); GrammarError names no
    parameter, the surface does (a named function's schema, or the tool list)."""
    if mode == "named":
        tools = [t for t in tools if t.name == name]
    if mode != "auto":  # a forced choice is one call (docs/openai.md): a small model would repeat it to the end
        parallel = False
    if fmt is JSON_CALL and mode != "auto":  # a JSON schema: what an upstream engine can take
        return compile_json(runner, call_schema(tools))
    try:
        grammar = llg.LLMatcher.grammar_from_lark(tools_lark(fmt, tools, mode, parallel, think_end=think_end))
    except (ValueError, TypeError) as exc:
        raise GrammarError(str(exc)) from None
    return ToolGrammar(runner, grammar)


def instructions(fmt: ToolFormat, tools: list[ToolSpec]) -> str:
    """The tools and the call syntax, for a template that does not show tools itself (a system message)."""
    lines = ["You can call these functions (their arguments are described by JSON Schema):"]
    for t in tools:
        spec: dict[str, Any] = {"name": t.name}
        if t.description:
            spec["description"] = t.description
        spec["parameters"] = t.parameters if t.parameters is not None else {"type": "object"}
        lines.append(json.dumps(spec, ensure_ascii=False))
    lines.append(f"To call a function, write {fmt.example()}; otherwise answer in text.")
    return "\n".join(lines)


_ALNUM = string.ascii_letters + string.digits


def call_id(style: IdStyle = "openai") -> str:
    if style == "alnum9":  # Mistral's templates refuse any other id
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
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


_WS = " \t\r\n"


def _held(buf: str, trigger: str) -> int:
    """How many characters at the end of `buf` could still become a trigger, or the whitespace before one."""
    k = partial_marker(buf, trigger)
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
            elif c in ",\n" and self.depth == 0 and self.seen:
                return i  # a scalar ended before what follows it
            else:
                self.seen = True
        return None


@dataclass(frozen=True, slots=True)
class _Syntax:
    """A format's parts as anchored regular expressions (compiled once per format)."""

    first: re.Pattern[str]  # the rest of `open`, then the first call's head
    tail: re.Pattern[str]
    next: re.Pattern[str] | None  # `sep`, then a head
    close: re.Pattern[str] | None

    @classmethod
    def of(cls, fmt: ToolFormat) -> _Syntax:
        head = part_regex(fmt.head)
        return cls(
            re.compile(part_regex(fmt.open[1:]) + head, re.DOTALL),
            re.compile(r'(?:\s*,\s*"id"\s*:\s*"[^"]*")?' + part_regex(fmt.tail), re.DOTALL),  # Mistral's ids
            None if fmt.sep is None else re.compile(part_regex(fmt.sep) + head, re.DOTALL),
            re.compile(part_regex(fmt.close), re.DOTALL) if fmt.close else None,
        )


_SYNTAX: dict[str, _Syntax] = {}


def _syntax(fmt: ToolFormat) -> _Syntax:
    found = _SYNTAX.get(fmt.name)
    if found is None:
        found = _SYNTAX[fmt.name] = _Syntax.of(fmt)
    return found


def _name(match: re.Match[str], fmt: ToolFormat) -> str:
    raw = match.group("name")
    if any(isinstance(p, Name) and p.quoted for p in fmt.head):
        try:
            return str(json.loads(f'"{raw}"'))
        except ValueError:
            return raw
    return raw


@dataclass(slots=True)
class ToolCallParser:
    """Turns a tool-mode output into events; `feed` each text delta, then `finish`."""

    mode: Mode
    name: str | None = None  # the function, in `named` mode
    fmt: ToolFormat = GENERIC
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    _state: str = "text"
    _buf: str = ""
    _value: _Value = field(default_factory=_Value)

    @property
    def cut(self) -> bool:
        """The output stopped inside a call."""
        return (bool(self.calls) and not self.calls[-1].done) or (self.mode != "auto" and not self.calls)

    def reported(self, finish: str | None) -> list[ParsedCall]:
        """The calls a response carries: the whole ones; with finish reason `length`, the cut one too, as far as
        it got (OpenAI's shape: clients decide, e.g. the SDK's `parse()` raises LengthFinishReasonError)."""
        if finish == "length":
            return list(self.calls)
        return [c for c in self.calls if c.done]

    def start(self) -> list[Event]:
        """`named` mode knows its call before any text."""
        if self.mode == "named" and not self.calls:
            return [self._begin(self.name or "")]
        return []

    def _begin(self, name: str) -> CallStart:
        call = ParsedCall(call_id(self.fmt.id_style), name)
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

    def _head(self, events: list[Event], m: re.Match[str]) -> None:
        name = _name(m, self.fmt)
        if not (self.mode == "named" and self._state == "first"):  # `start` began it
            events.append(self._begin(name))
        self._buf, self._state = self._buf[m.end():], "args"

    def _step(self, events: list[Event]) -> None:
        buf, syntax, trigger = self._buf, _syntax(self.fmt), self.fmt.trigger
        if self._state == "text":
            i = buf.find(trigger)
            if i >= 0:
                self._text(events, buf[:i].rstrip(_WS) if self.mode == "auto" else buf[:i])
                self._buf, self._state = buf[i + len(trigger):], "first"
            else:
                n = len(buf) - _held(buf, trigger)
                self._text(events, buf[:n])
                self._buf = buf[n:]
        elif self._state == "first":
            if (m := syntax.first.match(buf)) is not None:
                self._head(events, m)
        elif self._state == "args":
            if not self.calls[-1].arguments:  # whitespace before the value is the syntax's, not the arguments'
                buf = self._buf = buf.lstrip(_WS)
                if not buf:
                    return
            stop = self._value.feed(buf)
            piece = buf if stop is None else buf[:stop]
            call = self.calls[-1]
            if piece:
                call.arguments += piece
                events.append(ArgsPiece(len(self.calls) - 1, piece))
            self._buf = "" if stop is None else buf[stop:]
            if stop is not None:
                self._state = "tail"
        elif self._state == "tail":
            if (m := syntax.tail.match(buf)) is not None:
                self.calls[-1].done = True
                self._buf, self._state = buf[m.end():], "after"
        elif self._state == "after":
            if syntax.close is not None and (m := syntax.close.match(buf)) is not None:
                self._buf, self._state = buf[m.end():], "end"
            elif syntax.next is not None and (m := syntax.next.match(buf)) is not None:
                self._head(events, m)
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


def parse(mode: Mode, text: str, name: str | None = None, fmt: ToolFormat = GENERIC) -> ToolCallParser:
    """A whole output, parsed (the same events a stream of it gives)."""
    p = ToolCallParser(mode, name, fmt)
    p.feed(text)
    p.finish()
    return p


def partial_object(text: str) -> dict[str, Any]:
    """The arguments of a call cut short, as an object: the text up to its last complete value, closed (for a
    surface whose call input must be an object: Anthropic's `tool_use.input`)."""
    stack: list[str] = []
    safe: tuple[int, str] = (0, "")
    in_str = esc = False
    for i, c in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
            if len(stack) == 1:
                safe = (i + 1, "}")
        elif c in "}]":
            if stack:
                stack.pop()
            safe = (i + 1, "".join(reversed(stack)))
        elif c == ",":
            safe = (i, "".join(reversed(stack)))
    for end, closers in (safe, (len(text), "")):
        try:
            value = json.loads(text[:end] + closers)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}
