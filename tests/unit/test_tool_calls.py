"""serving/tool_calls.py, in the generic syntax (every family's: test_tool_formats.py): `auto`'s lazy grammar
(llguidance, on the byte-level reference vocabulary) and the one parser of tool-mode output, which gives the same
calls whether the text arrives whole or a character at a time."""

from __future__ import annotations

import json

import pytest

from sluicegate.backends.reference import ReferenceRunner
from sluicegate.serving.constraints import GrammarConstraint
from sluicegate.serving.tool_calls import (
    ArgsPiece,
    CallStart,
    Mode,
    TextPiece,
    ToolCallParser,
    ToolSpec,
    compile_tools,
    parse,
)

TOOLS = [
    ToolSpec("weather", None, {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"], "additionalProperties": False}),
    ToolSpec("clock", "the time", None),
]
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Pa}r\\"is"}}</tool_call>'


def accepts(c: GrammarConstraint, text: str) -> bool:
    for b in text.encode():
        if not c.allows(b):
            return False
        c.accept(b)
    return True


@pytest.fixture(scope="module")
def runner() -> ReferenceRunner:
    return ReferenceRunner()


def test_auto_grammar_allows_text_and_valid_calls_only(runner: ReferenceRunner) -> None:
    g = compile_tools(runner, TOOLS, "auto", parallel=True)
    assert g.constraint().refusal_param == "tool_choice"
    for ok in ["plain text, <tool or tool_call> is fine", f"Sure.\n{CALL}", f"{CALL}\n{CALL}",
               '<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call>']:
        c = g.constraint()
        assert accepts(c, ok) and c.is_complete(), ok
    for bad in ['x <tool_call> hi', '<tool_call>{"name": "nope"', '<tool_call>{"arguments": {}',
                '<tool_call>{"name": "weather", "arguments": {"town": ']:
        assert not accepts(g.constraint(), bad), bad
    c = g.constraint()
    assert accepts(c, '<tool_call>{"name": "clock", "arguments": {}}') and not c.is_complete()
    single = compile_tools(runner, TOOLS, "auto", parallel=False).constraint()
    assert accepts(single, CALL) and not accepts(single, "\n<tool_call>")


def replay(mode: Mode, text: str, name: str | None = None) -> tuple[str, list[tuple[str, str, bool]]]:
    p = ToolCallParser(mode, name)
    events = []
    for ch in text:
        events += p.feed(ch)
    events += p.finish()
    text_out = "".join(e.text for e in events if isinstance(e, TextPiece))
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [s.index for s in starts] == list(range(len(starts)))
    args = ["".join(e.text for e in events if isinstance(e, ArgsPiece) and e.index == s.index) for s in starts]
    assert text_out == p.content
    return text_out, [(s.name, a, c.done) for s, a, c in zip(starts, args, p.calls, strict=True)]


@pytest.mark.parametrize(("mode", "text", "content", "calls"), [
    ("auto", "Just text <tool_ca", "Just text <tool_ca", []),
    ("auto", f"Sure. \n{CALL}", "Sure.", [("weather", '{"city": "Pa}r\\"is"}', True)]),
    ("auto", f"{CALL}\n{CALL}", "", [("weather", '{"city": "Pa}r\\"is"}', True)] * 2),
    ("auto", 'Hm <tool_call>{"name": "clock", "arguments": {"a": [1', "Hm", [("clock", '{"a": [1', False)]),
    ("required", '<tool_call>{"name": "clock", "arguments": 5}</tool_call>', "", [("clock", "5", True)]),
    ("required", '<tool_call>{"name": "clock", "argu', "", []),
    ("named", '<tool_call>{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}</tool_call>', "",
     [("f", '{"a": [1, {"b": "}"}]}', True)]),
    ("named", '<tool_call>{"name": "f", "arguments": {"a": [1, {"b": "}"}', "", [("f", '{"a": [1, {"b": "}"}', False)]),
])
def test_parse_whole_equals_parse_streamed(mode: Mode, text: str, content: str,
                                           calls: list[tuple[str, str, bool]]) -> None:
    name = "f" if mode == "named" else None
    assert replay(mode, text, name) == (content, calls)
    whole = parse(mode, text, name)
    assert whole.content == content
    assert [(c.name, c.arguments) for c in whole.complete_calls()] == [(n, a) for n, a, done in calls if done]
    assert whole.cut == (not calls or not calls[-1][2]) if mode != "auto" else whole.cut == any(
        not done for _, _, done in calls)
    for c in whole.complete_calls():
        json.loads(c.arguments)


@pytest.mark.parametrize("text", ["// comment", 'a "quoted" }{ thing', "line\nbreak", "%json {", "ünï 😀", "\\"])
def test_client_text_in_a_schema_cannot_break_the_grammar(runner: ReferenceRunner, text: str) -> None:
    """Schemas go into the grammar as JSON (`%json`): nothing in them is read as grammar syntax."""
    spec = ToolSpec("f", None, {"type": "object", "properties": {"a": {"type": "string", "description": text,
                                                                      "pattern": "^//[a-z]+$"}}})
    c = compile_tools(runner, [spec], "auto", parallel=False).constraint()
    assert accepts(c, '<tool_call>{"name": "f", "arguments": {"a": "//ab"}}</tool_call>') and c.is_complete()
    assert not accepts(compile_tools(runner, [spec], "auto", parallel=False).constraint(),
                       '<tool_call>{"name": "f", "arguments": {"a": "ab"')
