"""`/v1/admin/keys`: create (the secret shown once), list, read, change and revoke API keys over HTTP, with the
`admin` scope; the same store and rules as `sluicegate keys` (tenancy/keys.py), and one more: the calling key
cannot create or change a key wider than itself (scopes it lacks, an expiry past its own: 403, the field named).
A change or revocation reaches every replica within the key cache's TTL (docs/keys.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
from collections.abc import Callable
from typing import Literal, TypeVar, cast

from fastapi import APIRouter, Request, Response

from sluicegate.api.jsonbody import parse_json, validate
from sluicegate.api.middleware.auth import api_key_of
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import error_responses, json_reply, refuse_query, require_json
from sluicegate.api.services import store_of
from sluicegate.protocol.admin_keys import KeyCreate, KeyList, KeyOut, KeyUpdate
from sluicegate.serving.errors import ApiError
from sluicegate.tenancy import keys as k

router = APIRouter(tags=["admin"])
log = logging.getLogger("sluicegate.auth")
T = TypeVar("T")
BASE = "/v1/admin/keys"
ERRORS = ("invalid_request", "not_found", "store_unavailable")
KeyState = Literal["active", "revoked", "expired"]


def _ts(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat(timespec="seconds").replace("+00:00", "Z")


def key_out(r: k.KeyRecord, secret: str | None = None) -> KeyOut:
    return KeyOut(id=r.id, name=r.name, prefix=r.display_prefix, scopes=sorted(r.scopes),
                  state=cast(KeyState, r.state()), tpm=r.tpm, burst=r.burst, rpm=r.rpm, max_concurrent=r.max_concurrent,
                  monthly_tokens=r.monthly_tokens, created_at=_ts(r.created_at) or "", expires_at=_ts(r.expires_at),
                  revoked_at=_ts(r.revoked_at), secret=secret)


async def _store(request: Request, call: Callable[..., T], *args: object, **kw: object) -> T:
    try:
        return await asyncio.to_thread(call, store_of(request), *args, **kw)
    except k.KeyRevoked as exc:
        raise ApiError("invalid_request", str(exc), param="key_id", code="key_revoked") from None
    except k.KeyExpired as exc:
        raise ApiError("invalid_request", str(exc), param="key_id", code="key_expired") from None
    except k.NotGranted as denied:  # wider than the calling key itself
        raise ApiError("permission_denied", str(denied), param=denied.param, code=denied.code) from None
    except k.InvalidKeyField as exc:
        raise ApiError("invalid_request", str(exc), param=exc.param, code=exc.code) from None
    except ValueError as exc:  # the rules of tenancy/keys.py: the message names the field
        raise ApiError("invalid_request", str(exc), code="invalid_value") from None
    except Exception:
        log.exception("%s the key store cannot be reached", context_of(request.scope).request_id)
        raise ApiError("store_unavailable", "API keys cannot be read or changed right now", retry_after=1) from None


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _time(text: str | None) -> dt.datetime | None:
    """An RFC 3339 time with its zone (`Z`, `z` and a `t` separator allowed; fractions to the microsecond), in
    UTC; the rules of an expiry (in the future, at most 9999-12-31) are tenancy/keys.py's."""
    if text is None:
        return None
    text = text.strip()
    if not _RFC3339.match(text):
        raise ApiError("invalid_request", "expires_at is not an RFC 3339 time with a zone (2027-01-31T00:00:00Z)",
                       param="expires_at", code="invalid_value")
    norm = re.sub(r"[zZ]$", "+00:00", text)
    norm = re.sub(r"^(\d{4}-\d{2}-\d{2})[tT ]", r"\1T", norm)
    norm = re.sub(r"(\.\d{6})\d+", r"\1", norm)
    try:
        return dt.datetime.fromisoformat(norm).astimezone(dt.UTC)
    except ValueError:
        raise ApiError("invalid_request", "expires_at is not a valid time (RFC 3339, e.g. 2027-01-31T00:00:00Z)",
                       param="expires_at", code="invalid_value") from None
    except OverflowError:  # in range where written, out of it in UTC (9999-12-31T23:00:00-01:00)
        raise ApiError("invalid_request", "expires_at is out of range: at most 9999-12-31T23:59:59Z",
                       param="expires_at", code="invalid_value") from None


def _missing(key_id: str) -> ApiError:
    return ApiError("not_found", "no such API key", param="key_id", code="key_not_found")


@router.post(BASE, response_model=KeyOut, status_code=201,
             summary="Create an API key; the answer shows its secret, once",
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/KeyCreate"}}}}},
             responses=error_responses("invalid_json", "unsupported_media_type", *ERRORS))
async def create(request: Request) -> Response:
    require_json(request)
    refuse_query(request)
    req = validate(parse_json(await request.body()), KeyCreate)
    record, secret = await _store(
        request, k.create_key, req.name, k.parse_scopes(req.scopes), tpm=req.tpm, burst=req.burst, rpm=req.rpm,
        max_concurrent=req.max_concurrent, monthly_tokens=req.monthly_tokens, expires_at=_time(req.expires_at),
        grantor=api_key_of(request.scope))
    log.info("%s key %s created by %s", context_of(request.scope).request_id, record.id,
             context_of(request.scope).key_id or "an unauthenticated caller (auth was off)")
    reply = json_reply(key_out(record, secret), context_of(request.scope))
    reply.status_code = 201
    return reply


@router.get(BASE, response_model=KeyList, summary="Every API key (never a secret), oldest first",
            responses=error_responses(*ERRORS))
async def list_keys(request: Request) -> Response:
    refuse_query(request)
    records = await _store(request, k.list_keys)
    return json_reply(KeyList(data=[key_out(r) for r in records]), context_of(request.scope))


@router.get(BASE + "/{key_id}", response_model=KeyOut, summary="One API key", responses=error_responses(*ERRORS))
async def get_key(request: Request, key_id: str) -> Response:
    record = await _store(request, k.get_key, key_id[:64])
    if record is None:
        raise _missing(key_id)
    return json_reply(key_out(record), context_of(request.scope))


@router.patch(BASE + "/{key_id}", response_model=KeyOut,
              summary="Change a key's name, scopes, limits or expiry (only the fields sent; null: the default)",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": {"$ref": "#/components/schemas/KeyUpdate"}}}}},
              responses=error_responses("invalid_json", "unsupported_media_type", *ERRORS))
async def update(request: Request, key_id: str) -> Response:
    require_json(request)
    req = validate(parse_json(await request.body()), KeyUpdate)
    changes: dict[str, object] = {name: getattr(req, name) for name in req.model_fields_set}
    if "expires_at" in changes:
        changes["expires_at"] = _time(req.expires_at)
    record = await _store(request, k.update_key, key_id[:64], changes, grantor=api_key_of(request.scope))
    if record is None:
        raise _missing(key_id)
    log.info("%s key %s changed (%s)", context_of(request.scope).request_id, record.id, ", ".join(sorted(changes)))
    return json_reply(key_out(record), context_of(request.scope))


@router.delete(BASE + "/{key_id}", response_model=KeyOut,
               summary="Revoke a key: refused everywhere within a second; revoking twice keeps the first time",
               responses=error_responses(*ERRORS))
async def revoke(request: Request, key_id: str) -> Response:
    record = await _store(request, k.revoke_key, key_id[:64])
    if record is None:
        raise _missing(key_id)
    log.info("%s key %s revoked", context_of(request.scope).request_id, record.id)
    return json_reply(key_out(record), context_of(request.scope))
