"""`/v1/generate`: validate -> budget -> submit -> shape."""

from __future__ import annotations

import time
from typing import Literal, cast

from sluicegate.engine import EngineOverloaded, EngineRequest, EngineStopped, FinishReason, RequestOutput
from sluicegate.protocol.common import ModelInfo, PromptTokensDetails, StageTiming, Usage
from sluicegate.protocol.generate import GenerateRequest, GenerateResponse
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel, check_text


def engine_error(exc: Exception) -> ApiError:
    """Map the engine's refusals to the envelope."""
    if isinstance(exc, EngineOverloaded):
        return ApiError("overloaded", str(exc), retry_after=exc.retry_after, code="queue_full")
    if isinstance(exc, EngineStopped):
        return ApiError("shutting_down", str(exc), retry_after=5)
    raise exc


async def prepare(model: ServedModel, req: GenerateRequest, ctx: RequestContext) -> EngineRequest:
    model.resolve(req.model)
    budget = model.token_budget
    t = time.perf_counter()
    budget.check_prompt_bytes(check_text(req.prompt, "prompt"))  # a huge prompt is refused untokenised
    ids = await model.tokenize(req.prompt)
    t = ctx.stage("tokenize", t)
    budget.check(len(ids), req.max_new_tokens)
    params = req.to_sampling_params()
    return EngineRequest(ctx.engine_id, ids, params, arrival=ctx.arrival, tenant=ctx.tenant)


def shape(
    model: ServedModel, req: GenerateRequest, out: RequestOutput, ctx: RequestContext,
) -> GenerateResponse:
    if out.finish_reason is None or out.finish_reason is FinishReason.ERROR or out.timing is None:
        raise RuntimeError(out.error or "the engine returned no result")
    finish = cast(Literal["length", "stop", "eos", "cancelled"], out.finish_reason.value)
    ident = model.identity
    return GenerateResponse(
        id=ctx.request_id, created=ctx.created,
        model=ModelInfo(name=ident.name, version=ident.version, digest=ident.digest),
        text=out.text, token_ids=out.new_token_ids, finish_reason=finish,
        seed=None if req.temperature == 0.0 else out.seed,
        usage=Usage(
            prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
            total_tokens=out.prompt_tokens + out.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens),
        ),
        warnings=req.warnings(n_vocab=model.limits.n_vocab),
        timing=StageTiming(
            queue_ms=out.timing.queue_ms, prefill_ms=out.timing.prefill_ms, decode_ms=out.timing.decode_ms,
            total_ms=out.timing.total_ms,
        ),
    )


async def generate(model: ServedModel, req: GenerateRequest, ctx: RequestContext) -> GenerateResponse:
    engine_req = await prepare(model, req, ctx)
    try:
        out = await model.engine.generate(engine_req)
    except (EngineOverloaded, EngineStopped) as exc:
        raise engine_error(exc) from None
    for name in ("queue", "prefill", "decode"):
        ctx.stages_ms[name] = getattr(out.timing, f"{name}_ms", 0.0)
    return shape(model, req, out, ctx)
