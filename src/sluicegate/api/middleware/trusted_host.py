"""Trusted hosts (pure ASGI): a request whose `Host` header names a host this server does not serve is refused.

Why: a server on 127.0.0.1 is reachable from every web page the machine's browser opens. With DNS rebinding
a page on `evil.example` re-resolves its own name to 127.0.0.1 and becomes same-origin with this server, so
the browser lets it read the answers; the one trace left is the `Host` header, which still says
`evil.example`. So on a loopback bind only loopback names and addresses are served by default; on a wildcard
or other bind any host is (an operator who opened the port has more than a browser to fear), unless
`--allowed-hosts` sets the list (docs/serving.md, "Trusted hosts").

Hand-written rather than Starlette's `TrustedHostMiddleware`: that one answers in plain text without the
envelope or `X-Request-Id`, and cuts `Host: [::1]:8000` at the first colon, so it can never match IPv6.
It sits inside the request-context middleware, so the refusal carries the request id.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.api.envelope import send_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.hostnames import normal_host, parse_pattern
from sluicegate.serving.errors import ApiError

__all__ = [
    "LOOPBACK_HOSTS", "HostRule", "TrustedHostMiddleware", "document_trusted_host", "host_name", "is_loopback",
    "parse_pattern",
]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]", "*")


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine: `localhost`, 127.0.0.0/8 or ::1 (not 0.0.0.0, not a name)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: bytes) -> str | None:
    """The host of a `Host` header value (`name`, `name:port`, `1.2.3.4:80`, `[::1]:8000`), normalised; None
    when the value is not a host with an optional numeric port."""
    try:
        text = header.decode("ascii")
    except UnicodeDecodeError:
        return None
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return normal_host(host)
    host, colon, port = text.partition(":")
    if colon and not (port.isdigit() and port.isascii()):
        return None
    return normal_host(host)


class HostRule:
    """Which Host header names are served: `allowed` None means any."""

    def __init__(self, allowed: Iterable[str] | None, *, loopback_default: bool = False) -> None:
        self.loopback_default = loopback_default  # the list is the loopback bind's default, not --allowed-hosts
        self.allowed = None if allowed is None else tuple(dict.fromkeys(parse_pattern(p) for p in allowed))
        if self.allowed is not None and "*" in self.allowed:
            self.allowed = None
        self._exact = frozenset(p for p in self.allowed or () if not p.startswith("*."))
        self._suffixes = tuple(p[1:] for p in self.allowed or () if p.startswith("*."))

    @classmethod
    def for_bind(cls, bind_host: str, allowed: Iterable[str] | None) -> HostRule:
        """The rule for a server listening on `bind_host`: `allowed` when given; else loopback names on a
        loopback bind (the bind address itself too, e.g. 127.0.0.2), any host on a wildcard or other bind."""
        if allowed is not None:
            return cls(allowed)
        if bind_host.strip() not in _WILDCARD_BINDS and is_loopback(bind_host):
            return cls([*LOOPBACK_HOSTS, bind_host], loopback_default=True)
        return cls(None)

    def accepts(self, name: str | None) -> bool:
        if self.allowed is None:
            return True
        if name is None:
            return False
        return name in self._exact or any(name.endswith(s) for s in self._suffixes)


def untrusted_host(rule: HostRule) -> ApiError:
    how = ("address it as localhost, 127.0.0.1 or [::1], or start it with --allowed-hosts NAME"
           if rule.loopback_default else "the names it serves are set with --allowed-hosts")
    return ApiError(
        "untrusted_host",
        f"the Host header does not name a host this server serves (DNS rebinding protection); {how}",
        param="Host", code="untrusted_host",
    )


def document_trusted_host(doc: dict[str, Any]) -> None:
    """Every operation may answer 400 `untrusted_host` (the rule applies to every route): declare it where an
    operation declares no 400 of its own (the OpenAI routes' 400 already carries the envelope)."""
    envelope = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}
    for operations in doc.get("paths", {}).values():
        for op in operations.values():
            op.setdefault("responses", {}).setdefault("400", {
                "description": "untrusted_host: the Host header names a host this server does not serve",
                "content": envelope})


class TrustedHostMiddleware:
    def __init__(self, app: ASGIApp, rule: HostRule) -> None:
        self.app = app
        self.rule = rule

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.rule.allowed is None:
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        # Exactly one Host (RFC 9112 3.2); a missing or doubled one is refused like a foreign one.
        if len(hosts) == 1 and self.rule.accepts(host_name(hosts[0])):
            await self.app(scope, receive, send)
            return
        await send_error(send, untrusted_host(self.rule), context_of(scope).request_id)
