"""API-key auth (pure ASGI), inside the request context: every refusal carries the request id and the envelope.

- Off while the store holds no key: every caller may do everything, and an `Authorization` header is ignored
  (clients that must send one keep working). On as soon as the store holds a key (seen within the cache's
  TTL), and from then on: revoking every key does not switch it off.
- The key comes as `Authorization: Bearer KEY` or `x-api-key: KEY`; both at once must agree.
- Every route but `/healthz`, `/readyz` and the playground page (`/`, `/playground` and its static assets: they
  hold no data, and the page must load to ask for a key) is guarded: a scope, or any valid key, as the route
  registry (sluicegate/registry.py) declares it; a path no entry covers needs any valid key.
- 401 `authentication_required` (no key), 401 `invalid_api_key` (malformed; or unknown, revoked, expired,
  which share one message so a caller cannot learn which keys exist), both with `WWW-Authenticate: Bearer`;
  403 `permission_denied` (the key lacks the route's scope). 503 `store_unavailable` when the key cannot be
  checked (fail closed).
- The key's id becomes the request's tenant (`RequestContext.tenant`, the scheduler's fairness unit), and
  its scopes go to `RequestContext.scopes`.
- The POSTs of the routes that create work (the registry's `work`) get one usage-ledger row, under the entry's
  path, when the response has ended, with the status sent and the request's usage (`RequestContext.used()`,
  the figure rate limits settle with; zeros when the request was refused).
- The key is never logged: neither this module nor the access log writes headers.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.api.envelope import send_error
from sluicegate.api.middleware.request_context import StatusWatch, context_of
from sluicegate.registry import Route, route_for
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.telemetry import tracing
from sluicegate.tenancy.keys import ALL_SCOPES, KEY_LENGTH, PREFIX, KeyRecord, acceptable

if TYPE_CHECKING:
    from sluicegate.api.tenancy import Tenancy

log = logging.getLogger("sluicegate.auth")


HOW = "send it as Authorization: Bearer KEY or x-api-key: KEY"
INVALID = "the API key is not valid: it is unknown, revoked or expired"


def _missing() -> ApiError:
    return ApiError("authentication_required", f"this route needs an API key; {HOW}", code="missing_api_key",
                    headers={"WWW-Authenticate": 'Bearer realm="sluicegate"'})


def _invalid(code: str, message: str = INVALID) -> ApiError:
    return ApiError("invalid_api_key", message, code=code,
                    headers={"WWW-Authenticate": 'Bearer realm="sluicegate", error="invalid_token"'})


def _forbidden(scope: str) -> ApiError:
    return ApiError("permission_denied", f"this API key lacks the '{scope}' scope this route needs",
                    code="missing_scope",
                    headers={"WWW-Authenticate": f'Bearer realm="sluicegate", error="insufficient_scope", '
                                                 f'scope="{scope}"'})


def credentials(scope: Scope) -> str | ApiError:
    """The key the request carries, or the refusal: none sent, a scheme other than Bearer, or two that differ."""
    found: set[str] = set()
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return _invalid("unsupported_scheme", f"the Authorization header must use the Bearer scheme; {HOW}")
            found.add(token.strip())
        elif name == b"x-api-key":
            found.add(value.decode("latin-1").strip())
    if not found:
        return _missing()
    if len(found) > 1:
        return _invalid("conflicting_api_keys", "the request carries two different API keys; send one")
    return found.pop()


_ENVELOPE = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer sg_live_..."},
    "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}


def document_auth(doc: dict[str, Any]) -> None:
    """Declare the key schemes in an OpenAPI document, and on every guarded operation the scope it needs and
    its 401 and 403 answers."""
    doc.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    for path, operations in doc.get("paths", {}).items():
        route = route_for(path)
        if route.public:
            continue
        for op in operations.values():
            op["security"] = [{"bearer": []}, {"apiKeyHeader": []}]
            responses = op.setdefault("responses", {})
            responses.setdefault("401", {"description": "authentication_required, invalid_api_key (once the "
                                                        "server holds API keys)", "content": _ENVELOPE})
            if route.scope is not None:
                responses.setdefault("403", {"description": f"permission_denied: needs the `{route.scope.value}` "
                                                            "scope", "content": _ENVELOPE})


def api_key_of(scope: Scope) -> KeyRecord | None:
    """The key this request was authenticated with (its `tpm` and `burst` included); None when auth is off."""
    record = scope.get("state", {}).get("api_key")
    return record if isinstance(record, KeyRecord) else None


class AuthMiddleware:
    def __init__(self, app: ASGIApp, tenancy: Tenancy) -> None:
        self.app = app
        self.tenancy = tenancy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        route = route_for(scope["path"])
        if route.public:
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        t = time.perf_counter()
        with tracing.span("auth", ctx.request_id):
            refusal = await self._authenticate(scope, route, ctx)
        ctx.record.stage("auth", t)
        if refusal is not None:
            if scope["type"] == "websocket":  # no route takes one today; one added later is guarded too
                await send({"type": "websocket.close", "code": 1008})
            else:
                await send_error(send, refusal, ctx.request_id)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        if not route.work or scope.get("method") != "POST":  # reading a stored result costs no tokens
            await self.app(scope, receive, send)
            return
        watch = StatusWatch(send)
        try:
            await self.app(scope, receive, watch)
        finally:
            usage = ctx.used()
            self.tenancy.ledger.record(ctx.key_id, route.path, usage.prompt_tokens, usage.cached_tokens,
                                       usage.generated_tokens, watch.status or 500, request_id=ctx.ledger_id)

    async def _authenticate(self, scope: Scope, route: Route, ctx: RequestContext) -> ApiError | None:
        keys = self.tenancy.keys
        try:
            if not await keys.enforced():
                ctx.scopes = ALL_SCOPES
                return None
            got = credentials(scope)
            if isinstance(got, ApiError):
                return got
            if not acceptable(got):
                return _invalid("malformed_api_key", f"the API key is malformed: a sluicegate key is {PREFIX} "
                                f"and {KEY_LENGTH - len(PREFIX)} letters and digits, the last 6 a checksum (an "
                                "imported one: 24 to 256 visible characters)")
            record = await keys.lookup(got)
        except Exception:
            log.exception("%s the key store could not be read", ctx.request_id)
            return ApiError("store_unavailable", "API keys cannot be checked right now", retry_after=1)
        if record is None or not record.usable():
            return _invalid("invalid_api_key")
        ctx.key_id = ctx.tenant = record.id
        ctx.scopes = record.scopes
        scope.setdefault("state", {})["api_key"] = record  # for middleware inside this one (rate limits)
        if route.scope is not None and route.scope not in record.scopes:
            return _forbidden(route.scope.value)
        return None

__all__ = ["AuthMiddleware", "api_key_of", "credentials", "document_auth"]
