"""`POST /v1/generate`: the work lifecycle (api/work.py) over the generate adapter (serving/generate.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sluicegate.api.routes.common import error_responses, read_work, work_doc
from sluicegate.api.work import serve
from sluicegate.protocol.generate import GenerateRequest, GenerateResponse
from sluicegate.serving import generate as serving

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
    return await serve(request, lambda: read_work(request, GenerateRequest), serving)
