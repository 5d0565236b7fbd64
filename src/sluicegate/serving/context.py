"""Per-request context the serving layer needs, independent of the web framework."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sluicegate.engine.types import Priority, RequestOutput, Timing

_serial = itertools.count(1)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """What one request cost, as the engine counted it: recorded in the usage ledger, settled by rate limits."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0

    @property
    def charged(self) -> int:
        """The tokens rate limits and monthly budgets count: prompt plus generated (cached ones included)."""
        return self.prompt_tokens + self.generated_tokens


@dataclass(frozen=True, slots=True)
class Bound:
    """One deadline: when (monotonic), the budget it came from (after the server's cap), and whose it is."""

    at: float
    budget_s: float
    source: str  # a header's name, or the server's setting (serving/deadline.py)


@dataclass(frozen=True, slots=True)
class Deadlines:
    """A request's deadlines, from the caller's budget and the server's limits (serving/deadline.py).

    A whole answer and a stream may differ: an SDK's read timeout bounds a whole answer, but only a stream's
    first token (heartbeats reset the client's timer after that)."""

    answer: Bound | None  # a whole (non-streamed) answer
    stream: Bound | None  # a stream, to its end
    first_token: Bound | None  # a stream's first token


@dataclass(slots=True)
class AccessRecord:
    """What the access log and Server-Timing report of one request, kept apart from who and what it is: the
    request-context middleware (api/middleware/request_context.py) makes it and reads it when the answer starts
    and ends; the layers below record into it through `RequestContext.record`."""

    stages_ms: dict[str, float] = field(default_factory=dict)  # reported in Server-Timing, in recording order
    finals: Sequence[RequestOutput | None] = ()  # each engine run's last output once it ends (the access log)

    def stage(self, name: str, start: float) -> float:
        """Record the time since `start` (perf_counter) under `name`; returns now."""
        now = time.perf_counter()
        self.stages_ms[name] = self.stages_ms.get(name, 0.0) + (now - start) * 1e3
        return now

    def engine(self, timing: Timing) -> None:
        """Record the engine's own stage times (queue, prefill, decode) of a run."""
        self.stages_ms.update(queue=timing.queue_ms, prefill=timing.prefill_ms, decode=timing.decode_ms)


@dataclass(slots=True)
class RequestContext:
    request_id: str
    arrival: float = field(default_factory=time.monotonic)  # monotonic, stamped by the first middleware
    created: int = field(default_factory=lambda: int(time.time()))
    tenant: str = ""  # whose request: the scheduler's fairness unit (the API key's id once keys are on)
    priority: Priority = Priority.INTERACTIVE  # batch jobs run at Priority.BATCH
    deadline: float | None = None  # monotonic; past it the engine drops or cuts the request
    first_token_deadline: float | None = None  # monotonic; a stream with no token by then is dropped
    deadlines: Deadlines | None = None  # how they were set (api/middleware/deadline.py); None: no budget given
    key_id: str | None = None  # the authenticated key; None when the store holds no key (auth off)
    scopes: frozenset[str] = frozenset()  # what the key may do (auth off: every scope)
    meter: Callable[[], TokenUsage] | None = None  # set once its work started (api/work.py): read by `used()`
    serial: int = field(default_factory=lambda: next(_serial))  # unique in this process
    record: AccessRecord = field(default_factory=AccessRecord)  # stage times and run outcomes (the access log)
    supplied_id: bool = False  # `request_id` is the caller's own X-Request-Id, not one the server made

    @property
    def ledger_id(self) -> str:
        """The id the usage ledger records: the request id, qualified by the key when the caller chose it
        (`key_...:ID`), so a caller sending another key's request id never shares a row's id with it."""
        if self.supplied_id and self.key_id:
            return f"{self.key_id}:{self.request_id}"
        return self.request_id

    def used(self) -> TokenUsage:
        """What the request cost, read when its response has ended (streams and a client that left included):
        the one figure the usage ledger records and the rate limit settles with; zeros when no work started."""
        if self.meter is None:
            return TokenUsage()
        try:
            return self.meter()
        except Exception:  # a meter over runs that never started: nothing was processed
            return TokenUsage()

    @property
    def engine_id(self) -> str:
        """The engine's key for this request's work: unique even when clients reuse an X-Request-Id."""
        return f"{self.request_id}#{self.serial}"

    def streaming(self) -> None:
        """The request is answered as a stream: its deadlines become a stream's (the serving core calls this
        before the engine sees the request; the upstream client reads the same fields)."""
        d = self.deadlines
        if d is not None:
            self.deadline = None if d.stream is None else d.stream.at
            self.first_token_deadline = None if d.first_token is None else d.first_token.at
