"""The upstream's wire: one engine run as a streamed `/v1/completions` request with a token-id prompt, and
the stream's chunks read back as engine deltas.

Why token ids on `/v1/completions`, not chat: our serving core has already rendered the chat template,
counted the prompt against the budget and applied every surface's rules, so the ids it counted are exactly
what the upstream runs (vLLM, llama-server and sluicegate accept a token-id prompt; none of them adds a BOS
to one). Chat would make the upstream render its own template, and the prompt we counted would not be the
prompt it ran. Always streamed, so the first token is seen (the ladder's retries stop there) and a client
that leaves closes the upstream request at once.

Nothing the upstream sends reaches a client raw: a failure becomes an `UpstreamFailure` with our own
message, and the upstream's status is the only thing of it that is named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluicegate.engine.types import EngineRequest, FinishReason, TokenLogprob

RETRYABLE_STATUS = frozenset({502, 503, 504})


@dataclass(slots=True)
class UpstreamFailure(Exception):
    """What went wrong with one attempt, in our terms: an envelope type, a message, and whether it may be
    retried (only before the first token, only connect errors and 502/503/504)."""

    type: str  # upstream_error (502), upstream_unavailable (503), upstream_timeout (504)
    message: str
    retryable: bool = False
    retry_after: int | None = None
    counts_against: bool = True  # a failure of the upstream itself (the circuit breaker counts it)


def request_body(name: str, req: EngineRequest, *, token_ids: bool) -> dict[str, Any]:
    """The `/v1/completions` body for one run: only fields every OpenAI-compatible engine takes, plus
    vLLM's `top_k`, `min_p`, `ignore_eos`, `return_token_ids`, `return_tokens_as_token_ids` (with logprobs)
    and `response_format` (a constraint's JSON schema) when they are not at their defaults."""
    p = req.params
    body: dict[str, Any] = {
        "model": name, "prompt": req.prompt_ids, "max_tokens": p.max_new_tokens, "temperature": p.temperature,
        "top_p": p.top_p, "stream": True, "stream_options": {"include_usage": True},
    }
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.presence_penalty:
        body["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty:
        body["frequency_penalty"] = p.frequency_penalty
    if p.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in p.logit_bias.items()}
    if p.top_k:
        body["top_k"] = p.top_k
    if p.min_p:
        body["min_p"] = p.min_p
    if p.ignore_eos:
        body["ignore_eos"] = True
    if token_ids:
        body["return_token_ids"] = True
    if p.logprobs is not None:  # named by id, so they map back to our vocabulary exactly
        body["logprobs"] = p.logprobs
        body["return_tokens_as_token_ids"] = True
    schema = getattr(req.constraint, "schema", None)
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return body


def failure_for_status(status: int, retry_after: str | None) -> UpstreamFailure:
    """A non-200 answer before any token, in our terms."""
    if status == 429:
        return UpstreamFailure("upstream_unavailable", "the upstream is over its rate limit",
                               retry_after=_seconds(retry_after, 1), counts_against=False)
    if status in RETRYABLE_STATUS:
        return UpstreamFailure("upstream_unavailable", f"the upstream answered {status}", retryable=True,
                               retry_after=_seconds(retry_after, 1))
    if 400 <= status < 500:
        return UpstreamFailure("upstream_error", f"the upstream refused the request ({status})",
                               counts_against=False)
    return UpstreamFailure("upstream_error", f"the upstream failed ({status})")


def _seconds(value: str | None, default: int) -> int:
    try:
        return max(1, min(3600, int(float(value)))) if value else default
    except ValueError:
        return default


@dataclass(slots=True)
class Chunk:
    """What one `data:` line carried: new text and ids, and the end's finish reason and usage."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish: str | None = None
    stop_reason: object = None
    has_stop_reason: bool = False
    usage: dict[str, Any] | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


def parse_chunk(data: str) -> Chunk:
    """One SSE `data:` payload (not `[DONE]`); a malformed one is an UpstreamFailure."""
    try:
        obj = json.loads(data)
    except ValueError:
        raise UpstreamFailure("upstream_error", "the upstream sent a chunk that is not JSON") from None
    if not isinstance(obj, dict):
        raise UpstreamFailure("upstream_error", "the upstream sent a chunk that is not an object")
    if "error" in obj:
        raise UpstreamFailure("upstream_error", "the upstream reported an error mid-stream")
    out = Chunk()
    usage = obj.get("usage")
    if usage is not None:
        out.usage = usage if isinstance(usage, dict) else {"invalid": True}
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise UpstreamFailure("upstream_error", "the upstream sent a chunk without choices")
    for choice in choices[:1]:
        if not isinstance(choice, dict) or not isinstance(choice.get("text", ""), str):
            raise UpstreamFailure("upstream_error", "the upstream sent a malformed choice")
        out.text = choice.get("text") or ""
        ids = choice.get("token_ids")
        if ids is not None:
            if not (isinstance(ids, list) and all(isinstance(t, int) and t >= 0 for t in ids)):
                raise UpstreamFailure("upstream_error", "the upstream sent malformed token ids")
            out.token_ids = ids
        out.finish = choice.get("finish_reason")
        if choice.get("logprobs") is not None:
            out.logprobs = _logprobs(choice["logprobs"])
        if "stop_reason" in choice:
            out.has_stop_reason, out.stop_reason = True, choice["stop_reason"]
    return out


def _token_id(name: object) -> int:
    if isinstance(name, str) and name.startswith("token_id:") and name[9:].isdigit():
        return int(name[9:])
    raise UpstreamFailure("upstream_error", "the upstream named a logprob's token by text, not by id")


def _logprobs(lp: object) -> list[TokenLogprob]:
    """Completions-shaped logprobs with `token_id:<id>` names (return_tokens_as_token_ids) as ours."""
    try:
        assert isinstance(lp, dict)
        tokens, values = lp["tokens"], lp["token_logprobs"]
        tops = lp.get("top_logprobs") or [{}] * len(tokens)
        out = []
        for name, value, top in zip(tokens, values, tops, strict=True):
            alts = sorted(((_token_id(k), float(v)) for k, v in top.items()), key=lambda x: -x[1])
            out.append(TokenLogprob(_token_id(name), float(value), tuple(alts)))
        return out
    except (AssertionError, KeyError, TypeError, ValueError, AttributeError):
        raise UpstreamFailure("upstream_error", "the upstream sent malformed logprobs") from None


def finish_reason(chunk: Chunk, req: EngineRequest) -> FinishReason:
    """OpenAI's `stop` covers both an end-of-sequence token and a stop string: vLLM's `stop_reason` (the
    matched string, or null/a token id for EOS) tells them apart; without it, a request with stop strings is
    taken to have hit one."""
    if chunk.finish == "length":
        return FinishReason.LENGTH
    if chunk.finish != "stop":
        raise UpstreamFailure("upstream_error", "the upstream ended with an unknown finish reason")
    if chunk.has_stop_reason:
        return FinishReason.STOP if isinstance(chunk.stop_reason, str) else FinishReason.EOS
    return FinishReason.STOP if req.params.stop else FinishReason.EOS


def check_usage(usage: dict[str, Any] | None, req: EngineRequest, generated: int | None) -> tuple[int, int, int]:
    """(prompt, completion, cached) from the upstream's own counts, which must be there and agree with
    what we sent and, where it sent ids, with what it sent: else nobody could be metered exactly."""
    if usage is None:
        raise UpstreamFailure("upstream_error", "the upstream reported no usage")
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    for v in (prompt, completion, cached):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise UpstreamFailure("upstream_error", "the upstream reported malformed usage")
    assert isinstance(prompt, int) and isinstance(completion, int) and isinstance(cached, int)
    if prompt != len(req.prompt_ids):
        raise UpstreamFailure(
            "upstream_error", f"the upstream counted {prompt} prompt tokens for the {len(req.prompt_ids)} sent")
    if completion > req.params.max_new_tokens or (generated is not None and completion != generated):
        raise UpstreamFailure("upstream_error", "the upstream's completion-token count disagrees with its output")
    return prompt, completion, min(cached, prompt)
