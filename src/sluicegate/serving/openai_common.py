"""What both OpenAI-compatible surfaces share: fingerprint, engine runs for n choices, logprobs, usage.

n > 1 is n engine requests submitted together (choice i is run i, seeded `seed + i` when a seed is given, so
every choice can be replayed alone); their outputs are merged as they arrive. Streaming and non-streaming go
through the same `Runs`, which is why a seeded request streams exactly the text it returns whole.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sluicegate import __version__
from sluicegate.backends.base import ModelRunner
from sluicegate.engine import AsyncEngine, EngineRequest, FinishReason, RequestOutput, TokenLogprob
from sluicegate.protocol.openai_common import MAX_SEED, OpenAIUsage, PromptTokensDetails, TopLogprob
from sluicegate.protocol.openai_common import TokenLogprob as TokenLogprobOut
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.serving.generate import engine_error
from sluicegate.serving.models import ServedModel

log = logging.getLogger("sluicegate.openai")

MASKED_LOGPROB = -9999.0  # what OpenAI reports for a token that could not be chosen (our -inf)


def fingerprint(model: ServedModel) -> str:
    """`fp_` + 10 hex of the weights digest and everything in the engine that can change an output."""
    cfg = model.engine.engine.scheduler.config
    lim = model.limits
    key = (
        f"{model.identity.digest}|block={cfg.block_size}|batch={cfg.max_batch_tokens}|n_ctx={lim.n_ctx}"
        f"|slots={lim.n_slots}|n_batch={lim.n_batch}|sluicegate={__version__}"
        f"{'' if lim.batch_invariant else '|batch-variant'}"
    )
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


def run_seed(seed: int | None, i: int) -> int | None:
    return None if seed is None else (seed + i) % (MAX_SEED + 1)


def record_user(request_id: str, **ids: str | None) -> None:
    """`user` (and `safety_identifier`) are recorded with the request: one log line under its id."""
    given = {k: v for k, v in ids.items() if v is not None}
    if given:
        log.info("%s %s", request_id, " ".join(f"{k}={v!r}" for k, v in given.items()))


def logit_bias(bias: dict[str, float] | None, n_vocab: int) -> dict[int, float] | None:
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 9 and int(key) < n_vocab):
            raise ApiError(
                "invalid_request",
                f"logit_bias keys must be token ids from 0 to {n_vocab - 1}",
                param="logit_bias",
                code="invalid_token_id",
            )
        out[int(key)] = float(value)
    return out


def check_token_ids(ids: Sequence[int], n_vocab: int, param: str) -> None:
    if any(t >= n_vocab for t in ids):
        raise ApiError(
            "invalid_request",
            f"{param}: token ids must be below {n_vocab}",
            param=param,
            code="invalid_token_id",
        )


def finish_error(out: RequestOutput) -> ApiError | None:
    """The error a finished run means for its client, if any (logged here, once)."""
    if out.finish_reason is FinishReason.ERROR:
        log.error("%s engine error: %s", out.request_id, out.error)
        return ApiError("internal_error", "internal error; report the request id")
    if out.finish_reason is FinishReason.CANCELLED:
        return ApiError(
            "shutting_down", "the request was cancelled: the server is shutting down", retry_after=5
        )
    return None


def openai_finish(reason: FinishReason | None) -> Literal["stop", "length"]:
    return "length" if reason is FinishReason.LENGTH else "stop"


@dataclass(slots=True)
class RunResult:
    """One run merged: every delta's text, ids and logprobs, and the final counts."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: RequestOutput | None = None


class Runs:
    """The engine requests of one API request, started together, read as one stream of (index, delta)."""

    def __init__(self, engine: AsyncEngine, requests: Sequence[EngineRequest]) -> None:
        self._engine = engine
        self._requests = list(requests)
        self._queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self.delivered = [0] * len(self._requests)  # new tokens read per run, and each finished run's
        self.finals: list[RequestOutput | None] = [None] * len(self._requests)  # final output: for metering

    async def start(self) -> None:
        """Submit every run; an overload or shutdown refusal raises here, before any output is sent."""
        self._tasks = [asyncio.ensure_future(self._pump(i, r)) for i, r in enumerate(self._requests)]
        # Each task's first step runs `engine.submit` synchronously (AsyncEngine.stream submits before its
        # first await), and tasks created before this sleep run before it returns.
        await asyncio.sleep(0)
        for task in self._tasks:
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                self.close()
                if isinstance(exc, ApiError) or not isinstance(exc, Exception):
                    raise exc
                raise engine_error(exc)

    async def _pump(self, i: int, request: EngineRequest) -> None:
        async for out in self._engine.stream(request):
            self._queue.put_nowait((i, out))

    async def events(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Deltas in arrival order until every run has finished; leaving early aborts the rest."""
        remaining = len(self._tasks)
        try:
            while remaining:
                i, out = await self._queue.get()
                self.delivered[i] += len(out.new_token_ids)
                if out.finished:
                    remaining -= 1
                    self.finals[i] = out
                yield i, out
        finally:
            self.close()

    async def collect(self) -> list[RunResult]:
        results = [RunResult() for _ in self._requests]
        parts: list[list[str]] = [[] for _ in self._requests]
        async for i, out in self.events():
            r = results[i]
            parts[i].append(out.text)
            r.token_ids.extend(out.new_token_ids)
            r.logprobs.extend(out.logprobs)
            if out.finished:
                r.final = out
        for r, p in zip(results, parts, strict=True):
            r.text = "".join(p)
        return results

    @property
    def requests(self) -> list[EngineRequest]:
        return self._requests

    def close(self) -> None:
        """Cancel every pump still running; each cancellation aborts its request in the engine."""
        for task in self._tasks:
            task.cancel()


async def collect_finished(runs: Runs, ctx: RequestContext) -> list[RunResult]:
    """Every run to its end (closing them whatever happens); the first engine failure raises; the first
    run's stage times go to Server-Timing."""
    try:
        results = await runs.collect()
    finally:
        runs.close()
    for r in results:
        assert r.final is not None
        err = finish_error(r.final)
        if err is not None:
            raise err
    first = results[0].final
    if first is not None and first.timing is not None:
        for name in ("queue", "prefill", "decode"):
            ctx.stages_ms[name] = getattr(first.timing, f"{name}_ms")
    return results


def usage(finals: Sequence[RequestOutput | None]) -> OpenAIUsage:
    done = [f for f in finals if f is not None]
    prompt = sum(f.prompt_tokens for f in done)
    completion = sum(f.completion_tokens for f in done)
    return OpenAIUsage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(f.cached_tokens for f in done)),
    )


# -- logprobs ----------------------------------------------------------------------------------------------


def token_piece(runner: ModelRunner, token_id: int) -> tuple[str, bytes]:
    """A token as OpenAI reports it: its text (undecodable bytes as `\\xNN`), and its exact bytes."""
    raw = runner.token_bytes(token_id)
    if not raw:
        text = runner.token_text(token_id)
        return text, text.encode("utf-8")
    return raw.decode("utf-8", errors="backslashreplace"), raw


def _lp(value: float) -> float:
    return value if math.isfinite(value) else MASKED_LOGPROB


def chat_logprobs(runner: ModelRunner, lps: Sequence[TokenLogprob]) -> list[TokenLogprobOut]:
    """Chat-shaped logprobs; end-of-sequence tokens are left out, as they are left out of the text."""
    eos = runner.limits.eos_ids
    out: list[TokenLogprobOut] = []
    for lp in lps:
        if lp.token_id in eos:
            continue
        text, raw = token_piece(runner, lp.token_id)
        top = []
        for tid, v in lp.top:
            t, b = token_piece(runner, tid)
            top.append(TopLogprob(token=t, logprob=_lp(v), bytes=list(b)))
        out.append(TokenLogprobOut(token=text, logprob=_lp(lp.logprob), bytes=list(raw), top_logprobs=top))
    return out


@dataclass(slots=True)
class CompletionLogprobState:
    """Completions-shaped logprobs, built across stream deltas: text offsets continue from one to the next."""

    offset: int = 0
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def shape(
        self,
        runner: ModelRunner,
        lps: Sequence[TokenLogprob],
        *,
        want_top: bool,
    ) -> tuple[list[str], list[float], list[dict[str, float]] | None, list[int]]:
        eos = runner.limits.eos_ids
        tokens: list[str] = []
        values: list[float] = []
        tops: list[dict[str, float]] = []
        offsets: list[int] = []
        for lp in lps:
            if lp.token_id in eos:
                continue
            text, raw = token_piece(runner, lp.token_id)
            tokens.append(text)
            values.append(_lp(lp.logprob))
            offsets.append(self.offset)
            self.offset += len(self.decoder.decode(raw))
            if want_top:
                top: dict[str, float] = {}
                for tid, v in lp.top:
                    top.setdefault(token_piece(runner, tid)[0], _lp(v))
                tops.append(top)
        return tokens, values, (tops if want_top else None), offsets
