"""What one upstream run hands back: its outputs into the request's collector (counting what it delivered),
the end of a run that failed, and what the hop refuses to carry."""

from __future__ import annotations

import httpx

from sluicegate.engine.client import OutputCollector
from sluicegate.engine.types import EngineRequest, FinishReason, RequestOutput
from sluicegate.refusal import Rejected
from sluicegate.upstream.wire import UpstreamFailure

MAX_ERROR_BODY = 4096  # bytes of an upstream's error answer read (and dropped) before the connection is reused


def refuse_unsupported(name: str, req: EngineRequest, token_ids: bool) -> None:
    """What the hop cannot carry. A constraint goes upstream as its JSON schema (`response_format`) and is
    checked here token by token, which needs the upstream's token ids; a constraint that is no JSON schema
    cannot go at all. Logprobs come back named by token id (vLLM's `return_tokens_as_token_ids`) so they map
    onto our vocabulary exactly; an upstream that returns no token ids (llama-server) names them by text, which
    cannot be mapped back, so they are refused for it rather than guessed."""
    if req.params.logprobs is not None and not token_ids:
        raise Rejected("invalid_request", f"model {name} is served by an upstream engine that does not return "
                       "token ids, so its logprobs cannot be mapped to tokens here; logprobs are not available "
                       "for it", param="logprobs", code="unsupported_for_model")
    if req.constraint is not None and getattr(req.constraint, "schema", None) is None:
        param = getattr(req.constraint, "refusal_param", "response_format")
        raise Rejected("invalid_request", f"model {name} is served by an upstream engine, which cannot be sent "
                       f"the grammar this {param} needs; it is not available for this model", param=param,
                       code="unsupported_for_model")
    if req.constraint is not None and not token_ids:
        raise Rejected("invalid_request", f"model {name} is served by an upstream engine that does not return "
                       "token ids, so its JSON output cannot be checked here; constrained decoding "
                       "(response_format, tool calls) is not available for it", param="response_format",
                       code="unsupported_for_model")


async def drain(resp: httpx.Response) -> None:
    """Read (and drop) a little of an error answer; its content never reaches a client."""
    read = 0
    async for part in resp.aiter_raw():
        read += len(part)
        if read >= MAX_ERROR_BODY:
            break


class Sink:
    """One run's way into the request's collector, counting what it delivered (metering a run that fails)."""

    __slots__ = ("collector", "index", "started", "tokens")

    def __init__(self, collector: OutputCollector, index: int) -> None:
        self.collector, self.index = collector, index
        self.started = False  # some output came: the upstream did the prefill
        self.tokens = 0  # token ids delivered (0 where the upstream sends none)

    def put(self, out: RequestOutput) -> None:
        if not out.finished:
            self.started = True
            self.tokens += len(out.new_token_ids)
        self.collector.put(self.index, out)


def end(req: EngineRequest, reason: FinishReason, sink: Sink, f: UpstreamFailure | None = None) -> RequestOutput:
    """A run that ended without the upstream's usage: it counts its prompt once any output came, and the
    token ids delivered; nothing when the upstream never answered."""
    out = RequestOutput(req.request_id, [], "", finished=True, finish_reason=reason, seed=req.params.seed,
                        prompt_tokens=len(req.prompt_ids) if sink.started else 0, completion_tokens=sink.tokens)
    if reason is FinishReason.ERROR:
        out.error = f.message if f is not None else "the upstream client failed"
        out.error_type = f.type if f is not None else None
        out.retry_after = f.retry_after if f is not None else None
    return out
