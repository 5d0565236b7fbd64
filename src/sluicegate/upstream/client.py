"""An upstream engine with AsyncEngine's shape (`submit` runs into an OutputCollector, `abort` one), so the
serving core and every surface run on it unchanged; one task per run speaks HTTP to the upstream.

The ladder of one run (docs/timeouts.md): an attempt has `attempt_timeout_s` to its first token (connect
included, `connect_timeout_s` at most), and never more than the caller's remaining budget: the request's
`deadline` and, until the first token, a stream's `first_token_deadline` (both from the caller's timeout
headers, serving/deadline.py). After the first token each chunk must come within `read_timeout_s`, and the
whole run ends at the deadline (EXPIRED: 504 deadline_exceeded; a stream's error event). Retries happen here
and nowhere else: at most `retries`, only before the first token, only for connect errors and 502/503/504,
after a jittered backoff, and only when a whole attempt still fits the remaining budget after it, so no
retry can outlive its caller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Sequence

import httpx

from sluicegate.config import UpstreamConfig
from sluicegate.engine.client import OutputCollector
from sluicegate.engine.types import EngineRequest, FinishReason, RequestOutput, Timing
from sluicegate.refusal import Rejected
from sluicegate.telemetry import tracing
from sluicegate.upstream.outputs import Sink, drain, end, refuse_unsupported
from sluicegate.upstream.pool import Endpoint, pick, soonest_retry
from sluicegate.upstream.wire import (
    Chunk,
    UpstreamFailure,
    check_usage,
    failure_for_status,
    finish_reason,
    parse_chunk,
    request_body,
)

log = logging.getLogger("sluicegate.upstream")


# Failures of a request before any answer: connect errors, and a pooled connection the upstream had closed.
_UNREACHED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError)


class _Expired(Exception):
    pass


def new_http_client(cfg: UpstreamConfig) -> httpx.AsyncClient:
    """One pooled client per process for every upstream (keep-alive, HTTP/1.1)."""
    limits = httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=cfg.max_connections)
    timeout = httpx.Timeout(cfg.read_timeout_s, connect=cfg.connect_timeout_s)
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)


class AsyncUpstream:
    """One served model behind one or more upstream URLs."""

    def __init__(self, name: str, endpoints: Sequence[Endpoint], http: httpx.AsyncClient, cfg: UpstreamConfig,
                 *, token_ids: bool = False, eos_ids: frozenset[int] = frozenset()) -> None:
        self.name = name
        self.eos_ids = eos_ids  # the model's end-of-sequence ids: not part of a constrained text
        self.endpoints = list(endpoints)
        self.cfg = cfg
        self.token_ids = token_ids  # the upstream returns each chunk's token ids (vLLM's return_token_ids)
        self._http = http
        self._headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def submit(self, requests: Sequence[EngineRequest]) -> OutputCollector:
        """Start every run; when every circuit is open, refuse at once (503 upstream_unavailable). A run
        without a seed gets one drawn here and sent, so every upstream answer can be replayed too."""
        for req in requests:
            refuse_unsupported(self.name, req, self.token_ids)
            if req.params.seed is None and not req.params.greedy:
                req.params = dataclasses.replace(req.params, seed=random.getrandbits(63))
        if pick(self.endpoints) is None:
            raise Rejected("upstream_unavailable", f"every upstream of model {self.name} is failing",
                           retry_after=soonest_retry(self.endpoints), code="circuit_open")
        collector = OutputCollector(len(requests))
        for i, req in enumerate(requests):
            task = asyncio.create_task(self._run(req, Sink(collector, i)))
            self._tasks[req.request_id] = task
            task.add_done_callback(functools.partial(self._forget, req.request_id))
        return collector

    def _forget(self, request_id: str, _task: asyncio.Task[None]) -> None:
        self._tasks.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        """Cancel the run: its HTTP request is closed, which cancels it in the upstream."""
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, req: EngineRequest, sink: Sink) -> None:
        start = time.monotonic()
        try:
            final = await self._ladder(req, sink, start)
        except asyncio.CancelledError:
            sink.put(end(req, FinishReason.CANCELLED, sink))
            raise
        except _Expired:
            final = end(req, FinishReason.EXPIRED, sink)
        except UpstreamFailure as f:
            log.warning("%s upstream %s: %s", req.request_id, self.name, f.message)
            final = end(req, FinishReason.ERROR, sink, f)
        except Exception:  # a bug here must still end the run
            log.exception("%s upstream client failed", req.request_id)
            final = end(req, FinishReason.ERROR, sink)
        sink.put(final)

    @staticmethod
    def _left(req: EngineRequest, *, first: bool) -> float | None:
        """Seconds left of the caller's budget; `first`: for the first token (a stream's own deadline too)."""
        ends = [d for d in (req.deadline, req.first_token_deadline if first else None) if d is not None]
        return min(ends) - time.monotonic() if ends else None

    async def _ladder(self, req: EngineRequest, sink: Sink, start: float) -> RequestOutput:
        cfg = self.cfg
        body = request_body(self.name, req, token_ids=self.token_ids)
        tried: Endpoint | None = None
        for attempt in range(cfg.retries + 1):
            ep = pick(self.endpoints, exclude=tried)
            if ep is None:
                raise UpstreamFailure("upstream_unavailable", f"every upstream of model {self.name} is failing",
                                      retry_after=soonest_retry(self.endpoints))
            tried = ep
            try:
                return await self._attempt(ep, body, req, sink, start)
            except UpstreamFailure as f:
                left = self._left(req, first=True)  # a retry is only ever before the first token
                backoff = random.uniform(cfg.backoff_s / 2, cfg.backoff_s)
                fits = left is None or left - backoff >= cfg.attempt_timeout_s
                if not (f.retryable and attempt < cfg.retries and fits):
                    raise
                log.info("%s upstream %s: %s; retrying in %.2f s", req.request_id, ep.shown, f.message, backoff)
                await asyncio.sleep(backoff)
        raise AssertionError("unreachable")

    async def _attempt(self, ep: Endpoint, body: dict[str, object], req: EngineRequest,
                       sink: Sink, start: float) -> RequestOutput:
        """One attempt; the first token ends the retryable part (failures after it are never retried)."""
        left = self._left(req, first=True)
        if left is not None and left <= 0:
            raise _Expired
        first_s = self.cfg.attempt_timeout_s if left is None else min(self.cfg.attempt_timeout_s, left)
        by_budget = left is not None and left < self.cfg.attempt_timeout_s  # the caller's time bounds this wait
        where = {"server.address": ep.shown.removesuffix("/v1")}  # no credentials in a trace
        with tracing.span("upstream", req.request_id.split("#", 1)[0], **where):
            return await self._send(ep, body, req, sink, start, first_s, by_budget)

    async def _send(self, ep: Endpoint, body: dict[str, object], req: EngineRequest, sink: Sink, start: float,
                    first_s: float, by_budget: bool) -> RequestOutput:
        loop = asyncio.get_running_loop()
        ep.acquire(time.monotonic())
        healthy: bool | None = False
        try:
            async with asyncio.timeout(first_s) as tm:
                try:
                    request = self._http.build_request("POST", f"{ep.url}/completions", json=body,
                                                       headers=tracing.inject(dict(self._headers)))
                    resp = await self._http.send(request, stream=True)
                except _UNREACHED as exc:  # no answer began: retrying cannot duplicate anything a client saw
                    raise UpstreamFailure("upstream_unavailable", f"could not reach the upstream "
                                          f"({type(exc).__name__})", retryable=True, retry_after=1) from None
                try:
                    if resp.status_code != 200:
                        await drain(resp)
                        f = failure_for_status(resp.status_code, resp.headers.get("retry-after"))
                        healthy = False if f.counts_against else None
                        raise f
                    req.progress.prompt_tokens = len(req.prompt_ids)  # accepted: the upstream prefills it
                    out = await self._read(resp, req, sink, start, tm, loop)
                    healthy = True
                    return out
                finally:
                    await resp.aclose()
        except TimeoutError:
            left = self._left(req, first=True)
            if by_budget or (left is not None and left <= 0):  # its timer is the deadline's (give or take a tick)
                healthy = None
                raise _Expired from None
            raise UpstreamFailure("upstream_timeout", f"no first token from the upstream within {first_s:g} s"
                                  ) from None
        except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            what = "went silent" if isinstance(exc, httpx.ReadTimeout) else "dropped the stream"
            raise UpstreamFailure("upstream_error", f"the upstream {what} before the end") from None
        except asyncio.CancelledError:
            healthy = None
            raise
        finally:
            ep.release(healthy)

    def _check(self, req: EngineRequest, ids: list[int]) -> None:
        """The upstream was sent the schema; its tokens must also pass our own matcher, or the answer is not
        the JSON the client asked for (an engine that ignored `response_format`)."""
        c = req.constraint
        assert c is not None
        for t in ids:
            if t in self.eos_ids:
                continue
            if not c.allows(t):
                raise UpstreamFailure("upstream_error", "the upstream's output broke the requested JSON schema")
            c.accept(t)

    async def _read(self, resp: httpx.Response, req: EngineRequest, sink: Sink,
                    start: float, tm: asyncio.Timeout, loop: asyncio.AbstractEventLoop) -> RequestOutput:
        end: Chunk | None = None
        usage: dict[str, object] | None = None
        generated: int | None = 0 if self.token_ids else None
        first: float | None = None
        done = False
        event = ""
        async for line in resp.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
                continue
            if not line.startswith("data:"):
                continue  # comments (heartbeats), ids, blank separators
            data = line[5:].strip()
            if event == "error":
                raise UpstreamFailure("upstream_error", "the upstream reported an error mid-stream")
            if data == "[DONE]":
                done = True
                break
            chunk = parse_chunk(data)
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.text or chunk.token_ids:
                if first is None:
                    first = time.monotonic()
                    left = self._left(req, first=False)
                    tm.reschedule(None if left is None else loop.time() + left)  # now only the deadline binds
                if generated is not None:
                    generated += len(chunk.token_ids)
                if req.constraint is not None:
                    self._check(req, chunk.token_ids)
                sink.put(RequestOutput(req.request_id, list(chunk.token_ids), chunk.text, logprobs=chunk.logprobs))
            if chunk.finish is not None:
                end = chunk
        if not done or end is None:
            raise UpstreamFailure("upstream_error", "the upstream closed the stream before it finished")
        reason = finish_reason(end, req)
        prompt, completion, cached = check_usage(usage, req, generated)
        now = time.monotonic()
        ttft = (first or now) - start
        return RequestOutput(
            req.request_id, [], "", finished=True, finish_reason=reason, prompt_tokens=prompt,
            stop_string=end.stop_reason if reason is FinishReason.STOP and isinstance(end.stop_reason, str) else None,
            cached_tokens=cached, completion_tokens=completion, seed=req.params.seed,
            timing=Timing(queue_ms=0.0, prefill_ms=ttft * 1e3, decode_ms=(now - (first or now)) * 1e3,
                          total_ms=(now - start) * 1e3),
        )
