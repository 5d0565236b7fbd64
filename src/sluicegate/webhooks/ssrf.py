"""The SSRF guard: a webhook URL may only reach public addresses, and the request goes to the one checked.

A webhook URL is chosen by a client, and the server then makes requests to it: without a guard, a client
could aim it at the server's own network (a cloud metadata service at 169.254.169.254, an admin port on
127.0.0.1, a database on 10.x). So:

- the URL is `http` or `https`, with a host, no user name or password, at most 2048 characters;
- its host is resolved, and every address it resolves to must be globally reachable, unless an operator's
  allow-list (`WebhookConfig.allow_networks`, `serve --webhook-allow-network`) holds it. Globally reachable is
  decided by an explicit table, not by the interpreter's `ipaddress.is_global` (whose answer changes between
  Python versions: 3.11 calls fec0::1 and ::ffff:0:7f00:1 public): an IPv4 address must lie outside every
  range of IANA's IPv4 Special-Purpose Address Registry that is not globally reachable, multicast and the
  limited broadcast (`V4_NOT_GLOBAL`); an IPv6 address must lie in 2000::/3 (the only block IANA allocates
  for global unicast: so loopback, link-local, site-local fec0::/10, unique-local, multicast and the
  unspecified address are all refused) and outside the IPv6 Special-Purpose Registry's ranges that are not
  globally reachable (`V6_NOT_GLOBAL`);
- an IPv6 address a translator turns into IPv4 is judged as the IPv4 address it reaches: IPv4-mapped
  (::ffff:0:0/96), IPv4-translated (::ffff:0:0:0/96, RFC 2765), NAT64's well-known prefix (64:ff9b::/96,
  RFC 6052) and 6to4 (2002::/16); the forms whose IPv4 target cannot be read from the address alone
  (local-use NAT64 64:ff9b:1::/48, Teredo 2001::/32, the deprecated IPv4-compatible ::/96) are refused unless
  allow-listed as such;
- the request is sent to the checked address (the URL's host replaced by it), with the original `Host`
  header and, for https, the original name as TLS SNI and for certificate checks, so a name that resolves
  differently a moment later (DNS rebinding) cannot redirect it;
- redirects are not followed (a 3xx is a failed attempt), and no proxy from the environment is used.

Hand-written: no maintained library pins a checked address into httpx; this is the standard pattern (resolve,
check, connect to the IP with Host and SNI kept) in a few lines.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]
MAX_URL = 2048
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the last 32 bits are the IPv4 address (RFC 6052)
SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")  # IPv4-translated (RFC 2765): the last 32 bits are IPv4
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
# IANA's IPv4 Special-Purpose Address Registry, the ranges not globally reachable (192.0.0.0/24 whole, its two
# global /32s included), and multicast (224.0.0.0/4): a webhook never goes there
V4_NOT_GLOBAL = tuple(ipaddress.IPv4Network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4", "255.255.255.255/32"))
# IANA's IPv6 Special-Purpose Address Registry inside 2000::/3, the ranges not globally reachable (2001::/23
# whole: Teredo, benchmarking, ORCHID and the rest); everything outside 2000::/3 is refused already
V6_NOT_GLOBAL = tuple(ipaddress.IPv6Network(n) for n in (
    "2001::/23", "2001:db8::/32", "3fff::/20"))
OPAQUE_TRANSLATIONS = (  # IPv4 reached through these is not readable from the address: refused
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215): the operator picks where v4 sits
    ipaddress.IPv6Network("2001::/32"),  # Teredo: a relay, and the client's address obfuscated
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (deprecated, RFC 4291), :: and ::1 included
)


class UnsafeUrl(ValueError):
    """The URL is malformed, or reaches an address it may not; `code` says which, the message why (no input)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Target:
    """Where one request goes: `url` addresses the checked IP; `host` is the Host header (and SNI name)."""

    url: str
    host: str
    sni: str | None  # https: the name the TLS handshake sends and the certificate must match


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def parse_networks(specs: Sequence[str]) -> tuple[IPNetwork, ...]:
    """CIDRs or single addresses (`127.0.0.1`, `10.0.0.0/8`, `::1`); raises ValueError naming a bad one."""
    out: list[IPNetwork] = []
    for spec in specs:
        try:
            out.append(ipaddress.ip_network(spec.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not an address or network: {spec!r}") from None
    return tuple(out)


class Guard:
    def __init__(self, allow: Sequence[str] = (), resolve: Resolver = system_resolve) -> None:
        self.allow = parse_networks(allow)
        self._resolve = resolve

    def allowed(self, ip: IPAddress) -> bool:
        if any(ip.version == net.version and ip in net for net in self.allow):
            return True
        if isinstance(ip, ipaddress.IPv6Address):
            v4 = embedded_ipv4(ip)
            if v4 is not None:
                return self.allowed(v4)
            if any(ip in net for net in OPAQUE_TRANSLATIONS):
                return False
            return ip in GLOBAL_UNICAST and not any(ip in net for net in V6_NOT_GLOBAL)
        return not any(ip in net for net in V4_NOT_GLOBAL)

    async def target(self, url: str) -> Target:
        """Check `url` and resolve its host now; the Target to send to (raises UnsafeUrl)."""
        parts = check_url(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses: list[IPAddress] = [literal]
        else:
            try:
                found = await self._resolve(host, port)
            except (OSError, UnicodeError):
                raise UnsafeUrl("url_unresolvable", "the URL's host does not resolve") from None
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
            if not addresses:
                raise UnsafeUrl("url_unresolvable", "the URL's host does not resolve")
        for ip in addresses:
            if not self.allowed(ip):
                raise UnsafeUrl("url_not_allowed", "the URL resolves to a private, loopback, link-local or other "
                                "non-public address; an operator can allow it (--webhook-allow-network)")
        ip = addresses[0]
        shown = f"[{ip}]" if ip.version == 6 else str(ip)
        netloc = f"{shown}:{port}"
        host_header = parts.netloc  # as written: name and any port
        pinned = parts._replace(netloc=netloc).geturl()
        return Target(pinned, host_header, host if parts.scheme == "https" and literal is None else None)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a translator sends packets for `ip` to (IPv4-mapped or -translated, NAT64, 6to4), or
    None."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in NAT64 or ip in SIIT:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def check_url(url: str) -> SplitResult:
    """The URL's form alone (no resolution): scheme, host, no credentials, a valid port, its length."""
    if len(url) > MAX_URL:
        raise UnsafeUrl("invalid_url", f"the URL is longer than {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UnsafeUrl("invalid_url", "the URL is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeUrl("invalid_url", "the URL must be http or https")
    if not parts.hostname:
        raise UnsafeUrl("invalid_url", "the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("invalid_url", "the URL must not carry a user name or password")
    if port == 0:
        raise UnsafeUrl("invalid_url", "the URL's port must be 1 to 65535")
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        raise UnsafeUrl("invalid_url", "the URL must not contain whitespace or control characters")
    return parts
