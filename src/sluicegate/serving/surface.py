"""The typed surface every work route and batch item runs through (its lifecycle: api/work.py).

A surface is a serving adapter (serving/generate.py, predictions.py, openai_chat.py, openai_completions.py,
anthropic_messages.py, openai_responses.py; or an object binding one to a request, as the Responses route does):

- `prepare(model, req, ctx, admission)`: check the parsed request against the model, convert it once to token
  ids and one `SamplingParams`, pass its admission (serving/admission.py) and start the runs; returns a plan
  that holds them (`plan.runs`);
- `complete(model, plan, ctx)`: the runs to their end, shaped into the surface's one answer;
- `stream(model, plan, ctx)` (a `StreamingSurface`): the runs as the surface's stream items, `None` as a
  heartbeat cue.

The plan's runs are closed by one owner: whoever called `prepare` (the route lifecycle, or `answer` below for a
caller with no client to stream to: batch items, `predictions.predict`). Closing aborts what is still running
and is safe to repeat; `Runs.events` also aborts what a reader leaves (the core's own guard).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import Runs
from sluicegate.serving.models import ServedModel


class Plan(Protocol):
    """A started request: its runs, and whatever the surface needs to shape their outputs."""

    @property
    def runs(self) -> Runs: ...


@runtime_checkable
class Surface(Protocol):
    """A work surface that answers once (module doc)."""

    async def prepare(self, model: ServedModel, req: Any, ctx: RequestContext, admission: Admission) -> Plan: ...

    async def complete(self, model: ServedModel, plan: Any, ctx: RequestContext) -> BaseModel: ...


@runtime_checkable
class StreamingSurface(Surface, Protocol):
    """A work surface that also streams (`stream: true`)."""

    def stream(self, model: ServedModel, plan: Any, ctx: RequestContext) -> Any: ...


async def answer(surface: Surface, model: ServedModel, req: Any, ctx: RequestContext,
                 admission: Admission = OPEN) -> tuple[BaseModel, Runs]:
    """Prepare, then complete, with no client to stream to: the answer, and the runs (for their usage), closed
    whatever happens."""
    plan = await surface.prepare(model, req, ctx, admission)
    runs = plan.runs
    try:
        return await surface.complete(model, plan, ctx), runs
    finally:
        runs.close()


__all__ = ["Plan", "StreamingSurface", "Surface", "answer"]
