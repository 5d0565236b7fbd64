"""Rendering every failure as the one envelope, on every route.

A 500 is always `internal_error`: the detail goes to the log under the request id, nothing of it to the body.
A store failure that reaches here (SQLAlchemy's errors: the database is down, read-only, or its disk full) is
503 `store_unavailable` with Retry-After on every route, never a 500: the client's request was fine, and a
retry may well succeed (docs/errors.md). Routes that store after the work keep the answer instead
(api/routes/responses.py, predictions.py): no retryable 503 is answered after work.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluicegate.api.envelope import INTERNAL, error_response
from sluicegate.api.middleware.body_limit import BodyTooLarge
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.validation import error_from_details, validation_error
from sluicegate.refusal import Rejected
from sluicegate.serving.errors import ApiError

log = logging.getLogger("sluicegate.errors")


def store_unavailable() -> ApiError:
    return ApiError("store_unavailable", "the store cannot be read or written right now; retry", retry_after=1)


def install_error_handlers(app: FastAPI) -> None:
    async def on_refused(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Rejected)  # an ApiError, or a refusal from a layer with no HTTP in it
        return error_response(exc, context_of(request.scope).request_id)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        rid = context_of(request.scope).request_id
        if exc.status_code == 404:
            return error_response(ApiError("not_found", "no such route", code="unknown_route"), rid)
        if isinstance(exc, BodyTooLarge):  # raised while reading the body; the middleware drains the rest
            return error_response(exc.api_error(), rid)
        if exc.status_code == 405:
            err = ApiError("method_not_allowed", f"{request.method} is not allowed on this route",
                           code="wrong_method")
            err.headers = dict(exc.headers or {})
            return error_response(err, rid)
        log.error("%s unexpected HTTP %d", rid, exc.status_code)
        return error_response(ApiError("internal_error", INTERNAL), rid)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        rid = context_of(request.scope).request_id
        err = error_from_details(exc.errors(), strip=("body", "query", "path", "header"))
        return error_response(err, rid)

    async def on_store(request: Request, exc: Exception) -> JSONResponse:
        rid = context_of(request.scope).request_id
        log.error("%s the store failed: %s", rid, type(exc).__name__, exc_info=exc)
        return error_response(store_unavailable(), rid)

    app.add_exception_handler(SQLAlchemyError, on_store)
    app.add_exception_handler(Rejected, on_refused)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)


__all__ = ["error_response", "install_error_handlers", "store_unavailable", "validation_error"]
