"""Idempotency-Key on the POST routes that create work (IETF draft, Stripe's behaviour; docs/idempotency.md).

Every route that creates work uses it the same way (generate, chat, completions, predictions):

    key = idempotency_key(request)            # None without the header; a malformed one raises 422
    parsed = ...                               # read and validate the body as usual
    if key is not None:
        held = begin(request, key, parsed)
        started = await held.start(lambda gate: ...)  # the work prepared with `gate` (`Held.claim`) in its
                                                      # admission; a Response: the stored answer, replayed; raises
                                                      # 409 idempotency_key_in_use, 422 ..._reused; a refusal
                                                      # here releases the key and raises it
        if isinstance(started, Response):
            return started
        return await held.answer(request.receive, finish(started), render)    # or held.stream(items, ...)

The work lifecycle (api/work.py) does this for every work route.

- The key is scoped to the API key (auth off: one shared scope), at most 255 visible ASCII characters; the
  draft's structured-field form (`"abc"`) and Stripe's bare form (`abc`) are the same key.
- The fingerprint is of the parsed request (the validated model as canonical JSON: sorted keys, defaults
  filled in) and the route: key order, whitespace or an explicit default do not make a different request.
- The answer is remembered in the process just before its client gets the last bytes and written to the
  store right after (off the client's wait): a retry on the heels of it is replayed on this replica, and gets
  409 for those milliseconds on another.
- Claiming the key is one insert the database's unique constraint decides (tenancy/idempotency.py), so two
  replicas sharing a database run the work once. It is the gate of the request's admission
  (serving/admission.py), passed after validation and tokenisation at the same time as the rate limit's
  reservation: the two round trips overlap. Refusals before execution (validation, budget, 401/403/413,
  429) never claim it or release it; answers the client is told to retry (429, 503, 504) release it too.
  Everything else the work answered, 500 included (as Stripe does), is stored and replayed with
  `Idempotent-Replayed: true`.
- A request that meets its key in use waits for the holder (at most `in_use_wait_s`, 25 s, within its own
  deadline), looking again every quarter of a second and more rarely later: the holder's answer is replayed as
  soon as it is stored, and a holder that died (killed mid-request: its claim's lease, renewed every third of
  `lease_s` while it lives, runs out within `lease_s`, 10 s) is taken over and the work runs once, here. Only a
  holder still alive after the wait gets 409 `idempotency_key_in_use`. So a retry after a crash (HAProxy's on
  an empty response, or the SDK's) ends with the answer, not 409s (docs/idempotency.md).
- The work runs detached from its client (api/detached.py): a client that leaves does not cancel it.
- A replay costs no tokens: the reservation made beside its claim is given back before its answer, and the
  ledger records it with zero tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel
from starlette.types import Receive

from sluicegate.api.detached import Finished, Render, answer_detached, stream_detached
from sluicegate.api.envelope import http_status
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.services import tenancy_of
from sluicegate.api.sse import OPENAI_FRAMING, Framing
from sluicegate.api.tenancy import Tenancy
from sluicegate.refusal import Rejected
from sluicegate.serving.admission import Gate
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.tenancy.idempotency import Claim, ClaimState, IdempotencyStore, StoredAnswer

log = logging.getLogger("sluicegate.idempotency")

HEADER = b"idempotency-key"
PARAM = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY = 255
KEPT_HEADERS = ("content-type", "cache-control", "x-accel-buffering", "x-should-retry")  # stored with an answer
RETRY_STATUSES = frozenset({429, 503, 504})  # answers that tell the client to retry: never stored
_VISIBLE = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY}}}")
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
S = TypeVar("S")


def _invalid(why: str) -> ApiError:
    return ApiError("invalid_request", f"the {PARAM} header {why}", param=PARAM, code="invalid_idempotency_key")


def idempotency_key(request: Request) -> str | None:
    """The request's Idempotency-Key, or None without one; refuses a malformed one (422; 400 on OpenAI routes)."""
    values = [v for k, v in request.scope["headers"] if k == HEADER]
    if not values:
        return None
    if len(values) > 1:
        raise _invalid("is sent more than once; send one")
    raw = values[0].decode("latin-1").strip(" \t")
    quoted = _SF_STRING.fullmatch(raw)
    if raw.startswith('"') and not quoted:
        raise _invalid('starts with a quote but is not a quoted string (RFC 8941): send "key" or key')
    key = re.sub(r"\\(.)", r"\1", quoted.group(1)) if quoted else raw
    if not _VISIBLE.fullmatch(key):
        raise _invalid(f"must be 1 to {MAX_KEY} visible ASCII characters (no spaces or control characters)")
    return key


def fingerprint(route: str, parsed: BaseModel) -> str:
    """SHA-256 of the route and the parsed request as canonical JSON (sorted keys, no whitespace)."""
    body = json.dumps(parsed.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{route}\n{body}".encode()).hexdigest()


def replay(answer: StoredAnswer) -> Response:
    """The stored answer again: its status, headers that matter and exact body, marked as a replay."""
    return Response(answer.body, status_code=answer.status, headers={**answer.headers, REPLAYED: "true"})


def begin(request: Request, key: str, parsed: BaseModel) -> Held:
    """The request's hold on `key`, claimed when its work is about to start (`Held.start`)."""
    ctx = context_of(request.scope)
    route = request.scope["path"]
    return Held(tenancy_of(request), ctx.key_id or "", key, route, fingerprint(route, parsed), ctx)


class _Replay(Exception):
    """The key's stored answer, found by the claim: the work does not run."""

    def __init__(self, response: Response) -> None:
        super().__init__()
        self.response = response


class Held:
    """An Idempotency-Key on a request that creates work. `start` claims it (or finds why not) while the work
    is prepared; the work then runs detached from its client, and its answer is stored (or the key released)
    when it ends. It is the work's `Keeper` (api/detached.py)."""

    def __init__(self, tenancy: Tenancy, scope: str, key: str, route: str, fp: str, ctx: RequestContext) -> None:
        self._tenancy = tenancy
        self._idem: IdempotencyStore = tenancy.idempotency
        self._scope = scope
        self._key = key
        self._route = route
        self._fingerprint = fp
        self._ctx = ctx
        self._owner: str | None = None  # set once the claim is this request's

    async def start(self, start: Callable[[Gate], Awaitable[S]]) -> S | Response:
        """Prepare and start the work, given the gate (`claim`) its admission passes (serving/admission.py:
        with the rate limit's reservation, both round trips at once, after the request is validated and
        tokenised, before the engine sees it). Returns the work, or the stored answer replayed; raises 409
        `idempotency_key_in_use`, 422 `idempotency_key_reused`, 503 `store_unavailable`. A refusal before
        execution (any exception) releases a claim made and propagates."""
        try:
            started = await start(self.claim)
        except _Replay as replayed:
            return replayed.response
        except BaseException:
            if self._owner is not None:
                await asyncio.shield(self._release())
            raise
        if self._owner is None:  # every start passes the gate before the engine sees work
            raise RuntimeError("the work started without its Idempotency-Key claimed")
        return started

    async def claim(self) -> None:
        """The gate: claim the key for this request, or raise why it does not run."""
        t = time.perf_counter()
        try:
            claim = await self._claim_once()
            if claim.outcome is ClaimState.IN_USE:
                claim = await self._wait_for_holder()
        finally:
            self._ctx.record.stage("idempotency", t)
        if claim.outcome is ClaimState.CLAIMED:
            self._owner = claim.owner
            return
        if claim.outcome is ClaimState.REPLAY:
            assert claim.answer is not None
            raise _Replay(replay(claim.answer))
        if claim.outcome is ClaimState.IN_USE:
            raise ApiError("idempotency_key_in_use", f"a request with this {PARAM} is still running; retry after "
                           "Retry-After to get its answer", param=PARAM,
                           retry_after=self._tenancy.config.idempotency.retry_after_s)
        raise ApiError("idempotency_key_reused", f"this {PARAM} was used for a different request (another body "
                       "or route); send a new key with a new request", param=PARAM)

    async def _claim_once(self) -> Claim:
        idem, scope, key, route, fp = self._idem, self._scope, self._key, self._route, self._fingerprint
        try:
            claim = await idem.claim_here(scope, key, route, fp)  # on the loop where it need not block it
            if claim is None:
                claim = await asyncio.to_thread(idem.claim, scope, key, route, fp)
        except Exception:
            log.exception("%s the idempotency keys could not be read", self._ctx.request_id)
            raise ApiError("store_unavailable", "idempotency keys cannot be checked right now",
                           retry_after=1) from None
        return claim

    async def _wait_for_holder(self) -> Claim:
        """The key is in use: look again until its holder answered (a replay), died (its lease ran out: the claim
        is taken over) or the wait is over (still in use), within `in_use_wait_s` and the request's deadline."""
        wait_s = self._tenancy.config.idempotency.in_use_wait_s
        if self._ctx.deadline is not None:
            wait_s = min(wait_s, self._ctx.deadline - time.monotonic() - 1.0)
        end = time.monotonic() + wait_s
        pause = 0.25
        claim = Claim(ClaimState.IN_USE)
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(pause, left))
            claim = await self._claim_once()
            if claim.outcome is not ClaimState.IN_USE:
                break
            pause = min(pause * 1.5, 1.0)
        return claim

    async def answer(self, receive: Receive, finish: Coroutine[Any, Any, Response], render: Render) -> Response:
        """A whole answer (a refusal from `finish` rendered by `render`), made even if the client leaves."""
        return await answer_detached(receive, finish, render=render, request_id=self._ctx.request_id, keeper=self)

    def stream(self, items: AsyncIterator[BaseModel | str | None],
               render_error: Callable[[Rejected, str], dict[str, Any]], framing: Framing = OPENAI_FRAMING) -> Response:
        """Server-sent events, produced to the end even if the client leaves."""
        return stream_detached(items, request_id=self._ctx.request_id, render_error=render_error, keeper=self,
                               framing=framing)

    def answered(self, finished: Finished) -> None:
        """Remember a storable answer in the process before its client has it (api/detached.py)."""
        if _storable(finished):
            self._idem.remember(self._scope, self._key, self._fingerprint, self._stored(finished))

    async def done(self, finished: Finished | None) -> None:
        """Write the answer to the store, or release the key; never raises (a failure is logged, and the key
        frees up when its lease ends)."""
        if finished is None or not _storable(finished):
            await self._release()
            return
        assert self._owner is not None, "answered without a claim"
        try:
            answer = self._stored(finished)
            if await self._idem.complete_here(self._scope, self._key, self._owner, answer) is None:
                await asyncio.to_thread(self._idem.complete, self._scope, self._key, self._owner, answer)
        except Exception:
            log.exception("%s storing an idempotent answer failed; its key frees up when its lease ends",
                          self._ctx.request_id)

    @staticmethod
    def _stored(finished: Finished) -> StoredAnswer:
        headers = {k: v for k, v in finished.headers.items() if k in KEPT_HEADERS}
        return StoredAnswer(finished.status, headers, finished.body)

    async def _release(self) -> None:
        try:
            if self._owner is not None:
                await asyncio.to_thread(self._idem.release, self._scope, self._key, self._owner)
        except Exception:
            log.exception("%s releasing an idempotency key failed; it frees up when its lease ends",
                          self._ctx.request_id)


def _storable(finished: Finished) -> bool:
    """An answer is kept unless it tells the client to retry (429, 503, 504; a stream's error event too)."""
    error_status = http_status(finished.error) if finished.error is not None else None
    return finished.status not in RETRY_STATUSES and error_status not in RETRY_STATUSES


__all__ = ["REPLAYED", "Held", "begin", "fingerprint", "idempotency_key", "replay"]
