"""`POST /v1/generate`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sluicegate.api.disconnect import ClientDisconnected, unless_disconnected
from sluicegate.api.metering import from_runs
from sluicegate.api.routes.common import error_responses, json_reply, read_request
from sluicegate.protocol.generate import GenerateRequest, GenerateResponse
from sluicegate.serving import generate as serving

router = APIRouter(tags=["native"])

ERRORS = ("invalid_json", "unsupported_media_type", "body_too_large", "invalid_request", "model_not_found",
          "overloaded", "internal_error")


@router.post(
    "/v1/generate", response_model=GenerateResponse, summary="Continue a prompt",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/GenerateRequest"}}}}},
    responses=error_responses(*ERRORS),
)
async def generate(request: Request) -> Response:
    req, ctx, model = await read_request(request, GenerateRequest)
    runs = await serving.start(model, req, ctx)
    ctx.meter = lambda: from_runs(runs)  # read when the response has ended: a client that left included
    try:
        result = await unless_disconnected(request.receive, serving.complete(model, req, runs, ctx))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        runs.close()
    return json_reply(result, ctx)
