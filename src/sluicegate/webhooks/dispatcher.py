"""Webhooks: `emit` persists an event's deliveries; a background dispatcher signs and sends them.

    await app_state.webhooks.emit(key_id, "batch.completed", {"id": job_id, ...}, subject=job_id,
                                  event_id=f"evt_{job_id}_completed")

`emit` returns once the deliveries are in the store (so a crash after it loses nothing); the dispatcher of
any replica sends them. Passing a stable `event_id` makes a repeated emit (a job system resuming after a
crash) a no-op for endpoints that already have the event. The body is OpenAI's event shape:
`{"id", "object": "event", "type", "created_at", "data"}`, signed per Standard Webhooks (webhook-id,
webhook-timestamp, webhook-signature = `v1,` + base64 HMAC-SHA256 of `id.timestamp.body`).

Outcomes: a 2xx is delivered; a 410 disables the endpoint (and fails what it still had queued); anything else
(another status, a 3xx: redirects are not followed, a timeout, a refused address) is retried with exponential
backoff and jitter until `max_attempts`, then marked failed. Every attempt is in the delivery's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import math
import random
import secrets
import time
from collections import Counter
from typing import Any

import httpx
from standardwebhooks import Webhook

from sluicegate import __version__
from sluicegate.config import WebhookConfig
from sluicegate.store.db import Store
from sluicegate.store.polling import IdlePoll
from sluicegate.tasks import cancel
from sluicegate.webhooks import store as db
from sluicegate.webhooks.ssrf import Guard, Resolver, UnsafeUrl, system_resolve

log = logging.getLogger("sluicegate.webhooks")

EVENT_TYPES = ("batch.completed", "batch.failed", "batch.cancelled", "batch.expired")  # OpenAI's names


def backoff_s(attempts: int, cfg: WebhookConfig) -> float:
    """The wait after the `attempts`-th failure: base * 2^(attempts-1), capped, times a jitter in [0.5, 1)."""
    return float(min(cfg.backoff_base_s * 2 ** (attempts - 1), cfg.backoff_max_s) * random.uniform(0.5, 1.0))


def sign(secret: str, event_id: str, timestamp: dt.datetime, body: str) -> dict[str, str]:
    """The Standard Webhooks headers for one attempt."""
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": Webhook(secret).sign(event_id, timestamp, body),
    }


DUE_SLACK_S = 0.05  # a due retry is looked for this much after its time: the clocks' rounding never finds it early
READ_BYTES = 4096  # of a receiver's answer body, at most this much is read (one socket read: up to 64 KiB)


def lease_s(cfg: WebhookConfig) -> float:
    """How long a claimed delivery is this process's: twice the attempt's whole bound plus 5 s to record the
    outcome, so no replica claims it again while its attempt can still be running."""
    return cfg.timeout_s * 2 + 5


class Webhooks:
    def __init__(self, store: Store, config: WebhookConfig, *, resolve: Resolver = system_resolve,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.store = store
        self.config = config
        self.guard = Guard(config.allow_networks, resolve)
        self._transport = transport
        self._wake = asyncio.Event()
        self._retry_due = math.inf  # monotonic time of the soonest retry this process scheduled since it last looked
        self._task: asyncio.Task[None] | None = None
        self._inflight: dict[asyncio.Task[None], str] = {}  # attempts under way -> their endpoint's id
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the job system's side -------------------------------------------------------------------------------

    def enqueue(self, key_id: str | None, event_type: str, data: dict[str, Any], *, subject: str | None = None,
                event_id: str | None = None) -> int:
        """Persist the event's deliveries (blocking: call from a thread, or use `emit`); how many were queued."""
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown webhook event type {event_type!r}")
        event_id = event_id or "evt_" + secrets.token_hex(12)
        body = json.dumps({"id": event_id, "object": "event", "type": event_type, "created_at": int(time.time()),
                           "data": data}, separators=(",", ":"), ensure_ascii=False)
        n = db.enqueue(self.store, key_id or "", event_type, event_id, body, subject)
        if n and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        return n

    def notified(self, payload: str) -> None:
        """Another replica queued deliveries (payload empty) or scheduled a retry (payload: Unix seconds when
        due): look now, or when it is due (store/notify.py). On the serving event loop."""
        try:
            wait_s = max(0.0, float(payload) - time.time()) if payload else 0.0
        except ValueError:
            wait_s = 0.0
        if wait_s > 0:
            self._retry_due = min(self._retry_due, time.monotonic() + wait_s + DUE_SLACK_S)
        self._wake.set()  # look now, or recompute the wait with the new due time

    async def emit(self, key_id: str | None, event_type: str, data: dict[str, Any], *, subject: str | None = None,
                   event_id: str | None = None) -> int:
        return await asyncio.to_thread(self.enqueue, key_id, event_type, data, subject=subject, event_id=event_id)

    # -- the dispatcher --------------------------------------------------------------------------------------

    def start(self) -> None:
        """On the serving event loop, at start-up."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _run(self) -> None:
        async with httpx.AsyncClient(transport=self._transport, follow_redirects=False, trust_env=False,
                                     timeout=self.config.timeout_s) as client:
            try:
                await self._loop_forever(client)
            finally:  # closing: what is in flight is cut (its lease ends, and a replica sends it again)
                for task in list(self._inflight):
                    task.cancel()
                await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _loop_forever(self, client: httpx.AsyncClient) -> None:
        poll = IdlePoll(self.config.poll_s)  # an idle dispatcher backs off (store/polling.py)
        while True:
            self._wake.clear()
            sent, looked = 0, time.monotonic()
            try:
                sent = await self.send_due(client)
            except Exception:  # the store is away: try again at the next poll
                log.exception("webhook deliveries could not be read")
            if self._retry_due <= looked:  # that look was after it came due
                self._retry_due = math.inf
            # a retry this process scheduled is looked for when it comes due, however idle the poll; an
            # attempt that ends wakes it too (its place is free)
            wait_s = max(0.0, min(poll.after(sent > 0), self._retry_due - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)

    async def send_due(self, client: httpx.AsyncClient) -> int:
        """One pass: claim due deliveries while this process has room (`max_in_flight` attempts at once, at
        most `max_per_endpoint` to one endpoint) and start each attempt. It does not wait for them: an attempt
        that ends frees its place and wakes the dispatcher. Returns how many it started."""
        cfg, total = self.config, 0
        while (room := cfg.max_in_flight - len(self._inflight)) > 0:
            busy = Counter(self._inflight.values())
            claimed = await asyncio.to_thread(db.claim_due, self.store, room, lease_s(cfg),
                                              per_endpoint=cfg.max_per_endpoint, busy=busy)
            if not claimed:
                break
            deadline = asyncio.get_running_loop().time() + cfg.timeout_s  # well inside the lease
            for c in claimed:
                task = asyncio.create_task(self._attempt(client, c, deadline))
                self._inflight[task] = c.endpoint_id
                task.add_done_callback(self._ended)
            total += len(claimed)
        return total

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
        if not task.cancelled() and (exc := task.exception()) is not None:  # recording it failed: the store
            log.error("a webhook attempt's outcome could not be recorded (%s); its lease will run out",
                      type(exc).__name__)
        self._wake.set()

    async def _record(self, c: db.Claimed, **outcome: Any) -> None:
        if not await asyncio.to_thread(db.record_attempt, self.store, c, **outcome):
            log.warning("webhook delivery %d: this sender's lease ran out and another took it over; this attempt's "
                        "outcome is not recorded", c.id)

    async def _attempt(self, client: httpx.AsyncClient, c: db.Claimed, deadline: float) -> None:
        """Send one delivery: everything (resolve, connect, send, status and headers, a few KiB of the body)
        within `deadline`; the status decides. The body is read up to READ_BYTES (so a short answer leaves
        the connection reusable) and the rest never read: the connection is closed instead."""
        t0 = time.perf_counter()
        code: int | None = None
        error: str | None = None
        try:
            async with asyncio.timeout_at(deadline):
                target = await self.guard.target(c.url)
                headers = {**sign(c.secret, c.event_id, db.now(), c.body), "content-type": "application/json",
                           "user-agent": f"sluicegate-webhooks/{__version__}", "host": target.host}
                ext = {"sni_hostname": target.sni} if target.sni else {}
                request = client.build_request("POST", target.url, content=c.body.encode(), headers=headers,
                                               extensions=ext)
                resp = await client.send(request, stream=True)
                try:
                    code = resp.status_code
                    seen = 0
                    async for chunk in resp.aiter_raw():
                        seen += len(chunk)
                        if seen >= READ_BYTES:
                            break
                finally:
                    await resp.aclose()
        except UnsafeUrl as exc:
            error = str(exc)
        except (TimeoutError, httpx.TimeoutException):
            if code is None:  # once the status is in, a body that is slow to come changes nothing
                error = f"timed out: no answer within {self.config.timeout_s:g} s"
        except httpx.HTTPError as exc:
            if code is None:
                error = f"could not connect ({type(exc).__name__})"
        except Exception:  # a bug, or a URL httpx will not send: record it, never leave the row leased forever
            log.exception("webhook delivery %d failed unexpectedly", c.id)
            error = "internal error; the server log has the detail"
        ms = (time.perf_counter() - t0) * 1e3
        if code is not None and 200 <= code < 300:
            await self._record(c, status=db.DELIVERED, status_code=code,
                                    error=None, duration_ms=ms, retry_at=None)
            return
        if code == 410:
            await self._record(c, status=db.FAILED, status_code=code,
                                    error="the receiver answered 410 Gone: endpoint disabled", duration_ms=ms,
                                    retry_at=None, disable="the receiver answered 410 Gone")
            return
        if error is None:
            error = f"the receiver answered {code}" + (" (redirects are not followed)" if code and code < 400 else "")
        attempts = c.attempts + 1
        if attempts >= self.config.max_attempts:
            await self._record(c, status=db.FAILED, status_code=code,
                                    error=error, duration_ms=ms, retry_at=None)
            return
        wait_s = backoff_s(attempts, self.config)
        retry = db.now() + dt.timedelta(seconds=wait_s)
        self._retry_due = min(self._retry_due, time.monotonic() + wait_s + DUE_SLACK_S)  # looks again by then
        await self._record(c, status=db.PENDING, status_code=code, error=error,
                                duration_ms=ms, retry_at=retry)
