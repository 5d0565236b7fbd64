"""Per-request context the serving layer needs, independent of the web framework."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from sluicegate.engine.types import Priority

_serial = itertools.count(1)


@dataclass(slots=True)
class RequestContext:
    request_id: str
    arrival: float = field(default_factory=time.monotonic)  # monotonic, stamped by the first middleware
    created: int = field(default_factory=lambda: int(time.time()))
    stages_ms: dict[str, float] = field(default_factory=dict)  # reported in Server-Timing
    tenant: str = ""  # whose request: the scheduler's fairness unit (the API key's id once keys are on)
    priority: Priority = Priority.INTERACTIVE  # batch jobs run at Priority.BATCH
    deadline: float | None = None  # monotonic; past it the engine drops or cuts the request
    serial: int = field(default_factory=lambda: next(_serial))  # unique in this process

    @property
    def engine_id(self) -> str:
        """The engine's key for this request's work: unique even when clients reuse an X-Request-Id."""
        return f"{self.request_id}#{self.serial}"

    def stage(self, name: str, start: float) -> float:
        """Record the time since `start` under `name`; returns now."""
        now = time.perf_counter()
        self.stages_ms[name] = self.stages_ms.get(name, 0.0) + (now - start) * 1e3
        return now
