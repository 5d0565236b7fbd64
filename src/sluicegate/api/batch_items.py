"""The batch items' surfaces: each item body runs through the same adapter its HTTP route uses.

A chat or completions item is read exactly as `/v1/chat/completions` or `/v1/completions` reads its body
(refusals by name, the schema, the same validation messages), planned and completed by the same serving
adapter, and its answer or error shaped as that route would send it (OpenAI's statuses). Nothing streams, and
no admission is reserved: batch tokens are not charged to the key's interactive rate-limit bucket.

A refusal the item cannot fix by itself being retried (the engine's queue is full, the server is shutting
down, the model not loaded) comes back as a 503 outcome, which the worker answers by handing the item back
to run later instead of failing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ValidationError

from sluicegate.api.envelope import envelope
from sluicegate.api.metering import from_runs
from sluicegate.api.openai_errors import openai_envelope, openai_view
from sluicegate.api.validation import openai_validation_error as validation_error
from sluicegate.jobs.worker import Handler, Outcome
from sluicegate.protocol import openai_chat, openai_completions
from sluicegate.protocol.openai_chat import ChatCompletionRequest
from sluicegate.protocol.openai_common import Refusal
from sluicegate.protocol.openai_completions import CompletionRequest
from sluicegate.registry import CHAT, COMPLETIONS, PREDICTIONS
from sluicegate.serving import openai_chat as chat
from sluicegate.serving import openai_completions as completions
from sluicegate.serving import predictions
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel

RETRY_LATER = frozenset({"overloaded", "shutting_down", "not_ready"})


def _parse(data: Any, schema: type[BaseModel], refuse: Callable[[Mapping[str, Any]], Refusal | None]) -> Any:
    if not isinstance(data, dict):
        raise ApiError("invalid_request", "the body must be a JSON object", code="wrong_type")
    refused = refuse(data)
    if refused is not None:
        raise ApiError("invalid_request", refused.message, param=refused.param, code=refused.code)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data) from None


Served = Callable[[str | None], ServedModel]  # the model a request names (None: the default), as routes resolve it


def _openai(served: Served, schema: type[BaseModel],
            refuse: Callable[[Mapping[str, Any]], Refusal | None], surface: ModuleType) -> Handler:
    async def run(body: str, ctx: RequestContext) -> Outcome:
        try:
            req = _parse(json.loads(body), schema, refuse)
            model = served(req.model)  # the model the item names: local or an upstream's
            plan = await surface.prepare(model, req, ctx)
            try:
                answer = await surface.complete(model, plan, ctx)
            finally:
                plan.runs.close()
            return Outcome(200, answer.model_dump(mode="json"), from_runs(plan.runs))
        except ApiError as exc:
            status = 503 if exc.type in RETRY_LATER else openai_view(exc)[0]
            return Outcome(status, openai_envelope(exc, ctx.request_id))

    return run


def _prediction(served: Served) -> Handler:
    """A prediction request, as `POST /v1/predictions` runs it (serving/predictions.py)."""

    async def run(body: str, ctx: RequestContext) -> Outcome:
        try:
            req = predictions.parse(json.loads(body))
            model = served(req.model)
            plan = await predictions.start(model, req, ctx)
            try:
                answer = await predictions.complete(model, plan, ctx)
            finally:
                plan.runs.close()
            return Outcome(200, answer.model_dump(mode="json"), from_runs(plan.runs))
        except ApiError as exc:
            return Outcome(503 if exc.type in RETRY_LATER else exc.status, envelope(exc, ctx.request_id))

    return run


def handlers(served: Served) -> dict[str, Handler]:
    """A handler for each route batch items may run on (the route registry's `batch`), by its path."""
    return {
        CHAT.path: _openai(served, ChatCompletionRequest, openai_chat.chat_refusal, chat),
        COMPLETIONS.path: _openai(served, CompletionRequest, openai_completions.completion_refusal, completions),
        PREDICTIONS.path: _prediction(served),
    }

