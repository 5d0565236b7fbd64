"""Idempotency-Key on the POST routes that create work (IETF draft, Stripe's behaviour; docs/idempotency.md).

Every route that creates work uses it the same way (generate, chat, completions; predictions and batch
items next):

    key = idempotency_key(request)            # None without the header; a malformed one raises 422
    parsed = ...                               # read and validate the body as usual
    if key is not None:
        held = await begin(request, key, parsed)    # a Response: the stored answer, replayed;
                                                    # raises 409 idempotency_key_in_use, 422 ..._reused
        if isinstance(held, Response):
            return held
        started = await held.start(lambda: ...)     # a refusal here releases the key and raises it
        return await held.answer(request.receive, finish(started), render)    # or held.stream(items, ...)

- The key is scoped to the API key (auth off: one shared scope), at most 255 visible ASCII characters; the
  draft's structured-field form (`"abc"`) and Stripe's bare form (`abc`) are the same key.
- The fingerprint is of the parsed request (the validated model as canonical JSON: sorted keys, defaults
  filled in) and the route: key order, whitespace or an explicit default do not make a different request.
- The answer is remembered in the process just before its client gets the last bytes and written to the
  store right after (off the client's wait): a retry on the heels of it is replayed on this replica, and gets
  409 for those milliseconds on another.
- Claiming the key is one insert the database's unique constraint decides (tenancy/idempotency.py), so two
  replicas sharing a database run the work once. Refusals before execution (validation, budget, 401/403/413,
  429) never claim it or release it; answers the client is told to retry (429, 503, 504) release it too.
  Everything else the work answered, 500 included (as Stripe does), is stored and replayed with
  `Idempotent-Replayed: true`.
- The work runs detached from its client (api/detached.py): a client that leaves does not cancel it.
- A replay costs no tokens: nothing is reserved, the ledger records it with zero tokens.
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
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.state import app_state
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.tenancy.idempotency import IdempotencyStore, Outcome, StoredAnswer

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


async def begin(request: Request, key: str, parsed: BaseModel) -> Held | Response:
    """Claim `key` for this request (Held: run the work), or replay its stored answer; raises ApiError 409
    `idempotency_key_in_use` (the first is still running), 422 `idempotency_key_reused` (another request),
    503 `store_unavailable` (the store cannot be read)."""
    ctx = context_of(request.scope)
    state = app_state(request)
    scope = ctx.key_id or ""
    route = request.scope["path"]
    fp = fingerprint(route, parsed)
    t = time.perf_counter()
    try:
        claim = await state.idempotency.claim_here(scope, key, route, fp)  # on the loop where it need not block
        if claim is None:
            claim = await asyncio.to_thread(state.idempotency.claim, scope, key, route, fp)
    except Exception:
        log.exception("%s the idempotency keys could not be read", ctx.request_id)
        raise ApiError("store_unavailable", "idempotency keys cannot be checked right now", retry_after=1) from None
    finally:
        ctx.stage("idempotency", t)
    if claim.outcome is Outcome.CLAIMED:
        return Held(state.idempotency, scope, key, claim.owner, fp, ctx)
    if claim.outcome is Outcome.REPLAY:
        assert claim.answer is not None
        return replay(claim.answer)
    if claim.outcome is Outcome.IN_USE:
        raise ApiError("idempotency_key_in_use", f"a request with this {PARAM} is still running; retry after "
                       "Retry-After to get its answer", param=PARAM,
                       retry_after=state.config.idempotency.retry_after_s)
    raise ApiError("idempotency_key_reused", f"this {PARAM} was used for a different request (another body or "
                   "route); send a new key with a new request", param=PARAM)


class Held:
    """A claimed key: the request's work runs detached from its client, and its answer is stored (or the key
    released) when the work ends. It is the work's `Keeper` (api/detached.py)."""

    def __init__(self, idem: IdempotencyStore, scope: str, key: str, owner: str, fp: str,
                 ctx: RequestContext) -> None:
        self._idem = idem
        self._scope = scope
        self._key = key
        self._owner = owner
        self._fingerprint = fp
        self._ctx = ctx

    async def start(self, start: Callable[[], Awaitable[S]]) -> S:
        """Start the work; a refusal before execution (any exception) releases the key and propagates."""
        try:
            return await start()
        except BaseException:
            await asyncio.shield(self._release())
            raise

    async def answer(self, receive: Receive, finish: Coroutine[Any, Any, Response], render: Render) -> Response:
        """A whole answer (an ApiError from `finish` rendered by `render`), made even if the client leaves."""
        return await answer_detached(receive, finish, render=render, request_id=self._ctx.request_id, keeper=self)

    def stream(self, items: AsyncIterator[BaseModel | None],
               render_error: Callable[[ApiError, str], dict[str, Any]]) -> Response:
        """Server-sent events, produced to the end even if the client leaves."""
        return stream_detached(items, request_id=self._ctx.request_id, render_error=render_error, keeper=self)

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
        try:
            await asyncio.to_thread(self._idem.complete, self._scope, self._key, self._owner, self._stored(finished))
        except Exception:
            log.exception("%s storing an idempotent answer failed; its key frees up when its lease ends",
                          self._ctx.request_id)

    @staticmethod
    def _stored(finished: Finished) -> StoredAnswer:
        headers = {k: v for k, v in finished.headers.items() if k in KEPT_HEADERS}
        return StoredAnswer(finished.status, headers, finished.body)

    async def _release(self) -> None:
        try:
            await asyncio.to_thread(self._idem.release, self._scope, self._key, self._owner)
        except Exception:
            log.exception("%s releasing an idempotency key failed; it frees up when its lease ends",
                          self._ctx.request_id)


def _storable(finished: Finished) -> bool:
    """An answer is kept unless it tells the client to retry (429, 503, 504; a stream's error event too)."""
    error_status = finished.error.status if finished.error is not None else None
    return finished.status not in RETRY_STATUSES and error_status not in RETRY_STATUSES


__all__ = ["REPLAYED", "Held", "begin", "fingerprint", "idempotency_key", "replay"]
