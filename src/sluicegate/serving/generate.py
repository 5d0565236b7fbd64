"""`/v1/generate`: validate -> budget -> submit -> shape."""

from __future__ import annotations

import time

from sluicegate.engine import EngineOverloaded, EngineRequest, EngineStopped, FinishReason, RequestOutput
from sluicegate.protocol.common import ModelInfo, PromptTokensDetails, StageTiming, Usage
from sluicegate.protocol.generate import GenerateRequest, GenerateResponse
from sluicegate.serving.budget import check_budget
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
    t = time.perf_counter()
    check_text(req.prompt, "prompt")
    ids = await model.tokenize(req.prompt)
    t = ctx.stage("tokenize", t)
    check_budget(len(ids), req.max_new_tokens, n_ctx=model.limits.n_ctx)
    return EngineRequest(ctx.request_id, ids, req.to_sampling_params(), arrival=ctx.arrival, tenant=ctx.tenant)


def shape(model: ServedModel, req: GenerateRequest, out: RequestOutput, ctx: RequestContext) -> GenerateResponse:
    if out.finish_reason is FinishReason.ERROR or out.timing is None:
        raise RuntimeError(out.error or "the engine returned no result")
    ident = model.identity
    return GenerateResponse(
        id=ctx.request_id, created=ctx.created, model=ModelInfo(name=ident.name, version=ident.version, digest=ident.digest),
        text=out.text, token_ids=out.new_token_ids, finish_reason=out.finish_reason.value,
        seed=None if req.temperature == 0.0 else out.seed,
        usage=Usage(
            prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
            total_tokens=out.prompt_tokens + out.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens),
        ),
        warnings=req.warnings(),
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
