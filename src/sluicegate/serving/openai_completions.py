"""`/v1/completions`: validate -> tokenise -> budget -> submit -> shape.

Several prompts and n > 1 multiply: choice `p * n + i` is run i of prompt p (OpenAI's order). `echo` puts the
prompt's text before the completion (its logprobs are not computed, so echo with logprobs is refused).
`suffix` means fill-in-the-middle: the prompt becomes `<fim_prefix>prompt<fim_suffix>suffix<fim_middle>` with
the model's own FIM control tokens; a model without them refuses `suffix` rather than ignore it.

Prompt text is tokenised with special-token parsing (`parse_special`, default true), as llama.cpp's server
and vLLM do: the caller owns the whole prompt, so `<|im_start|>` in it is the model's control token, not ten
characters of text (docs/openai.md). An adapter on the serving core (serving/core.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sluicegate.backends.base import Tokenizer
from sluicegate.engine import RequestOutput, TokenLogprob
from sluicegate.protocol.openai_completions import (
    MAX_PROMPTS,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from sluicegate.serving.admission import OPEN, Admission
from sluicegate.serving.context import RequestContext
from sluicegate.serving.core import Runs, check_text_bytes, check_tokens, collect_finished, start_runs
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel, check_text
from sluicegate.serving.openai_common import (
    CompletionLogprobState,
    TextDeltas,
    arrivals,
    check_token_ids,
    fingerprint,
    openai_finish,
    record_user,
    sampling_params,
    usage,
)
from sluicegate.serving.structured import completion_grammar
from sluicegate.serving.validation import refused

FIM_STYLES = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder, DeepSeek-Coder-like
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma-like
)


def fim_tokens(runner: Tokenizer) -> tuple[int, int, int] | None:
    """The model's (prefix, suffix, middle) control tokens, if its vocabulary has one of the known styles."""
    for style in FIM_STYLES:
        ids = [runner.tokenize(t, add_special=False, parse_special=True) for t in style]
        if all(len(x) == 1 and not runner.token_bytes(x[0]) for x in ids):
            return ids[0][0], ids[1][0], ids[2][0]
    return None


@dataclass(slots=True)
class CompletionPlan:
    request: CompletionRequest
    prompt_texts: list[str]  # one per prompt (for echo)
    runs: Runs
    model_ref: str
    fingerprint: str

    def prompt_of(self, choice: int) -> int:
        return choice // self.request.n


async def _prompt_ids(model: ServedModel, req: CompletionRequest) -> tuple[list[list[int]], list[str]]:
    runner = model.runner
    n_vocab = model.limits.n_vocab
    fim = None
    if req.suffix is not None:
        fim = fim_tokens(runner)
        if fim is None:
            raise ApiError(
                "invalid_request",
                "suffix needs fill-in-the-middle tokens, and this model has none",
                param="suffix",
                code="unsupported_parameter",
            )
        check_text(req.suffix, "suffix")
    prompts = req.prompts()
    if len(prompts) * req.n > MAX_PROMPTS:
        raise ApiError(
            "invalid_request",
            f"{len(prompts)} prompts times n={req.n} is more than {MAX_PROMPTS} choices",
            param="n",
            code="too_many_choices",
        )
    all_ids: list[list[int]] = []
    texts: list[str] = []
    bos = runner.tokenize("", add_special=True)
    for k, p in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{k}]"
        if isinstance(p, str):
            check_text_bytes(model, p, param, parse_special=req.parse_special)
            ids = await model.tokenize(p, add_special=fim is None, parse_special=req.parse_special)
            text = p
        else:
            check_token_ids(p, n_vocab, param)
            ids = list(p)
            text = b"".join(runner.token_bytes(t) for t in ids).decode("utf-8", errors="replace")
        if fim is not None:
            suffix_ids = runner.tokenize(req.suffix or "", add_special=False)
            ids = [*bos, fim[0], *ids, fim[1], *suffix_ids, fim[2]]
        if not ids:
            raise ApiError("invalid_request", f"{param} has no tokens", param=param, code="empty_prompt")
        all_ids.append(ids)
        texts.append(text)
    return all_ids, texts


async def prepare(model: ServedModel, req: CompletionRequest, ctx: RequestContext,
                  admission: Admission = OPEN) -> CompletionPlan:
    """Validate, tokenise, check every prompt's budget, admit and start the runs."""
    ident = model.resolve(req.model)
    if req.stream_options is not None and not req.stream:
        raise refused("stream_options", "stream_options is only allowed when stream is true")
    if req.echo and req.logprobs is not None:
        raise refused("echo", "echo with logprobs is not supported: prompt logprobs are not computed")
    if req.echo and req.suffix is not None:
        raise refused("echo", "echo cannot be combined with suffix")
    record_user(ctx.request_id, user=req.user)
    t = time.perf_counter()
    all_ids, texts = await _prompt_ids(model, req)
    ctx.record.stage("tokenize", t)
    for k, ids in enumerate(all_ids):
        param = "prompt" if len(all_ids) == 1 else f"prompt[{k}]"
        check_tokens(model, len(ids), req.max_tokens, prompt_param=param, new_param="max_tokens")
    params = sampling_params(req, model.limits.n_vocab, max_new_tokens=req.max_tokens, logprobs=req.logprobs)
    if req.top_k:
        params = dataclasses.replace(params, top_k=req.top_k)
    grammar = await completion_grammar(model, req)
    runs = await start_runs(model, ctx, all_ids, params, n=req.n, requested_new=req.max_tokens, new_param="max_tokens",
                            constraint=None if grammar is None else grammar.constraint, stream=req.stream,
                            admission=admission)
    return CompletionPlan(req, texts, runs, ident.ref, fingerprint(model))


def _logprobs(
    model: ServedModel,
    state: CompletionLogprobState,
    req: CompletionRequest,
    lps: Sequence[TokenLogprob],
) -> CompletionLogprobs | None:
    if req.logprobs is None:
        return None
    tokens, values, tops, offsets = state.shape(model.runner, lps, want_top=req.logprobs > 0,
                                                as_ids=req.return_tokens_as_token_ids)
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets)


async def complete(model: ServedModel, plan: CompletionPlan, ctx: RequestContext) -> Completion:
    req = plan.request
    results = await collect_finished(plan.runs, ctx)
    choices: list[CompletionChoice] = []
    for i, r in enumerate(results):
        assert r.final is not None
        prefix = plan.prompt_texts[plan.prompt_of(i)] if req.echo else ""
        lps = _logprobs(model, CompletionLogprobState(), req, r.logprobs)
        choices.append(
            CompletionChoice(
                index=i,
                text=prefix + r.text,
                token_ids=r.token_ids if req.return_token_ids else None,
                logprobs=lps,
                finish_reason=openai_finish(r.final.finish_reason),
            )
        )
    return Completion(
        id=f"cmpl-{ctx.request_id}",
        object="text_completion",
        created=ctx.created,
        model=plan.model_ref,
        system_fingerprint=plan.fingerprint,
        choices=choices,
        usage=usage([r.final for r in results]),
    )


async def stream(
    model: ServedModel, plan: CompletionPlan, ctx: RequestContext
) -> AsyncIterator[Completion | str | None]:
    """Chunks: the prompt first when echoing, then text deltas (plain ones already serialised: `TextDeltas`),
    then an empty delta with the finish reason; `None` is a heartbeat cue (nothing to send for a while)."""
    req = plan.request
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    n_choices = len(plan.prompt_texts) * req.n
    states = [CompletionLogprobState() for _ in range(n_choices)]
    finals: list[RequestOutput | None] = [None] * n_choices

    def chunk(choices: list[CompletionChoice], **extra: Any) -> Completion:
        fields: dict[str, Any] = {
            "id": f"cmpl-{ctx.request_id}",
            "object": "text_completion",
            "created": ctx.created,
            "model": plan.model_ref,
            "system_fingerprint": plan.fingerprint,
            "choices": choices,
            "usage": None,
        }
        fields.update(extra)
        return Completion(**fields)

    texts = TextDeltas(lambda i, text: chunk(
        [CompletionChoice(index=i, text=text, token_ids=None, logprobs=None, finish_reason=None)]
    ))
    if req.echo:
        for i in range(n_choices):
            yield chunk(
                [
                    CompletionChoice(
                        index=i,
                        text=plan.prompt_texts[plan.prompt_of(i)],
                        token_ids=None,
                        logprobs=None,
                        finish_reason=None,
                    )
                ]
            )
    async for ev in arrivals(plan.runs, finals):
        if ev is None:
            yield None
            continue
        i, out, err = ev
        lps = _logprobs(model, states[i], req, out.logprobs)
        ids = out.new_token_ids if req.return_token_ids else None
        if out.text or ids or (lps is not None and lps.tokens):
            yield texts(i, out.text) if ids is None and lps is None else chunk(
                [CompletionChoice(index=i, text=out.text, token_ids=ids, logprobs=lps, finish_reason=None)]
            )
        if err is not None:  # after the text it came with: a merged last delta loses nothing
            raise err
        if out.finished:
            yield chunk(
                [
                    CompletionChoice(
                        index=i, text="", token_ids=None, logprobs=None,
                        finish_reason=openai_finish(out.finish_reason),
                    )
                ]
            )
    if include_usage:
        yield chunk([], usage=usage(finals))


__all__ = ["CompletionPlan", "complete", "fim_tokens", "prepare", "stream"]
