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
