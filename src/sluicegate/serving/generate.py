"""`/v1/generate`, an adapter on the serving core: the request's one conversion, and the response's shape."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, cast

from sluicegate.engine import FinishReason, RequestOutput
from sluicegate.protocol.common import ModelInfo, PromptTokensDetails, StageTiming, Usage
from sluicegate.protocol.generate import GenerateRequest, GenerateResponse
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import Runs, check_text_bytes, check_tokens, collect_finished, start_runs
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel


@dataclass(frozen=True, slots=True)
class GeneratePlan:
    req: GenerateRequest
    runs: Runs


async def prepare(model: ServedModel, req: GenerateRequest, ctx: RequestContext,
                  admission: Admission = OPEN) -> GeneratePlan:
    """Validate against the model, tokenise, check the budget, admit and start the one run."""
    model.resolve(req.model)
    t = time.perf_counter()
    check_text_bytes(model, req.prompt, "prompt", parse_special=req.parse_special)  # before tokenising
    ids = await model.tokenize(req.prompt, parse_special=req.parse_special)
    ctx.record.stage("tokenize", t)
    check_tokens(model, len(ids), req.max_new_tokens, prompt_param="prompt", new_param="max_new_tokens")
    if not model.token_ids:
        raise ApiError(
            "invalid_request", f"model {model.identity.name} is served by an upstream engine that does not return "
            "token ids, which /v1/generate answers with; use /v1/completions for it", param="model",
            code="unsupported_for_model")
    runs = await start_runs(model, ctx, [ids], req.to_sampling_params(), requested_new=req.max_new_tokens,
                            new_param="max_new_tokens", admission=admission)
    return GeneratePlan(req, runs)


def shape(
    model: ServedModel, req: GenerateRequest, out: RequestOutput, token_ids: list[int], text: str,
    ctx: RequestContext,
) -> GenerateResponse:
    if out.finish_reason is None or out.finish_reason is FinishReason.ERROR or out.timing is None:
        raise RuntimeError(out.error or "the engine returned no result")
    finish = cast(Literal["length", "stop", "eos", "cancelled"], out.finish_reason.value)
    ident = model.identity
    return GenerateResponse(
        id=ctx.request_id, created=ctx.created,
        model=ModelInfo(name=ident.name, version=ident.version, digest=ident.digest),
        text=text, token_ids=token_ids, finish_reason=finish,
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


async def complete(model: ServedModel, plan: GeneratePlan, ctx: RequestContext) -> GenerateResponse:
    """Run the started run to its end and shape the response."""
    (result,) = await collect_finished(plan.runs, ctx)
    assert result.final is not None
    return shape(model, plan.req, result.final, result.token_ids, result.text, ctx)
