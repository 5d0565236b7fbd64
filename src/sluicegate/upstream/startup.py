"""Start-up checks of one upstream URL, before it serves anything:

1. its tokenizer agrees with the model's own (`/tokenize` at the server root, where vLLM and llama-server
   put it and sluicegate does too; vLLM's shape, then llama-server's), so the counts our budgets use are
   the counts it runs; no `/tokenize` (TGI, OpenAI): the model's own tokenizer alone. A disagreement refuses.
2. its window: `max_model_len` from `/tokenize` or `/v1/models` (vLLM, sluicegate), `/props` (llama-server),
   else the tokenizer's.
3. one greedy token, streamed: it must report usage (else it is refused: nobody could be metered), and it
   may return token ids (vLLM's `return_token_ids`); without them `/v1/generate` refuses that model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from sluicegate.backends.base import Tokenizer
from sluicegate.engine.types import EngineRequest, SamplingParams
from sluicegate.upstream.pool import Endpoint
from sluicegate.upstream.wire import Chunk, UpstreamFailure, check_usage, parse_chunk, request_body

PROBE_TEXT = "The quick brown fox: 42 + 7 = 49; naïve café, 東京."


@dataclass(frozen=True, slots=True)
class ProbeResult:
    n_ctx: int
    token_ids: bool
    tokenize: bool  # it has a /tokenize that agreed with ours


class UpstreamRefused(Exception):
    """The upstream cannot be served behind our boundary; the message says why, for the operator.
    `permanent`: it answered, and what it answered can never work without changing the configuration (it does
    not serve the model, refuses our key, disagrees on the tokenizer, reports no usage); else (not reachable,
    5xx, 408, 429) it may yet come up, and is checked again."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


async def _json(http: httpx.AsyncClient, method: str, url: str, headers: dict[str, str],
                body: dict[str, Any] | None = None) -> dict[str, Any] | None:
    try:
        resp = await http.request(method, url, json=body, headers=headers)
        data = resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def _tokenize(http: httpx.AsyncClient, ep: Endpoint, name: str, headers: dict[str, str],
                    runner: Tokenizer) -> tuple[bool, int | None]:
    ours = runner.tokenize(PROBE_TEXT, add_special=False)
    for body in ({"model": name, "prompt": PROBE_TEXT, "add_special_tokens": False}, {"content": PROBE_TEXT}):
        data = await _json(http, "POST", f"{ep.root}/tokenize", headers, body)
        if data is None or not isinstance(data.get("tokens"), list) or not data["tokens"]:
            continue  # not this shape (llama-server answers vLLM's body with no tokens, not an error)
        theirs = [t if isinstance(t, int) else t.get("id") if isinstance(t, dict) else None for t in data["tokens"]]
        if theirs != ours:
            raise UpstreamRefused(
                f"{ep.shown}: the upstream's tokenizer disagrees with the one configured for model {name} "
                f"({len(theirs)} tokens against {len(ours)} for the probe text); give the model's own tokenizer "
                "(--upstream-tokenizer)")
        n_ctx = data.get("max_model_len")
        return True, n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None
    return False, None


async def _window(http: httpx.AsyncClient, ep: Endpoint, name: str, headers: dict[str, str]) -> int | None:
    models = await _json(http, "GET", f"{ep.url}/models", headers)
    for m in (models or {}).get("data") or []:
        if isinstance(m, dict) and m.get("id") == name and isinstance(m.get("max_model_len"), int):
            return int(m["max_model_len"])
    props = await _json(http, "GET", f"{ep.root}/props", headers)
    settings = (props or {}).get("default_generation_settings")
    n = settings.get("n_ctx") if isinstance(settings, dict) else None
    return n if isinstance(n, int) and n > 0 else None


async def _one_token(http: httpx.AsyncClient, ep: Endpoint, name: str, headers: dict[str, str],
                     runner: Tokenizer, token_ids: bool) -> tuple[int, bool]:
    """(status, whether chunks carried ids); raises UpstreamRefused when usage is missing or wrong."""
    ids = runner.tokenize("Hello", add_special=True)
    req = EngineRequest("startup-probe", ids, SamplingParams(max_new_tokens=1, temperature=0.0))
    body = request_body(name, req, token_ids=token_ids)
    chunks: list[Chunk] = []
    async with http.stream("POST", f"{ep.url}/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            return resp.status_code, False
        try:
            async for line in resp.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else None
                if data == "[DONE]":
                    break
                if data:
                    chunks.append(parse_chunk(data))
            usage = next((c.usage for c in reversed(chunks) if c.usage is not None), None)
            got = sum(len(c.token_ids) for c in chunks)
            has_ids = any(c.token_ids for c in chunks)
            check_usage(usage, req, got if has_ids else None)
        except UpstreamFailure as f:
            raise UpstreamRefused(f"{ep.shown}: model {name}: {f.message} for a one-token completion; an "
                                  "upstream must report exact usage (stream_options.include_usage)") from None
    return 200, has_ids


async def probe(http: httpx.AsyncClient, ep: Endpoint, name: str, api_key: str | None,
                runner: Tokenizer) -> ProbeResult:
    """Every check of the module doc against one URL; UpstreamRefused says what failed."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        has_tokenize, n_ctx = await _tokenize(http, ep, name, headers, runner)
        n_ctx = n_ctx or await _window(http, ep, name, headers) or runner.limits.n_ctx
        status, ids = await _one_token(http, ep, name, headers, runner, token_ids=True)
        if status in (400, 422):  # a strict server that does not know return_token_ids
            status, ids = await _one_token(http, ep, name, headers, runner, token_ids=False)
    except httpx.HTTPError as exc:
        raise UpstreamRefused(f"{ep.shown}: not reachable ({type(exc).__name__})", permanent=False) from None
    if status == 404:
        raise UpstreamRefused(f"{ep.shown}: a one-token completion for model {name} answered 404: the upstream "
                              f"does not serve model {name}; name a model it serves (--upstream NAME=URL)")
    if status != 200:
        transient = status >= 500 or status in (408, 429)
        raise UpstreamRefused(f"{ep.shown}: a one-token completion for model {name} answered {status}",
                              permanent=not transient)
    return ProbeResult(n_ctx=n_ctx, token_ids=ids, tokenize=has_tokenize)
