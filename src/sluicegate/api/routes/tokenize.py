"""`POST /tokenize` and `POST /detokenize` (vLLM's shape; the `generate` scope)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sluicegate.api.routes.common import error_responses, json_reply, read_request
from sluicegate.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from sluicegate.serving import tokenize as serving

router = APIRouter(tags=["native"])

ERRORS = ("invalid_json", "unsupported_media_type", "body_too_large", "invalid_request", "model_not_found")


def _body(schema: str) -> dict[str, object]:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{schema}"}}}}}


@router.post("/tokenize", response_model=TokenizeResponse, summary="Count a prompt's or messages' tokens",
             openapi_extra=_body("TokenizeRequest"), responses=error_responses(*ERRORS))
async def tokenize(request: Request) -> Response:
    req, ctx, model = await read_request(request, TokenizeRequest)
    return json_reply(await serving.tokenize(model, req), ctx)


@router.post("/detokenize", response_model=DetokenizeResponse, summary="The text of token ids",
             openapi_extra=_body("DetokenizeRequest"), responses=error_responses(*ERRORS))
async def detokenize(request: Request) -> Response:
    req, ctx, model = await read_request(request, DetokenizeRequest)
    return json_reply(serving.detokenize(model, req), ctx)
