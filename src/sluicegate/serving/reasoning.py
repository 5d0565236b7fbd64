"""A thinking model's reasoning, read apart from its answer (docs/models.md, "Reasoning").

Models that think write their reasoning between markers before the answer: `<think>...</think>` (DeepSeek R1,
Qwen3, QwQ, Granite), `<|START_THINKING|>...<|END_THINKING|>` (Command R7B), `[THINK]...[/THINK]` (Magistral).
The template says which: a template that writes the end marker is a thinking model's. Some templates open the
block in the generation prompt (DeepSeek R1's ends in `<think>\n`), so the output starts inside the reasoning
with no opening marker: `Reasoning.opened` reads that from the rendered prompt.

`--reasoning-format` (llama-server's flag and values): `auto` (the default) and `deepseek` put the reasoning in
`reasoning_content` (chat; vLLM and llama-server's field), reasoning items (Responses) and thinking blocks
(Messages); `none` leaves it in the answer's text as the model wrote it. Either way its tokens are completion
tokens, charged and bounded by `max_tokens` like the answer's.

`ReasoningSplitter` reads the output as it arrives, holding back only what could be the start of a marker, so a
stream and a whole response split the same text the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ReasoningFormat = Literal["auto", "deepseek", "none"]  # settings/types.py `reasoning_format` checks the flag


@dataclass(frozen=True, slots=True)
class Reasoning:
    start: str
    end: str


MARKERS = (
    Reasoning("<think>", "</think>"),
    Reasoning("<|START_THINKING|>", "<|END_THINKING|>"),
    Reasoning("[THINK]", "[/THINK]"),
)


def detect(source: str | None, fmt: ReasoningFormat = "auto") -> Reasoning | None:
    """The markers a template's model thinks between (None: it does not, or `--reasoning-format none`)."""
    if fmt == "none" or not source:
        return None
    return next((r for r in MARKERS if r.end in source), None)


def opened(reasoning: Reasoning, prompt: str) -> bool:
    """The generation prompt ends inside an open reasoning block (the output starts in it)."""
    return prompt.rstrip().endswith(reasoning.start)


@dataclass(frozen=True, slots=True)
class ReasoningPiece:
    text: str


@dataclass(frozen=True, slots=True)
class AnswerPiece:
    text: str


def partial_marker(buf: str, marker: str) -> int:
    """How many characters at the end of `buf` could be the start of `marker` (held back from a stream; the
    tool-call parser holds back a trigger's start the same way)."""
    return next((k for k in range(min(len(marker) - 1, len(buf)), 0, -1) if marker.startswith(buf[-k:])), 0)


@dataclass(slots=True)
class ReasoningSplitter:
    """Splits an output into reasoning and answer; `feed` each text delta, then `finish`."""

    reasoning: Reasoning
    inside: bool = False  # the prompt opened the block
    text: str = ""  # the reasoning so far
    _state: str = "start"
    _buf: str = ""

    def __post_init__(self) -> None:
        if self.inside:
            self._state = "in"

    def feed(self, text: str) -> list[ReasoningPiece | AnswerPiece]:
        out: list[ReasoningPiece | AnswerPiece] = []
        self._buf += text
        while True:
            before = (self._state, self._buf)
            self._step(out)
            if (self._state, self._buf) == before:
                return out

    def _step(self, out: list[ReasoningPiece | AnswerPiece]) -> None:
        r, buf = self.reasoning, self._buf
        if self._state == "start":
            head = buf.lstrip()
            if head.startswith(r.start):
                self._buf, self._state = head[len(r.start):], "in"
            elif not r.start.startswith(head):  # not a reasoning block: all answer
                self._state = "out"
        elif self._state == "in":
            i = buf.find(r.end)
            if i >= 0:
                self._think(out, buf[:i])
                self._buf, self._state = buf[i + len(r.end):], "skip"
            else:
                n = len(buf) - partial_marker(buf, r.end)
                self._think(out, buf[:n])
                self._buf = buf[n:]
        elif self._state == "skip":  # the whitespace between the reasoning and the answer
            rest = buf.lstrip()
            if rest:
                self._buf, self._state = rest, "out"
        elif self._state == "out" and buf:
            out.append(AnswerPiece(buf))
            self._buf = ""

    def _think(self, out: list[ReasoningPiece | AnswerPiece], text: str) -> None:
        if self._state == "in" and not self.text:
            text = text.lstrip()
        if text:
            self.text += text
            out.append(ReasoningPiece(text))

    def finish(self) -> list[ReasoningPiece | AnswerPiece]:
        out: list[ReasoningPiece | AnswerPiece] = []
        if self._state == "in":
            self._think(out, self._buf)
        elif self._state in ("start", "out") and self._buf:
            out.append(AnswerPiece(self._buf))
        self._buf = ""
        return out
