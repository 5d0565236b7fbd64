"""One reader of a chat output for every surface: reasoning apart (serving/reasoning.py), then the answer's text
and tool calls (serving/tool_calls.py), as events, the same streamed or whole."""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.serving.reasoning import AnswerPiece, Reasoning, ReasoningPiece, ReasoningSplitter, opened
from sluicegate.serving.tool_calls import ArgsPiece, CallStart, ParsedCall, TextPiece, ToolCallParser
from sluicegate.serving.tool_calls import Event as ToolEvent

Event = ToolEvent | ReasoningPiece

__all__ = ["ArgsPiece", "CallStart", "Event", "OutputReader", "ReasoningPiece", "TextPiece", "reader_for"]


@dataclass(slots=True)
class OutputReader:
    tool: ToolCallParser | None = None
    splitter: ReasoningSplitter | None = None
    content: str = ""  # the answer's text (without a tool parser; with one, its `content`)

    @property
    def text(self) -> str:
        return self.tool.content if self.tool is not None else self.content

    @property
    def reasoning(self) -> str | None:
        return None if self.splitter is None or not self.splitter.text else self.splitter.text

    @property
    def calls(self) -> list[ParsedCall]:
        return self.tool.calls if self.tool is not None else []

    def start(self) -> list[Event]:
        return list(self.tool.start()) if self.tool is not None else []

    def feed(self, text: str) -> list[Event]:
        if not text:
            return self.start()
        return self._route(self.splitter.feed(text) if self.splitter is not None else [AnswerPiece(text)])

    def finish(self) -> list[Event]:
        events = self._route(self.splitter.finish()) if self.splitter is not None else []
        if self.tool is not None:
            events += self.tool.finish()
        return events

    def _route(self, pieces: list[ReasoningPiece | AnswerPiece]) -> list[Event]:
        out: list[Event] = self.start()
        for p in pieces:
            if isinstance(p, ReasoningPiece):
                out.append(p)
            elif self.tool is not None:
                out += self.tool.feed(p.text)
            elif p.text:
                self.content += p.text
                out.append(TextPiece(p.text))
        return out


def reader_for(tool: ToolCallParser | None, reasoning: Reasoning | None, prompt: str) -> OutputReader | None:
    """A reader for an output (None: plain text, nothing to read apart)."""
    if tool is None and reasoning is None:
        return None
    splitter = None if reasoning is None else ReasoningSplitter(reasoning, opened(reasoning, prompt))
    return OutputReader(tool, splitter)


def read_whole(tool: ToolCallParser | None, reasoning: Reasoning | None, prompt: str, text: str) -> OutputReader:
    reader = reader_for(tool, reasoning, prompt) or OutputReader()
    reader.feed(text)
    reader.finish()
    return reader
