"""Tool-call syntaxes per model family, detected from the chat template (docs/models.md, "Tool calls").

A model is trained to write its calls one way: Qwen and Hermes `<tool_call>{...}</tool_call>`, Llama 3.x a bare
`{"name": ..., "parameters": ...}`, Mistral `[TOOL_CALLS][...]`, Granite `<|tool_call|>[...]`, DeepSeek R1
its `<｜tool▁calls▁begin｜>` blocks with the name outside the JSON, Command R7B `<|START_ACTION|>[...]`,
Firefunction ` functools[...]`, Phi-4-mini `<|tool_call|>{...}<|/tool_call|>`. llama.cpp (common/chat.cpp)
and vLLM (one tool parser per family) both meet the model in its own syntax; so does this server. A `ToolFormat`
is that syntax as data, in five parts:

    open  call (sep call)*  close        call = head(name) <arguments: JSON> tail

Each part is a sequence of pieces (`Lit`, `Ws`, `Name`, `Id`); the same description gives
- the grammar (`lark`: llguidance's Lark) that forces the syntax in `named`/`required` mode and, in `auto` mode,
  lets the model write text until the first piece of `open` (the trigger) and then holds it to a call,
- the regular expressions the one streaming parser (serving/tool_calls.py) reads it back with (whitespace-tolerant
  around JSON punctuation, so a family's own examples parse too, not only what our grammar lets through),
- the text of earlier calls (`render`) for a template that cannot render `tool_calls` itself.

Detection follows llama.cpp's: a marker that only that family's template holds. A template that holds none keeps
the generic format, which is Hermes' (the syntax most open templates teach).

Why by hand: neither llama-cpp-python nor llguidance ships per-family tool formats for Python; vLLM's parsers are
tied to its own request objects and tokenizer classes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

IdStyle = Literal["openai", "alnum9"]


@dataclass(frozen=True, slots=True)
class Lit:
    """Literal text. `json`: JSON punctuation, read back with any whitespace around `{}[],:`."""

    text: str
    json: bool = False


@dataclass(frozen=True, slots=True)
class Ws:
    """An optional newline (written as one; read back as any whitespace)."""


@dataclass(frozen=True, slots=True)
class Name:
    """The function's name: a JSON string (`quoted`) or the bare name."""

    quoted: bool = True


@dataclass(frozen=True, slots=True)
class Id:
    """A counter the syntax carries per call (Command R7B's `tool_call_id`): digits."""


Piece = Lit | Ws | Name | Id
Part = tuple[Piece, ...]

_JSON_PUNCT = set("{}[],:")


def _piece_regex(p: Piece) -> str:
    if isinstance(p, Ws):
        return r"\s*"
    if isinstance(p, Name):
        return r'"(?P<name>(?:[^"\\]|\\.)*)"' if p.quoted else r"(?P<name>[^\s<>`]+)"
    if isinstance(p, Id):
        return r'(?:\d+)'
    if not p.json:
        return re.escape(p.text)
    out = []
    for c in p.text:
        if c.isspace():
            out.append(r"\s*")
        elif c in _JSON_PUNCT:
            out.append(r"\s*" + re.escape(c) + r"\s*")
        else:
            out.append(re.escape(c))
    return re.sub(r"(\\s\*)+", r"\\s*", "".join(out))


def part_regex(part: Part) -> str:
    return re.sub(r"(\\s\*)+", r"\\s*", "".join(_piece_regex(p) for p in part))


def _lark_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def part_lark(part: Part, name: str = "") -> str:
    """The Lark expression of a part (`name`: the function a `Name` piece stands for)."""
    out: list[str] = []
    for p in part:
        if isinstance(p, Ws):
            out.append('"\\n"?')
        elif isinstance(p, Name):
            out.append(_lark_literal(json.dumps(name, ensure_ascii=False) if p.quoted else name))
        elif isinstance(p, Id):
            out.append("/[0-9]{1,3}/")
        elif p.text:
            out.append(_lark_literal(p.text))
    return " ".join(out) if out else '""'


def _render(part: Part, name: str = "", index: int = 0) -> str:
    out: list[str] = []
    for p in part:
        if isinstance(p, Ws):
            out.append("\n")
        elif isinstance(p, Name):
            out.append(json.dumps(name, ensure_ascii=False) if p.quoted else name)
        elif isinstance(p, Id):
            out.append(str(index))
        else:
            out.append(p.text)
    return "".join(out)


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str  # the family ("hermes", "llama3", ...), reported in /v1/models/{id} and the log
    open: Part  # before the first call; its first piece is the trigger `auto` waits for
    head: Part  # before each call's arguments
    tail: Part  # after each call's arguments
    sep: Part | None  # between two calls; None: the family writes one call per turn
    close: Part  # after the last call
    id_style: IdStyle = "openai"  # the call ids this family's templates accept

    @property
    def trigger(self) -> str:
        first = self.open[0]
        assert isinstance(first, Lit)
        return first.text

    @property
    def parallel(self) -> bool:
        return self.sep is not None

    def lark_call(self, name: str, args_json: str) -> str:
        """One call to `name`, its arguments the llguidance `%json` of `args_json` (a JSON schema's text)."""
        return f"{part_lark(self.head, name)} %json {args_json} {part_lark(self.tail, name)}"

    def render(self, calls: Sequence[tuple[str, Any]]) -> str:
        """Calls as the model writes them (`(name, arguments)`; arguments a value, or a string as sent)."""
        bodies = []
        for i, (name, args) in enumerate(calls):
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            bodies.append(_render(self.head, name, i) + text + _render(self.tail, name, i))
        sep = _render(self.sep) if self.sep is not None else "\n"
        return _render(self.open) + sep.join(bodies) + _render(self.close)

    def example(self) -> str:
        """How to write a call, for the instructions given to a template that does not teach it."""
        return self.render([("<function name>", "<its arguments as JSON>")])


_ARGS = (Lit('{"name": ', json=True), Name(), Lit(', "arguments": ', json=True))
_LIST = (Lit("}", json=True),)

HERMES = ToolFormat(
    "hermes", open=(Lit("<tool_call>"),), head=(Ws(), *_ARGS), tail=(Lit("}", json=True), Ws(), Lit("</tool_call>")),
    sep=(Ws(), Lit("<tool_call>")), close=(),
)
LLAMA3 = ToolFormat(
    "llama3", open=(Lit('{"name": ', json=True),), head=(Name(), Lit(', "parameters": ', json=True)),
    tail=(Lit("}", json=True),), sep=None, close=(),
)
MISTRAL = ToolFormat(
    "mistral", open=(Lit("[TOOL_CALLS]"), Lit("[", json=True)), head=_ARGS, tail=_LIST,
    sep=(Lit(", ", json=True),), close=(Lit("]", json=True),), id_style="alnum9",
)
GRANITE = ToolFormat(
    "granite", open=(Lit("<|tool_call|>"), Lit("[", json=True)), head=_ARGS, tail=_LIST,
    sep=(Lit(", ", json=True),), close=(Lit("]", json=True),),
)
FIREFUNCTION = ToolFormat(
    "firefunction", open=(Lit(" functools"), Lit("[", json=True)), head=_ARGS, tail=_LIST,
    sep=(Lit(", ", json=True),), close=(Lit("]", json=True),),
)
COMMAND_R7B = ToolFormat(
    "command-r7b", open=(Lit("<|START_ACTION|>"), Lit("[", json=True)),
    head=(Lit('{"tool_call_id": "', json=True), Id(), Lit('", "tool_name": ', json=True), Name(),
          Lit(', "parameters": ', json=True)),
    tail=_LIST, sep=(Lit(", ", json=True),), close=(Lit("]", json=True), Lit("<|END_ACTION|>")),
)
DEEPSEEK_R1 = ToolFormat(
    "deepseek-r1", open=(Lit("<｜tool▁calls▁begin｜>"),),
    head=(Lit("<｜tool▁call▁begin｜>function<｜tool▁sep｜>"), Name(quoted=False), Lit("\n```json\n")),
    tail=(Lit("\n```<｜tool▁call▁end｜>"),), sep=(Ws(),), close=(Lit("<｜tool▁calls▁end｜>"),),
)
PHI4 = ToolFormat(
    "phi4", open=(Lit("<|tool_call|>"),), head=(Ws(), *_ARGS), tail=(Lit("}", json=True), Ws(), Lit("<|/tool_call|>")),
    sep=(Ws(), Lit("<|tool_call|>")), close=(),
)
GENERIC = ToolFormat(
    "generic", open=HERMES.open, head=HERMES.head, tail=HERMES.tail, sep=HERMES.sep, close=HERMES.close,
)
# A bare JSON object per call: what an upstream engine is asked for (a JSON schema is all it takes: named and
# `required` calls go to it as `response_format`), never detected from a template.
JSON_CALL = ToolFormat(
    "json", open=(Lit('{"name": ', json=True),), head=(Name(), Lit(', "arguments": ', json=True)),
    tail=(Lit("}", json=True),), sep=None, close=(),
)
FORMATS = (HERMES, LLAMA3, MISTRAL, GRANITE, FIREFUNCTION, COMMAND_R7B, DEEPSEEK_R1, PHI4, GENERIC, JSON_CALL)

# (marker in the template's source, format): the first that matches wins (llama.cpp's order, common/chat.cpp)
_DETECT: tuple[tuple[str, ToolFormat], ...] = (
    ("<｜tool▁calls▁begin｜>", DEEPSEEK_R1),
    ("<|START_ACTION|>", COMMAND_R7B),
    ("[TOOL_CALLS]", MISTRAL),
    ("<|/tool_call|>", PHI4),
    ("<|tool_call|>", GRANITE),
    (" functools[", FIREFUNCTION),
    ("<|start_header_id|>ipython<|end_header_id|>", LLAMA3),
    ("<tool_call>", HERMES),
)


def detect(source: str | None) -> ToolFormat:
    """The tool-call syntax a template teaches (GENERIC: none recognised)."""
    for marker, fmt in _DETECT:
        if source and marker in source:
            return fmt
    return GENERIC


def by_name(name: str) -> ToolFormat:
    return next(f for f in FORMATS if f.name == name)
