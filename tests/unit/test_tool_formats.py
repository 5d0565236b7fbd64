"""serving/tool_formats.py and the parser and grammars built from it: every family's syntax detected from its real
template (llama.cpp's models/templates/), its own examples (llama.cpp's tests/test-chat.cpp, in
tests/data/chat_templates/examples.json) parsed back to the same calls whole and streamed, and the grammar of each
mode accepting exactly that family's syntax."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluicegate.backends.reference import ReferenceRunner
from sluicegate.serving.constraints import GrammarConstraint
from sluicegate.serving.output_reader import read_whole
from sluicegate.serving.reasoning import Reasoning, ReasoningSplitter
from sluicegate.serving.reasoning import detect as detect_reasoning
from sluicegate.serving.tool_calls import (
    ArgsPiece,
    CallStart,
    Mode,
    TextPiece,
    ToolCallParser,
    ToolSpec,
    closed_schema,
    compile_tools,
    parse,
    partial_object,
    strict_problem,
)
from sluicegate.serving.tool_formats import FORMATS, ToolFormat, by_name, detect

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
FAMILY = {  # the template file -> the format it teaches
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command-r7b",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek-r1",
    "llama-cpp-deepseek-r1.jinja": "deepseek-r1",
    "llama-cpp-microsoft-Phi-4-mini-instruct.jinja": "phi4",
    "gemma-3.jinja": "generic",
    "google-gemma-2-2b-it.jinja": "generic",
}
TOOLS = [
    ToolSpec("special_function", None, {"type": "object", "properties": {"arg1": {"type": "integer"}},
                                        "required": ["arg1"]}),
    ToolSpec("python", "runs code", {"type": "object", "properties": {"code": {"type": "string"}},
                                     "required": ["code"]}),
]


@pytest.fixture(scope="module")
def runner() -> ReferenceRunner:
    return ReferenceRunner()


@pytest.mark.parametrize(("file", "family"), sorted(FAMILY.items()))
def test_the_family_is_detected_from_its_template(file: str, family: str) -> None:
    assert detect((TEMPLATES / file).read_text()).name == family


def _examples() -> list[dict[str, Any]]:
    """llama.cpp's own examples for the syntaxes served here: calls with reasoning parsed apart (where the
    example expects it), without llama.cpp's extras this server does not read (Llama's `<|python_tag|>` built-in
    tools, Hermes' `<function=...>` and bare-JSON fallbacks, Phi-4's `</|tool_call|>` spelling, the generic
    `{"tool_calls": ...}` JSON answer, a cut example)."""
    out = []
    for e in json.loads((TEMPLATES / "examples.json").read_text()):
        text = e["output"]
        fmt = detect((TEMPLATES / e["template"]).read_text())
        if (fmt.name == "generic" or "<|python_tag|>" in text or "<function=" in text or "</|tool_call|>" in text
                or "<｜tool▁calls｜>" in text or (e["calls"] and fmt.trigger not in text) or text.endswith("{")
                or "<response>" in text or "<|START_RESPONSE|>" in text or "<tool_call>nah" in text):
            continue
        out.append(e)
    return out


EXAMPLES = _examples()


def test_every_family_has_examples() -> None:
    assert {detect((TEMPLATES / e["template"]).read_text()).name for e in EXAMPLES if e["calls"]} >= {
        "hermes", "llama3", "mistral", "granite", "firefunction", "command-r7b", "deepseek-r1"}  # Phi-4: none reachable


def _stream(reader_text: str, fmt: ToolFormat, reasoning: Reasoning | None, inside: bool) -> tuple[str, str, list]:
    parser = ToolCallParser("auto", None, fmt)
    splitter = ReasoningSplitter(reasoning, inside) if reasoning is not None else None
    events: list[Any] = []
    for ch in reader_text:
        pieces = splitter.feed(ch) if splitter else []
        if splitter is None:
            events += parser.feed(ch)
        for p in pieces:
            events += [p] if type(p).__name__ == "ReasoningPiece" else parser.feed(p.text)
    if splitter is not None:
        for p in splitter.finish():
            events += [p] if type(p).__name__ == "ReasoningPiece" else parser.feed(p.text)
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, TextPiece))
    thought = "".join(e.text for e in events if type(e).__name__ == "ReasoningPiece")
    starts = [e for e in events if isinstance(e, CallStart)]
    calls = [(s.name, json.loads("".join(e.text for e in events if isinstance(e, ArgsPiece) and e.index == s.index)))
             for s in starts]
    return content, thought, calls


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e['family']}:{e['output'][:30]!r}")
def test_a_familys_own_examples_parse_whole_and_streamed(example: dict[str, Any]) -> None:
    source = (TEMPLATES / example["template"]).read_text()
    fmt = detect(source)
    reasoning = detect_reasoning(source)
    if reasoning is not None and reasoning.start in (example["content"] or ""):  # --reasoning-format none
        reasoning = None
    inside = (reasoning is not None and example["reasoning"] is not None
              and not example["output"].lstrip().startswith(reasoning.start))  # the prompt opened the block
    expected = [(c["name"], c["arguments"]) for c in example["calls"]]
    whole = read_whole(ToolCallParser("auto", None, fmt), reasoning, reasoning.start if inside and reasoning
                       else "", example["output"])
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls if c.done] == expected
    assert whole.text.strip() == (example["content"] or "").strip()
    assert (whole.reasoning or None) == example["reasoning"]
    content, thought, calls = _stream(example["output"], fmt, reasoning, inside)
    assert calls == expected and content == whole.text and (thought or None) == whole.reasoning


CALLS = [("special_function", {"arg1": 1}), ("python", {"code": "print('}\\\"')\n"})]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_rendered_calls_parse_back_and_the_grammar_accepts_them(fmt: ToolFormat, runner: ReferenceRunner) -> None:
    for mode in ("auto", "required"):  # a forced choice is one call; `auto` may write several
        calls = CALLS if fmt.parallel and mode == "auto" else CALLS[:1]
        text = fmt.render(calls)
        p = parse(mode, text, None, fmt)
        assert [(c.name, json.loads(c.arguments)) for c in p.complete_calls()] == calls, (mode, text)
        assert p.content == ""
        compact = fmt.render([(n, json.dumps(a, ensure_ascii=False)) for n, a in calls])
        c = compile_tools(runner, TOOLS, mode, parallel=True, fmt=fmt).constraint()
        assert accepts(c, compact) and c.is_complete(), (mode, compact)
    auto = compile_tools(runner, TOOLS, "auto", parallel=True, fmt=fmt).constraint()
    assert accepts(auto, "Some text first. " + fmt.render(CALLS[:1]).lstrip()) or fmt.name == "llama3"
    forced = compile_tools(runner, TOOLS, "required", parallel=True, fmt=fmt).constraint()
    assert not accepts(forced, "Some text")
    if fmt.parallel:
        two = compile_tools(runner, TOOLS, "required", parallel=True, fmt=fmt).constraint()
        assert not accepts(two, fmt.render([(n, json.dumps(a)) for n, a in CALLS]))
    named = compile_tools(runner, TOOLS, "named", "python", fmt=fmt).constraint()
    assert not accepts(named, fmt.render([("special_function", {"arg1": 1})]))
    named = compile_tools(runner, TOOLS, "named", "python", fmt=fmt).constraint()
    one = fmt.render([("python", json.dumps({"code": "x"}))])
    assert accepts(named, one) and named.is_complete()
    p = parse("named", one, "python", fmt)
    assert [(c.name, c.arguments) for c in p.complete_calls()] == [("python", '{"code": "x"}')]


def accepts(c: GrammarConstraint, text: str) -> bool:
    for b in text.encode():
        if not c.allows(b):
            return False
        c.accept(b)
    return True


def test_undeclared_arguments_are_refused_unless_the_schema_allows_them(runner: ReferenceRunner) -> None:
    fmt = by_name("hermes")
    g = compile_tools(runner, TOOLS, "named", "special_function", fmt=fmt)
    extra = fmt.render([("special_function", '{"arg1": 1, "size": "tall"}')])
    assert not accepts(g.constraint(), extra)
    open_tool = [ToolSpec("special_function", None, {**TOOLS[0].parameters, "additionalProperties": True})]  # type: ignore[dict-item]
    assert accepts(compile_tools(runner, open_tool, "named", "special_function", fmt=fmt).constraint(), extra)


def test_closed_schema_and_strict_rules() -> None:
    nested = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}},
                                               "c": {"type": "array", "items": {"type": "object", "properties": {}}},
                                               "d": {"type": "object"}}}
    closed = closed_schema(nested)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["d"]  # declares nothing: anything is asked for
    assert "additionalProperties" not in nested  # the caller's is untouched
    assert strict_problem(nested) is not None
    strict = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"],
              "additionalProperties": False}
    assert strict_problem(strict) is None
    assert "required" in (strict_problem({**strict, "required": []}) or "")


@pytest.mark.parametrize(("text", "expected"), [
    ('{"city": "Par', {}), ('{"city": "Paris", "days": 3, "unit": "c', {"city": "Paris", "days": 3}),
    ('{"a": {"b": [1, 2', {"a": {"b": [1]}}), ('{"a": {"b": [1, 2]}, "c"', {"a": {"b": [1, 2]}}), ("", {}),
    ('{"a": 1}', {"a": 1}),
])
def test_a_cut_call_is_closed_at_its_last_whole_value(text: str, expected: dict[str, Any]) -> None:
    assert partial_object(text) == expected


@pytest.mark.parametrize("mode", ["auto", "required", "named"])
def test_a_call_cut_by_max_tokens_is_reported_as_far_as_it_got(mode: Mode) -> None:
    fmt = by_name("mistral")
    text = fmt.render([("python", {"code": "print(1)"})])[:-6]
    p = parse(mode, text, "python" if mode == "named" else None, fmt)
    assert p.cut and p.complete_calls() == []
    [call] = p.reported("length")
    assert call.name == "python" and call.arguments.startswith('{"code": "pri') and not call.done
    assert p.reported("stop") == []


def test_mistral_call_ids_are_nine_letters_and_digits() -> None:
    p = parse("auto", by_name("mistral").render([("python", {"code": "1"})]), None, by_name("mistral"))
    assert len(p.calls[0].id) == 9 and p.calls[0].id.isalnum()
    assert parse("auto", by_name("hermes").render([("python", {})]), None, by_name("hermes")).calls[0].id.startswith(
        "call_")


@pytest.mark.parametrize(("text", "inside", "reasoning", "answer"), [
    ("<think>\nplan it\n</think>\n\nThe answer.", False, "plan it\n", "The answer."),
    ("plan it</think>The answer.", True, "plan it", "The answer."),
    ("No thinking here.", False, None, "No thinking here."),
    ("  <thi", False, None, "  <thi"),
    ("<think>cut short", False, "cut short", ""),
])
def test_reasoning_is_split_the_same_streamed_and_whole(text: str, inside: bool, reasoning: str | None,
                                                        answer: str) -> None:
    r = Reasoning("<think>", "</think>")
    whole = read_whole(None, r, "<think>\n" if inside else "", text)
    assert (whole.reasoning, whole.text) == (reasoning, answer)
    s = ReasoningSplitter(r, inside)
    pieces = [p for ch in text for p in s.feed(ch)] + s.finish()
    assert "".join(p.text for p in pieces if type(p).__name__ == "AnswerPiece") == answer
    assert ("".join(p.text for p in pieces if type(p).__name__ == "ReasoningPiece") or None) == reasoning
