"""The one lifecycle of a route that creates work: `parse -> prepare -> admit -> answer or stream -> close`.

Every work route (generate, predictions, chat, completions, Messages, Responses) is this function with its own
reader and surface (serving/surface.py); its error dialect is its route registry entry's (sluicegate/registry.py
`Dialect`), written as api/dialects.py maps it:

1. parse: the Idempotency-Key header (api/idempotency.py), then the route's `read` (content type, body,
   refusals by name, schema) and the served model;
2. prepare and admit: the surface's `prepare` with the request's admission (serving/admission.py): the key's
   reservation (api/middleware/ratelimit.py `reservation_of`) and, with an Idempotency-Key, its claim as the
   gate; the runs start once both pass. The context's meter then reads the runs' usage (`from_runs`), for the
   ledger and the limiter when the response has ended;
3. answer or stream: `stream: true` as server-sent events in the dialect's framing, else one answer; with an
   Idempotency-Key the work runs detached from its client and its answer is stored (api/detached.py);
   without one, a client that leaves aborts its work (499);
4. close: the runs are closed here, and only here, when the answer or the stream ends, whatever happens.

Refusals (`Rejected`: the serving layer's `ApiError` or any layer's) before the answer or the stream starts are
rendered by the dialect's `render`; a stream's mid-way errors by its `render_event`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

from sluicegate.api.dialects import rendering_of
from sluicegate.api.disconnect import ClientDisconnected, unless_disconnected
from sluicegate.api.idempotency import Held, begin, idempotency_key
from sluicegate.api.metering import from_runs
from sluicegate.api.middleware.ratelimit import reservation_of
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import json_reply
from sluicegate.api.sse import sse_response
from sluicegate.refusal import Rejected
from sluicegate.serving.admission import Admission, Gate
from sluicegate.serving.core import Runs
from sluicegate.serving.models import ServedModel
from sluicegate.serving.surface import Plan, StreamingSurface, Surface

Read = Callable[[], Awaitable[tuple[Any, ServedModel]]]  # the parsed request and the model it names
# done with a whole answer before it is sent (a stored prediction): the answer to send, which says so when keeping
# it failed (the work is done: it is delivered, never turned into a retryable error)
Keep = Callable[[BaseModel], Awaitable[BaseModel]]


async def _closing(items: AsyncIterator[BaseModel | str | None], runs: Runs) -> AsyncIterator[BaseModel | str | None]:
    try:
        async for item in items:
            yield item
    finally:
        runs.close()


async def serve(request: Request, read: Read, surface: Surface, *, keep: Keep | None = None) -> Response:
    """The lifecycle (module doc) of one work request."""
    ctx = context_of(request.scope)
    rendering = rendering_of(request.scope)  # the route registry's dialect for this path
    render = rendering.render
    held: Held | None = None
    reservation = reservation_of(request.scope)
    try:
        key = idempotency_key(request)
        req, model = await read()

        async def prepare(gate: Gate | None = None) -> Plan:
            return await surface.prepare(model, req, ctx, Admission(reservation, gate))

        if key is not None:  # the work outlives its client; its answer is stored and replayed
            held = begin(request, key, req)
            started = await held.start(prepare)
            if isinstance(started, Response):  # the key's stored answer
                return started
            plan = started
        else:
            plan = await prepare()  # started: the runs are in the engine
    except Rejected as exc:
        return render(exc, ctx.request_id)
    runs = plan.runs
    ctx.meter = lambda: from_runs(runs)  # read when the response has ended: streams and disconnects too

    if getattr(req, "stream", False):
        assert isinstance(surface, StreamingSurface)
        items = _closing(surface.stream(model, plan, ctx), runs)
        if held is not None:
            return held.stream(items, rendering.render_event, rendering.framing)
        return sse_response(items, request_id=ctx.request_id, render_error=rendering.render_event,
                            on_close=runs.close, framing=rendering.framing)

    async def finish() -> Response:
        try:
            answer = await surface.complete(model, plan, ctx)
        finally:
            runs.close()
        if keep is not None:
            answer = await keep(answer)
        return json_reply(answer, ctx)

    if held is not None:
        return await held.answer(request.receive, finish(), render)
    try:
        return await unless_disconnected(request.receive, finish())
    except ClientDisconnected:
        return Response(status_code=499)
    except Rejected as exc:
        return render(exc, ctx.request_id)
    finally:
        runs.close()  # also when the client left before `finish` ever ran


__all__ = ["serve"]
