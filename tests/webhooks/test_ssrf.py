"""The SSRF guard alone, with a fake resolver (no DNS traffic): every resolved address checked, the allow-list,
the pinned target (IP in the URL, the name in Host and SNI), and the backoff's bounds."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from standardwebhooks import Webhook

from sluicegate.config import WebhookConfig
from sluicegate.webhooks import Guard, Target, UnsafeUrl, sign
from sluicegate.webhooks.dispatcher import backoff_s
from sluicegate.webhooks.ssrf import parse_networks

DNS = {"public.test": ["93.184.216.34"], "mixed.test": ["93.184.216.34", "10.0.0.7"],
       "v6.test": ["2606:2800:220:1:248:1893:25c8:1946"], "meta.test": ["169.254.169.254"], "none.test": []}


async def fake(host: str, port: int) -> list[str]:
    if host not in DNS:
        raise OSError("no such name")
    return DNS[host]


def target(url: str, allow: tuple[str, ...] = ()) -> Target:
    return asyncio.run(Guard(allow, fake).target(url))


def refused(url: str, allow: tuple[str, ...] = ()) -> str:
    with pytest.raises(UnsafeUrl) as info:
        target(url, allow)
    return info.value.code


def test_pinned_target_keeps_the_name() -> None:
    t = target("https://public.test/hook?a=1")
    assert t == Target("https://93.184.216.34:443/hook?a=1", "public.test", "public.test")
    t = target("http://v6.test:8080/h")
    assert t.url == "http://[2606:2800:220:1:248:1893:25c8:1946]:8080/h" and t.host == "v6.test:8080" and t.sni is None


def test_every_resolved_address_must_pass() -> None:
    assert refused("https://mixed.test/") == "url_not_allowed"
    assert refused("http://meta.test/") == "url_not_allowed"
    assert refused("http://missing.test/") == "url_unresolvable"
    assert refused("http://none.test/") == "url_unresolvable"


def test_allow_list() -> None:
    assert target("http://mixed.test/", ("10.0.0.0/8",)).url.startswith("http://93.184.216.34:80/")
    assert target("http://127.0.0.1:5/", ("127.0.0.1",)).host == "127.0.0.1:5"
    assert refused("http://127.0.0.2/", ("127.0.0.1",)) == "url_not_allowed"
    with pytest.raises(ValueError, match="not an address"):
        parse_networks(["10.0.0.0/33"])


def test_backoff_doubles_with_jitter_and_a_cap() -> None:
    cfg = WebhookConfig(backoff_base_s=2.0, backoff_max_s=10.0)
    for n, full in ((1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (9, 10.0)):
        for _ in range(20):
            assert full * 0.5 <= backoff_s(n, cfg) <= full


def test_signature_is_standard_webhooks() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    ts = dt.datetime.now(dt.UTC)
    headers = sign(secret, "evt_1", ts, '{"a":1}')
    assert headers["webhook-signature"].startswith("v1,") and headers["webhook-timestamp"] == str(int(ts.timestamp()))
    assert Webhook(secret).verify('{"a":1}', headers) == {"a": 1}


@pytest.mark.parametrize("address", [
    "64:ff9b::7f00:1",  # NAT64 (RFC 6052) of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the metadata service
    "64:ff9b::a00:7",  # NAT64 of 10.0.0.7
    "64:ff9b:1::a00:7",  # local-use NAT64 (RFC 8215): whatever it embeds
    "64:ff9b:1::808:808",
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2002:c0a8:1::1",  # 6to4 of 192.168.0.1
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "2001:0:808:808:0:f7f7:f7f7:f7f7",  # Teredo: a public server, still refused
    "::7f00:1",  # IPv4-compatible (deprecated) of 127.0.0.1
    "::808:808",  # IPv4-compatible of 8.8.8.8: refused as a form, whatever it embeds
    "::ffff:a9fe:a9fe",  # IPv4-mapped of the metadata service
])
def test_translation_prefixes_are_judged_by_what_they_reach(address: str) -> None:
    """An IPv6 address that a translator turns into an IPv4 one (NAT64, 6to4, Teredo, IPv4-mapped/compatible)
    reaches what it embeds: a private one is refused, and the forms whose target cannot be judged are refused."""
    DNS["trans.test"] = [address]
    assert refused("http://trans.test/") == "url_not_allowed"
    assert refused(f"http://[{address}]/") == "url_not_allowed"


def test_translation_of_a_public_address_passes_and_the_allow_list_sees_the_embedded_one() -> None:
    """DNS64 on an IPv6-only host synthesises 64:ff9b::<public IPv4> for an IPv4-only receiver: it passes."""
    for address in ("64:ff9b::808:808", "2002:808:808::1", "::ffff:808:808"):
        assert target(f"http://[{address}]:8080/h").url == f"http://[{address}]:8080/h"
    assert target("http://[64:ff9b::a00:7]/", ("10.0.0.0/8",)).host == "[64:ff9b::a00:7]"
    assert target("http://[2002:a00:7::1]/", ("10.0.0.0/8",)).host == "[2002:a00:7::1]"
    assert refused("http://[64:ff9b::a00:7]/", ("11.0.0.0/8",)) == "url_not_allowed"
    assert target("http://[64:ff9b:1::a00:7]/", ("64:ff9b:1::/48",)).host == "[64:ff9b:1::a00:7]"
