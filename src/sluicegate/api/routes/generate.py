"""`POST /v1/generate`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sluicegate.api.disconnect import ClientDisconnected, unless_disconnected
from sluicegate.api.envelope import error_response
from sluicegate.api.idempotency import begin, idempotency_key
from sluicegate.api.metering import from_runs
from sluicegate.api.routes.common import error_responses, json_reply, read_request, work_doc
from sluicegate.protocol.generate import GenerateRequest, GenerateResponse
from sluicegate.serving import generate as serving
from sluicegate.serving.core import Runs

router = APIRouter(tags=["native"])

ERRORS = ("invalid_json", "unsupported_media_type", "body_too_large", "invalid_request", "deadline_too_short",
          "model_not_found", "idempotency_key_in_use", "overloaded", "deadline_exceeded", "internal_error")


@router.post(
    "/v1/generate", response_model=GenerateResponse, summary="Continue a prompt",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/GenerateRequest"}}}}, **work_doc()},
    responses=error_responses(*ERRORS),
)
async def generate(request: Request) -> Response:
    key = idempotency_key(request)
    req, ctx, model = await read_request(request, GenerateRequest)

    async def start() -> Runs:
        runs = await serving.start(model, req, ctx)
        ctx.meter = lambda: from_runs(runs)  # read when the response has ended: a client that left included
        return runs

    async def finish(runs: Runs) -> Response:
        try:
            return json_reply(await serving.complete(model, req, runs, ctx), ctx)
        finally:
            runs.close()

    if key is not None:  # the work outlives its client; its answer is stored and replayed (api/idempotency.py)
        held = begin(request, key, req)
        started = await held.start(start)
        if isinstance(started, Response):  # the key's stored answer
            return started
        return await held.answer(request.receive, finish(started), error_response)
    runs = await start()
    try:
        return await unless_disconnected(request.receive, finish(runs))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        runs.close()  # also when the client left before `finish` ever ran
