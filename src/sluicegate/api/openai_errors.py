"""Errors on the OpenAI-compatible routes: the same envelope, with OpenAI's statuses and types.

The official `openai` client picks its exception class from the status alone (400 BadRequestError, 401
AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 422 UnprocessableEntityError, 429
RateLimitError, >=500 InternalServerError), and reads `type`, `code` and `param` from the body. So on these
routes every 400/422 of ours is a 400 `invalid_request_error` whose `code` is our specific kind (our `code`
for a generic `invalid_request`, else our `type`, e.g. `context_length_exceeded` as OpenAI spells it); an
unknown model is 404 `invalid_request_error` / `model_not_found`, an unknown stored response 404
`invalid_request_error` / `response_not_found`; everything else keeps its status and type.
The body keeps one shape everywhere, `request_id` included; this module only maps.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from sluicegate.api.envelope import envelope, http_headers, http_status
from sluicegate.refusal import Rejected


def openai_view(exc: Rejected) -> tuple[int, str, str | None]:
    """(status, type, code) of an error as the OpenAI-compatible routes render it."""
    if exc.type == "model_not_found":
        return 404, "invalid_request_error", "model_not_found"
    if exc.type == "not_found":  # a stored object (a response) this key does not have, as OpenAI answers it
        return 404, "invalid_request_error", exc.code or "not_found"
    status = http_status(exc)
    if status in (400, 422):
        return (
            400,
            "invalid_request_error",
            (exc.code or exc.type) if exc.type == "invalid_request" else exc.type,
        )
    return status, exc.type, exc.code


def openai_envelope(exc: Rejected, request_id: str) -> dict[str, Any]:
    body: dict[str, Any] = envelope(exc, request_id)
    _, body["error"]["type"], body["error"]["code"] = openai_view(exc)
    return body


def openai_error_response(exc: Rejected, request_id: str) -> JSONResponse:
    return JSONResponse(openai_envelope(exc, request_id), status_code=openai_view(exc)[0],
                        headers=http_headers(exc))
