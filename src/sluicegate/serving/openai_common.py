"""What both OpenAI-compatible surfaces share: fingerprint, logit bias, finish reasons, logprobs, usage.

Runs, n > 1 and collection are the serving core's (serving/core.py): streaming and non-streaming read the
same `Runs`, which is why a seeded request streams exactly the text it returns whole.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

import pydantic_core
from pydantic import BaseModel

from sluicegate import __version__
from sluicegate.backends.base import Tokenizer
from sluicegate.engine import AsyncEngine, FinishReason, RequestOutput, SamplingParams, SchedulerConfig, TokenLogprob
from sluicegate.protocol.openai_common import OpenAIUsage, PromptTokensDetails, TopLogprob
from sluicegate.protocol.openai_common import TokenLogprob as TokenLogprobOut
from sluicegate.serving.core import HEARTBEAT_S, Runs, finish_error
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel

log = logging.getLogger("sluicegate.openai")

MASKED_LOGPROB = -9999.0  # what OpenAI reports for a token that could not be chosen (our -inf)

Chunk = TypeVar("Chunk", bound=BaseModel)
_MARK = "\ue000sluicegate-text\ue001"  # private-use characters: in no model name, id or fingerprint
_MARK_JSON = pydantic_core.to_json(_MARK).decode()


class TextDeltas(Generic[Chunk]):
    """The chunks of plain text deltas (no logprobs, no token ids), serialised once per token without models.

    `make(i, text)` builds choice i's chunk; the JSON that `make(i, text).model_dump_json(exclude_unset=True)`
    would give is returned as a str. Everything around the text is the same for every delta of a choice, so
    it is rendered once per choice, through the models themselves (the two cannot drift apart), and each
    text is spliced in as pydantic-core encodes a str. That replaces three model validations and a
    serialisation per streamed token on the event loop, whose every wake-up competes with the forward pass
    for a core (docs/benchmarks.md). Where the marker does not occur exactly once, the model is returned.
    """

    __slots__ = ("_frames", "_make")

    def __init__(self, make: Callable[[int, str], Chunk]) -> None:
        self._make = make
        self._frames: dict[int, tuple[str, str] | None] = {}

    def __call__(self, i: int, text: str) -> Chunk | str:
        if i not in self._frames:
            dumped = self._make(i, _MARK).model_dump_json(exclude_unset=True)
            head, _, tail = dumped.partition(_MARK_JSON)
            self._frames[i] = (head, tail) if dumped.count(_MARK_JSON) == 1 else None
        frame = self._frames[i]
        if frame is None:
            return self._make(i, text)
        return frame[0] + pydantic_core.to_json(text).decode() + frame[1]


def fingerprint(model: ServedModel) -> str:
    """`fp_` + 10 hex of the weights digest and everything in the engine that can change an output."""
    lim = model.limits
    if not isinstance(model.engine, AsyncEngine):  # an upstream: its own engine's settings are not known here
        key = f"{model.identity.ref}|{model.identity.digest}|n_ctx={lim.n_ctx}|upstream|sluicegate={__version__}"
        return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]
    cfg = model.engine.engine.scheduler.config
    key = (
        f"{model.identity.digest}|block={cfg.block_size}|batch={cfg.max_batch_tokens}|n_ctx={lim.n_ctx}"
        f"|slots={lim.n_slots}|n_batch={lim.n_batch}|sluicegate={__version__}"
        f"{f'|{lim.numerics}' if lim.numerics else ''}"
        f"{'' if lim.batch_invariant and (lim.drafts_exact or not cfg.speculative_ngram) else '|batch-variant'}"
        f"{_speculative(cfg)}"
    )
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


def _speculative(cfg: SchedulerConfig) -> str:
    """Speculative decoding's knobs, when it is on (off leaves the fingerprint as it was)."""
    if not cfg.speculative_ngram:
        return ""
    return f"|spec=ngram:{cfg.speculative_ngram}:{cfg.prompt_lookup_max}:{cfg.prompt_lookup_min}"


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


class SamplingFields(Protocol):
    """The sampling fields chat and text completion requests share."""

    temperature: float
    top_p: float
    seed: int | None
    stop: str | list[str] | None
    presence_penalty: float
    frequency_penalty: float
    logit_bias: dict[str, float] | None


def sampling_params(req: SamplingFields, n_vocab: int, *, max_new_tokens: int, logprobs: int | None) -> SamplingParams:
    """Both OpenAI surfaces' one conversion to the engine's SamplingParams."""
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=tuple([req.stop] if isinstance(req.stop, str) else req.stop or ()),
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias=logit_bias(req.logit_bias, n_vocab),
        logprobs=logprobs,
    )


def check_token_ids(ids: Sequence[int], n_vocab: int, param: str) -> None:
    if any(t >= n_vocab for t in ids):
        raise ApiError(
            "invalid_request",
            f"{param}: token ids must be below {n_vocab}",
            param=param,
            code="invalid_token_id",
        )


def openai_finish(reason: FinishReason | None) -> Literal["stop", "length"]:
    return "length" if reason is FinishReason.LENGTH else "stop"


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


def token_piece(runner: Tokenizer, token_id: int) -> tuple[str, bytes]:
    """A token as OpenAI reports it: its text (undecodable bytes as `\\xNN`), and its exact bytes."""
    raw = runner.token_bytes(token_id)
    if not raw:
        text = runner.token_text(token_id)
        return text, text.encode("utf-8")
    return raw.decode("utf-8", errors="backslashreplace"), raw


def _lp(value: float) -> float:
    return value if math.isfinite(value) else MASKED_LOGPROB


def chat_logprobs(runner: Tokenizer, lps: Sequence[TokenLogprob]) -> list[TokenLogprobOut]:
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
        runner: Tokenizer,
        lps: Sequence[TokenLogprob],
        *,
        want_top: bool,
        as_ids: bool = False,
    ) -> tuple[list[str], list[float], list[dict[str, float]] | None, list[int]]:
        """`as_ids`: tokens named `token_id:<id>` (vLLM's return_tokens_as_token_ids), not by their text."""
        eos = runner.limits.eos_ids
        tokens: list[str] = []
        values: list[float] = []
        tops: list[dict[str, float]] = []
        offsets: list[int] = []
        for lp in lps:
            if lp.token_id in eos:
                continue
            text, raw = token_piece(runner, lp.token_id)
            tokens.append(f"token_id:{lp.token_id}" if as_ids else text)
            values.append(_lp(lp.logprob))
            offsets.append(self.offset)
            self.offset += len(self.decoder.decode(raw))
            if want_top:
                top: dict[str, float] = {}
                for tid, v in lp.top:
                    top.setdefault(f"token_id:{tid}" if as_ids else token_piece(runner, tid)[0], _lp(v))
                tops.append(top)
        return tokens, values, (tops if want_top else None), offsets


async def arrivals(
    runs: Runs, finals: list[RequestOutput | None], check: Callable[[int], None] | None = None,
) -> AsyncIterator[tuple[int, RequestOutput, ApiError | None] | None]:
    """The runs' outputs as they come, each with the error it finished in; None: a heartbeat is due. A run that
    finishes well is checked first (`check(i)`, which may raise) and kept in `finals[i]`."""
    async for ev in runs.events(HEARTBEAT_S):
        if ev is None:
            yield None
            continue
        i, out = ev
        err = finish_error(out) if out.finished else None
        if out.finished and err is None:
            if check is not None:
                check(i)
            finals[i] = out
        yield i, out, err
