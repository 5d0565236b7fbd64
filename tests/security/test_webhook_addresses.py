"""The webhook address guard judges by an explicit table of IANA's special-purpose ranges, not by the
interpreter's `is_global`: site-local fec0::/10 and IPv4-translated ::ffff:0:0:0/96 (which Python 3.11 calls
public) are refused with every other range that is not globally reachable, as literals and over HTTP."""

from __future__ import annotations

import asyncio
import ipaddress

import httpx
import pytest

from sluicegate.webhooks import Guard, UnsafeUrl
from tests.api.threaded_server import threaded_server

NOT_GLOBAL = [
    # IPv4 special-purpose (RFC 6890 and successors), multicast, broadcast
    "0.0.0.1", "10.1.2.3", "100.64.0.1", "127.0.0.1", "127.255.255.254", "169.254.169.254", "172.16.0.1",
    "172.31.255.255", "192.0.0.8", "192.0.0.9", "192.0.2.1", "192.88.99.1", "192.168.1.1", "198.18.0.1",
    "198.19.255.255", "198.51.100.7", "203.0.113.9", "224.0.0.1", "239.255.255.250", "240.0.0.1",
    "255.255.255.255",
    # IPv6: loopback, unspecified, site-local, unique-local, link-local, multicast, documentation, discard,
    # the IETF block (Teredo, benchmarking, ORCHID), local-use NAT64, IPv4-compatible, SRv6
    "::1", "::", "fec0::1", "feff::1", "fc00::1", "fd12:3456::1", "fe80::1", "ff02::1", "ff0e::1", "2001:db8::1",
    "3fff::1", "100::1", "2001::1", "2001:2::1", "2001:20::1", "64:ff9b:1::a00:1", "::7f00:1", "5f00::1",
    # translations of IPv4 addresses that are not global: mapped, translated (SIIT), NAT64, 6to4
    "::ffff:127.0.0.1", "::ffff:0:7f00:1", "::ffff:0:a00:1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe",
    "2002:7f00:1::1", "2002:c0a8:101::1",
]
GLOBAL = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2001:4860:4860::8888",
          "::ffff:93.184.216.34", "64:ff9b::808:808", "2002:5db8:d822::1"]


@pytest.mark.parametrize("address", NOT_GLOBAL)
def test_every_non_global_address_is_refused(address: str) -> None:
    guard = Guard()
    assert not guard.allowed(ipaddress.ip_address(address))
    shown = f"[{address}]" if ":" in address else address
    with pytest.raises(UnsafeUrl) as refused:
        asyncio.run(guard.target(f"http://{shown}/hook"))
    assert refused.value.code == "url_not_allowed"


@pytest.mark.parametrize("address", GLOBAL)
def test_global_addresses_pass(address: str) -> None:
    assert Guard().allowed(ipaddress.ip_address(address))


def test_an_operator_can_still_allow_a_range() -> None:
    assert Guard(["fec0::/10"]).allowed(ipaddress.ip_address("fec0::1"))
    assert Guard(["127.0.0.0/8"]).allowed(ipaddress.ip_address("::ffff:0:7f00:1"))  # judged as what it reaches


def test_the_reported_addresses_are_refused_over_http() -> None:
    with threaded_server() as srv:
        for url in ("http://[fec0::1]/hook", "http://[::ffff:0:7f00:1]:8000/hook"):
            r = httpx.post(f"{srv.url}/v1/webhook-endpoints", json={"url": url, "event_types": ["batch.completed"]},
                           timeout=30)
            assert r.status_code == 422 and r.json()["error"]["code"] == "url_not_allowed", r.text
