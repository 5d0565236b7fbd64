"""The batch items' surfaces: each item body runs through the same adapter its HTTP route uses.

A chat or completions item is read exactly as `/v1/chat/completions` or `/v1/completions` reads its body
(refusals by name, the schema, the same validation messages), planned and completed by the same serving
adapter, and its answer or error shaped as that route would send it (OpenAI's statuses). Nothing streams, and
batch tokens are not charged to the key's interactive rate-limit bucket; they do count against the key's
monthly budget (`monthly_tokens`): an item is reserved against it as an interactive request is, and one the
budget cannot hold fails with 429 `budget_exceeded` (its job goes on: later items may fit in a new month).

A refusal the item cannot fix by itself being retried (the engine's queue is full, the server is shutting
down, the model not loaded) comes back as a 503 outcome, which the worker answers by handing the item back
to run later instead of failing it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from sluicegate.api.dialects import RENDERING
from sluicegate.api.metering import from_runs
from sluicegate.api.middleware.ratelimit import KeyAdmission
from sluicegate.api.validation import openai_validation_error as validation_error
from sluicegate.jobs.worker import Handler, ItemResult
from sluicegate.protocol import openai_chat, openai_completions
from sluicegate.protocol.openai_chat import ChatCompletionRequest
from sluicegate.protocol.openai_common import FieldRefusal
from sluicegate.protocol.openai_completions import CompletionRequest
from sluicegate.refusal import Rejected
from sluicegate.registry import CHAT, COMPLETIONS, PREDICTIONS, Dialect
from sluicegate.serving import openai_chat as chat
from sluicegate.serving import openai_completions as completions
from sluicegate.serving import predictions
from sluicegate.serving.admission import Admission
from sluicegate.serving.context import RequestContext, TokenUsage
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel
from sluicegate.serving.surface import Surface, answer
from sluicegate.tenancy.keys import KeyRecord

if TYPE_CHECKING:
    from sluicegate.api.tenancy import Tenancy

RETRY_LATER = frozenset({"overloaded", "shutting_down", "not_ready"})
M = TypeVar("M", bound=BaseModel)


def parse_openai(data: Any, schema: type[M], refuse: Callable[[Mapping[str, Any]], FieldRefusal | None]) -> M:
    """A body parsed from JSON, read as the OpenAI-shaped routes (api/routes/openai.py `read_openai`) and their
    batch items read it: an object, its unsupported fields refused by name, then the schema."""
    if not isinstance(data, dict):
        raise ApiError("invalid_request", "the body must be a JSON object", code="wrong_type")
    refused = refuse(data)
    if refused is not None:
        raise ApiError("invalid_request", refused.message, param=refused.param, code=refused.code)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data) from None


# the model a request names (None: the default) within a deadline (monotonic), loaded, as routes acquire it
Served = Callable[[str | None, float | None], Awaitable[ServedModel]]
Leases = Callable[[], AbstractAsyncContextManager[None]]  # holds what `Served` hands out (api/local_models.py)
Parse = Callable[[Any], Any]  # an item's body, parsed from JSON, into the surface's request


def _item(served: Served, parse: Parse, surface: Surface, dialect: Dialect, tenancy: Tenancy | None,
          leases: Leases) -> Handler:
    """An item as its route runs it: parsed, prepared (its key's monthly budget reserved, nothing else) and
    completed by the same adapter (serving/surface.py `answer` closes its runs), its error shaped as the route
    sends it (the route's registry `dialect`: its status and its body, api/dialects.py)."""
    rendering = RENDERING[dialect]

    async def run(body: str, ctx: RequestContext, key: KeyRecord | None) -> ItemResult:
        budget = None
        if tenancy is not None and key is not None and key.monthly_tokens is not None:
            budget = KeyAdmission(tenancy.limiter, key.id, None, tenancy.budgets, key.monthly_tokens)
        used = TokenUsage()
        try:
            req = parse(json.loads(body))
            async with leases():  # the model stays loaded until the item's answer is made
                model = await served(req.model, ctx.deadline)  # the model the item names: local or an upstream's
                result, runs = await answer(surface, model, req, ctx, Admission(reservation=budget))
            used = from_runs(runs)
            return ItemResult(200, result.model_dump(mode="json"), used)
        except Rejected as exc:
            status, error = rendering.status(exc), rendering.render_event(exc, ctx.request_id)
            return ItemResult(503 if exc.type in RETRY_LATER else status, error)
        finally:
            if budget is not None:
                await budget.settle(used)

    return run


def handlers(served: Served, tenancy: Tenancy | None = None, leases: Leases = nullcontext) -> dict[str, Handler]:
    """A handler for each route batch items may run on (the route registry's `batch`), by its path; `tenancy`:
    the monthly budgets items reserve against (None: none); `leases`: the scope that holds an item's model."""
    return {
        CHAT.path: _item(served, lambda data: parse_openai(data, ChatCompletionRequest, openai_chat.chat_refusal),
                         chat, CHAT.dialect, tenancy, leases),
        COMPLETIONS.path: _item(served, lambda data: parse_openai(data, CompletionRequest,
                                                                  openai_completions.completion_refusal),
                                completions, COMPLETIONS.dialect, tenancy, leases),
        PREDICTIONS.path: _item(served, predictions.parse, predictions, PREDICTIONS.dialect, tenancy, leases),
    }
