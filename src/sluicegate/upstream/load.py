"""The upstream models of `serve --upstream`: probe each URL (startup.py), then one client per name with the
configured identity, the smallest window of its URLs and the model's own tokenizer. The served models are
built from them in api/state.py, as the local one is."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from sluicegate import redaction
from sluicegate.backends.base import ModelIdentity, Tokenizer
from sluicegate.config import UpstreamConfig, UpstreamModel
from sluicegate.upstream.client import AsyncUpstream
from sluicegate.upstream.pool import Endpoint
from sluicegate.upstream.startup import UpstreamRefused, probe

log = logging.getLogger("sluicegate")

TokenizerFactory = Callable[[str], Tokenizer]  # served name -> the model's own tokenizer (off the loop)


@dataclass(frozen=True, slots=True)
class Probed:
    """One upstream model that passed its start-up checks on every URL."""

    client: AsyncUpstream
    runner: Tokenizer  # the model's own tokenizer
    identity: ModelIdentity  # the configured one (--upstream-model)
    n_ctx: int  # the smallest window of its URLs
    token_ids: bool  # every URL returns token ids


async def discover_name(http: httpx.AsyncClient, url: str, api_key: str | None) -> str:
    """The first model an upstream lists (`--upstream URL` without a NAME and without --name)."""
    try:
        resp = await http.get(f"{url}/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    except httpx.HTTPError as exc:
        raise UpstreamRefused(f"{redaction.url(url)}: not reachable ({type(exc).__name__})", permanent=False) from None
    try:
        first = resp.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        first = None
    if not isinstance(first, str) or not first:  # a server still starting may list none yet: checked again
        raise UpstreamRefused(f"{redaction.url(url)}: lists no model at /models (answered {resp.status_code}); give "
                              "--upstream NAME=URL", permanent=False)
    return first


async def load_upstreams(cfg: UpstreamConfig, http: httpx.AsyncClient,
                         tokenizer_for: TokenizerFactory) -> dict[str, Probed]:
    """Every configured upstream model; UpstreamRefused (the operator's message) when one cannot serve."""
    endpoints: dict[str, Endpoint] = {}  # one per URL: a URL's breaker is shared by the names it serves
    by_name: dict[str, list[Endpoint]] = {}
    for t in cfg.targets:
        url = t.url.rstrip("/")
        ep = endpoints.setdefault(url, Endpoint(url, cfg.breaker_failures, cfg.breaker_open_s))
        by_name.setdefault(t.name or await discover_name(http, url, cfg.api_key), []).append(ep)
    meta = {m.name: m for m in cfg.models}
    out: dict[str, Probed] = {}
    for name, eps in by_name.items():
        runner = await asyncio.to_thread(tokenizer_for, name)
        try:
            results = [await probe(http, ep, name, cfg.api_key, runner) for ep in eps]
        except UpstreamRefused as exc:
            raise UpstreamRefused(f"upstream {name}: {exc}", permanent=exc.permanent) from None
        n_ctx = min(r.n_ctx for r in results)
        token_ids = all(r.token_ids for r in results)
        m = meta.get(name) or UpstreamModel(name)
        client = AsyncUpstream(name, eps, http, cfg, token_ids=token_ids, eos_ids=runner.limits.eos_ids)
        out[name] = Probed(client, runner, ModelIdentity(name, m.version, m.digest or "unknown"), n_ctx, token_ids)
        log.info("upstream %s@%s via %s: window %d, /tokenize %s, token ids %s", name, m.version,
                 ", ".join(e.shown for e in eps), n_ctx, "agrees" if all(r.tokenize for r in results) else "absent",
                 "returned" if token_ids else "not returned (/v1/generate refuses this model)")
    return out
