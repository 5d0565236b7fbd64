"""Engine-side request and result types: slotted dataclasses, no pydantic, no HTTP."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt


class FinishReason(enum.StrEnum):
    LENGTH = "length"  # max_new_tokens reached
    STOP = "stop"  # a stop string matched
    EOS = "eos"  # the model ended the sequence
    CANCELLED = "cancelled"  # client left, explicit abort, or shutdown
    EXPIRED = "expired"  # a deadline passed (queued, mid-generation, or a stream's first token not yet out)
    ERROR = "error"  # the engine failed while running it


class Priority(enum.IntEnum):
    INTERACTIVE = 0
    BATCH = 1


class Constraint(Protocol):
    """A decoding constraint (grammar, JSON schema): which tokens may come next.

    `allowed` returns a boolean mask over the vocabulary, or None for "anything"; `allows` answers for one
    token exactly as `allowed()[token_id]` would (True where `allowed()` is None), and should cost far less:
    a greedy row asks it about its best token and builds the whole mask only when the answer is no, which
    gives the same token (the best allowed one). `accept` advances the state with the chosen token;
    `is_complete` says the constrained text may end here. One step may call `allows` and `allowed` in any
    order, any number of times, before `accept`.
    """

    def allowed(self) -> npt.NDArray[np.bool_] | None: ...

    def allows(self, token_id: int) -> bool: ...

    def accept(self, token_id: int) -> None: ...

    def is_complete(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # None: the engine draws one (reported back), so every stream can be replayed
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    logprobs: int | None = None  # None: off; N: the chosen token's logprob and the top N
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class Progress:
    """How far the engine got with one request's prompt, written by whoever runs it (the scheduler as it
    commits each prefill chunk to a step, an upstream client once the upstream accepted the request) and read
    by the serving side to meter a run cut short (the client left) before any final output: the prompt's
    positions prefilled or being prefilled, `cached_tokens` of them reused from the prefix cache."""

    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)  # when the request reached the server
    priority: Priority = Priority.INTERACTIVE
    tenant: str = ""
    deadline: float | None = None  # monotonic; past it the request is dropped (queued) or cut (running)
    first_token_deadline: float | None = None  # monotonic; past it, a request with no token yet is dropped
    judged: bool = True  # `deadline` is the caller's own: deadline admission may refuse by it (False: the
    # server's default or cap, which ends the request but never refuses it; engine/forecast.py)
    estimated_new_tokens: int | None = None  # new tokens expected (the serving core's cost estimate; None:
    # max_new_tokens): what deadline admission forecasts with (engine/forecast.py), never a limit
    constraint: Constraint | None = None
    progress: Progress = field(default_factory=Progress)  # one per request: never share it between requests


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Timing:
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    total_ms: float


@dataclass(slots=True)
class RequestOutput:
    """One delta of a request's output; the last one has `finished=True` and carries usage and timing."""

    request_id: str
    new_token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_string: str | None = None  # with FinishReason.STOP: the stop string that matched, when known
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    seed: int | None = None
    timing: Timing | None = None
    error: str | None = None
    error_type: str | None = None  # a failure the client is told of as this envelope type (upstream_*); None: internal
    retry_after: int | None = None  # with error_type: seconds the client should wait before trying again
