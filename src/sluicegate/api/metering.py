"""What a request cost, for the usage ledger: read from its runs when its response has ended.

The work lifecycle (api/work.py) leaves `from_runs` over the started runs as the request context's meter, read
once when the response has ended (`RequestContext.used()`: a stream's usage is complete only when it ends, and a
client may leave early): the auth middleware records it in the usage ledger, the rate limit settles with it.
"""

from __future__ import annotations

from sluicegate.engine import FinishReason
from sluicegate.serving.context import TokenUsage
from sluicegate.serving.core import Runs

CUT = (FinishReason.CANCELLED, FinishReason.EXPIRED, FinishReason.ERROR)


def from_runs(runs: Runs) -> TokenUsage:
    """What the runs computed. A finished run counts as the engine reported it; one the engine cut
    (cancelled, expired, failed) counts its prompt only as far as its prefill got. A run cut before the
    engine's final output was read (the client left) counts the tokens it delivered and the prompt tokens
    prefilled or being prefilled when it was cut (`EngineRequest.progress`), reused cached ones included, as
    for a finished run (docs/ratelimits.md)."""
    prompt = cached = generated = 0
    for request, final, delivered in zip(runs.requests, runs.finals, runs.delivered, strict=True):
        done = request.progress
        if final is not None:
            if final.finish_reason in CUT and done.prompt_tokens < final.prompt_tokens:
                prompt += done.prompt_tokens
                cached += min(final.cached_tokens, done.cached_tokens)
            else:
                prompt += final.prompt_tokens
                cached += final.cached_tokens
            generated += final.completion_tokens
        else:
            prompt += len(request.prompt_ids) if delivered else done.prompt_tokens
            cached += done.cached_tokens
            generated += delivered
    return TokenUsage(prompt, cached, generated)


__all__ = ["from_runs"]
