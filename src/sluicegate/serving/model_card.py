"""What `GET /v1/models/{id}` says of the served model beyond OpenAI's fields: identity, every limit with
its number, the schemas and defaults of a prediction, how it reads a conversation."""

from __future__ import annotations

import time

from sluicegate.config import Config
from sluicegate.protocol.generate import GenerateOptions
from sluicegate.protocol.openai_models import ChatInfo, KvInfo, ModelDetails, ModelLimits, ModelSchemas, ModelState
from sluicegate.protocol.predictions import input_schema, options_schema
from sluicegate.serving.chat_template import chat_format
from sluicegate.serving.models import ServedModel


def kv_info(model: ServedModel) -> KvInfo:
    lim = model.limits
    exact = [name for name, holds in (("batching", lim.batch_invariant), ("decoded_kv", lim.decoded_kv_exact),
                                      ("drafts", lim.drafts_exact)) if holds and not model.upstream]
    found = getattr(model.runner, "invariance", None)  # measured at load (backends/invariance.py)
    withdrawn = getattr(model.runner, "withdrawn", ())
    return KvInfo(slots=lim.n_slots, bytes_per_slot=lim.kv_bytes_per_slot or None, sliding_window=lim.sliding_window,
                  exact=exact, inexact=found.why if found is not None and withdrawn else None)


def chat_info(model: ServedModel) -> ChatInfo:
    fmt = chat_format(model)
    caps = fmt.caps
    renders = [k for k in ("system", "tools", "tool_calls", "tool_responses") if getattr(caps, k)]
    return ChatInfo(
        template=None if fmt.template is None else ("file" if fmt.source == "file" else "model"),
        tool_format=fmt.tools.name, template_renders=renders if fmt.template is not None else [],
        reasoning=None if fmt.reasoning is None else [fmt.reasoning.start, fmt.reasoning.end],
    )

STARTED = int(time.time())


def describe(model: ServedModel, config: Config, requested: str | None, state: ModelState = "loaded") -> ModelDetails:
    """The card of the model `requested` names (model_not_found otherwise); `state`: loaded, loading, unloaded."""
    ident = model.resolve(requested)
    budget, jobs = model.token_budget, config.jobs
    n_ctx = model.limits.n_ctx
    return ModelDetails(
        id=ident.name, created=STARTED, state=state, name=ident.name, version=ident.version, ref=ident.ref,
        digest=ident.digest,
        versions=[ident.version], aliases=[ident.name, ident.ref], context_window=n_ctx,
        limits=ModelLimits(
            max_body_bytes=config.limits.max_body_bytes,
            max_prompt_tokens=budget.prompt_limit,
            max_new_tokens=min(n_ctx - 1, budget.max_new_tokens or n_ctx - 1),
            max_batch_items=jobs.max_items_per_job, max_file_bytes=jobs.max_file_bytes,
            max_stored_bytes=jobs.max_stored_bytes,
            max_concurrent_jobs=jobs.max_concurrent_jobs, max_enqueued_tokens=jobs.max_enqueued_tokens,
        ),
        schemas=ModelSchemas(input=input_schema(), options=options_schema()),
        defaults={"model": ident.ref, "options": GenerateOptions.model_validate({}).model_dump(mode="json"),
                  "metadata": {}},
        chat=chat_info(model),
        kv=kv_info(model),
    )
