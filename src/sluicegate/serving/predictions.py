"""Predictions, an adapter on the serving core: a request body in, the prediction record out.

Callable without HTTP: `POST /v1/predictions` and the batch job system both run a prediction request through
here, so an item in a job is validated, admitted, run and shaped exactly as a request is.

    req = parse(data)                          # ApiError (422, parameter named) for a bad body
    record = await predict(model, req, ctx)    # runs to its end; ApiError for a refusal or engine failure

`prepare` and `complete` are the two halves (`predict` is both, closing the runs whatever happens), for a caller
that must hold the started runs (the work lifecycle, api/work.py: an Idempotency-Key's work outlives its client).
The caller sets the context's priority (batch items: `Priority.BATCH`) and tenant, and passes the admission
(serving/admission.py); `ctx.created` stamps `created_at`.

`input.prompt` is tokenised as `/v1/generate` does (`options.parse_special` applies to it); `input.messages`
goes through the model's chat template as chat completions do (client text is never parsed for control tokens).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from pydantic import ValidationError

from sluicegate.engine import FinishReason, RequestOutput
from sluicegate.protocol.predictions import (
    Prediction,
    PredictionModel,
    PredictionRequest,
    PredictionResult,
    PredictionTiming,
    PredictionUsage,
)
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.chat_template import render, template_for
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import Runs, check_text_bytes, check_tokens, collect_finished, start_runs
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel, check_text
from sluicegate.serving.validation import validation_error

ID_PREFIX = "pred_"


def new_id() -> str:
    return ID_PREFIX + secrets.token_hex(12)


def rfc3339(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse(data: Any) -> PredictionRequest:
    """A prediction request from parsed JSON: the schema's strict rules, and exactly one kind of input."""
    if not isinstance(data, dict):
        raise ApiError("invalid_request", "a prediction request must be a JSON object", code="wrong_type")
    try:
        req = PredictionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    check(req)
    return req


def check(req: PredictionRequest) -> None:
    """The rules the schema cannot say: one kind of input; `parse_special` only where there is a prompt."""
    inp = req.input
    if (inp.prompt is None) == (inp.messages is None):
        raise ApiError("invalid_request", "input takes exactly one of prompt or messages", param="input",
                       code="invalid_combination")
    if inp.messages is not None and "parse_special" in req.options.model_fields_set and req.options.parse_special:
        raise ApiError("invalid_request", "options.parse_special applies to input.prompt only (a chat "
                       "template decides the control tokens of messages)", param="options.parse_special",
                       code="invalid_combination")


@dataclass(slots=True)
class PredictionPlan:
    req: PredictionRequest
    runs: Runs


async def _prompt_ids(model: ServedModel, req: PredictionRequest, ctx: RequestContext) -> tuple[list[int], str]:
    """The prompt's token ids, and the parameter that names it."""
    t = time.perf_counter()
    if req.input.prompt is not None:
        prompt, special = req.input.prompt, req.options.parse_special
        check_text_bytes(model, prompt, "input.prompt", parse_special=special)  # before tokenising
        ids = await model.tokenize(prompt, parse_special=special)
        ctx.record.stage("tokenize", t)
        return ids, "input.prompt"
    assert req.input.messages is not None
    template = template_for(model, "input.messages")
    n_bytes = sum(check_text(m.content, f"input.messages[{i}].content")
                  for i, m in enumerate(req.input.messages))
    model.token_budget.check_prompt_bytes(n_bytes, param="input.messages")
    messages = [{"role": m.role, "content": m.content} for m in req.input.messages]
    prompt_ids = (await render(model, template, messages, None, param="input.messages")).token_ids
    ctx.record.stage("tokenize", t)
    return prompt_ids, "input.messages"


async def prepare(model: ServedModel, req: PredictionRequest, ctx: RequestContext,
                  admission: Admission = OPEN) -> PredictionPlan:
    """Resolve the model, build the prompt, check the budget, admit and start the one run."""
    check(req)
    model.resolve(req.model)
    ids, prompt_param = await _prompt_ids(model, req, ctx)
    opts = req.options
    check_tokens(model, len(ids), opts.max_new_tokens, prompt_param=prompt_param,
                 new_param="options.max_new_tokens")
    runs = await start_runs(model, ctx, [ids], opts.to_sampling_params(), requested_new=opts.max_new_tokens,
                            new_param="options.max_new_tokens", admission=admission)
    return PredictionPlan(req, runs)


def shape(model: ServedModel, req: PredictionRequest, out: RequestOutput, token_ids: list[int], text: str,
          *, prediction_id: str, created: float) -> Prediction:
    if out.finish_reason is None or out.finish_reason is FinishReason.ERROR or out.timing is None:
        raise RuntimeError(out.error or "the engine returned no result")
    finish = cast(Literal["length", "stop", "eos", "cancelled"], out.finish_reason.value)
    ident, tm = model.identity, out.timing
    return Prediction(
        id=prediction_id, created_at=rfc3339(created),
        model=PredictionModel(ref=ident.ref, name=ident.name, version=ident.version, digest=ident.digest),
        metadata=dict(req.metadata),
        result=PredictionResult(text=text, token_ids=token_ids, finish_reason=finish,
                                seed=None if req.options.temperature == 0.0 else out.seed),
        usage=PredictionUsage(input_tokens=out.prompt_tokens, cached_tokens=out.cached_tokens,
                              output_tokens=out.completion_tokens, compute_ms=tm.prefill_ms + tm.decode_ms),
        warnings=req.options.warnings(n_vocab=model.limits.n_vocab),
        timing=PredictionTiming(queue_ms=tm.queue_ms, prefill_ms=tm.prefill_ms, decode_ms=tm.decode_ms,
                                total_ms=tm.total_ms),
    )


async def complete(model: ServedModel, plan: PredictionPlan, ctx: RequestContext, *,
                   prediction_id: str | None = None) -> Prediction:
    """Run the started run to its end and shape the record (`prediction_id`: a fresh one when None)."""
    (result,) = await collect_finished(plan.runs, ctx)
    assert result.final is not None
    return shape(model, plan.req, result.final, result.token_ids, result.text,
                 prediction_id=prediction_id or new_id(), created=ctx.created)


async def predict(model: ServedModel, req: PredictionRequest, ctx: RequestContext, *,
                  prediction_id: str | None = None) -> Prediction:
    """Start and complete one prediction; the run is aborted if the caller is cancelled first."""
    plan = await prepare(model, req, ctx)
    try:
        return await complete(model, plan, ctx, prediction_id=prediction_id)
    finally:
        plan.runs.close()
