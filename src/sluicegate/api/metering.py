"""What a request cost, for the usage ledger: read from its runs when its response has ended.

The auth middleware records one ledger row per metered request when its response has ended; the routes
leave the cost on the request context: `ctx.usage` once a result is shaped, or `ctx.meter`, read at the end,
for a stream (its usage is complete only when it ends) and for a client that left early.
"""

from __future__ import annotations

from sluicegate.serving.context import TokenUsage
from sluicegate.serving.core import Runs


def from_runs(runs: Runs) -> TokenUsage:
    """Finished runs count as the engine reported them. A run cut short (the client left) counts the tokens
    it delivered, and its prompt once any token came out (prefill was done); its cached share is unknown, so
    counted as zero."""
    prompt = cached = generated = 0
    for request, final, delivered in zip(runs.requests, runs.finals, runs.delivered, strict=True):
        if final is not None:
            prompt += final.prompt_tokens
            cached += final.cached_tokens
            generated += final.completion_tokens
        elif delivered:
            prompt += len(request.prompt_ids)
            generated += delivered
    return TokenUsage(prompt, cached, generated)


__all__ = ["from_runs"]
