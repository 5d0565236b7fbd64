"""The playground's routes in-process: the page and its assets, their headers (a strict CSP), nothing else."""

from __future__ import annotations

import re
from importlib import resources

from fastapi.testclient import TestClient

from sluicegate.api.routes.playground import ASSETS, CSP


def test_the_page_is_served_at_root_and_playground_with_a_strict_csp(client: TestClient) -> None:
    for path in ("/", "/playground"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "<title>sluicegate playground</title>" in r.text
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
                      "frame-ancestors 'none'"):
        assert directive in CSP
    assert "unsafe" not in CSP


def test_the_page_has_no_inline_script_or_style_and_nothing_from_elsewhere(client: TestClient) -> None:
    html = client.get("/").text
    assert not re.search(r"<script(?![^>]*\bsrc=)", html) and "<style" not in html and " style=" not in html
    assert not re.search(r"\bon[a-z]+=", html)  # no inline handlers (the CSP would block them)
    for name in ASSETS:
        body = client.get(f"/playground/assets/{name}").text
        assert "http://" not in body.replace("http://www.w3.org/2000/svg", "") and "https://" not in body
    referenced = set(re.findall(r"/playground/assets/([\w.]+)", html))
    for name in ASSETS:
        if name.endswith(".js"):
            referenced |= set(re.findall(r'from "\./([\w.]+)"', client.get(f"/playground/assets/{name}").text))
    assert referenced == set(ASSETS)  # every shipped file is used, every used file is shipped


def test_each_asset_has_its_type_and_an_unknown_name_is_a_404_envelope(client: TestClient) -> None:
    types = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
    for name in ASSETS:
        r = client.get(f"/playground/assets/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(types[name.rsplit(".", 1)[1]])
        assert r.content == resources.files("sluicegate.api").joinpath("playground", name).read_bytes()
    for bad in ("index.html", "..%2F..%2Fconfig.py", "app.js.map", "%2E%2E"):
        r = client.get(f"/playground/assets/{bad}")
        assert r.status_code == 404, bad
        assert r.json()["error"]["code"] in ("asset_not_found", "unknown_route") and bad not in r.text


def test_the_page_is_not_part_of_the_api_contract(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not any(p == "/" or p.startswith("/playground") for p in paths)


def test_a_reload_revalidates_with_the_etag(client: TestClient) -> None:
    for path in ("/", "/playground/assets/app.js"):
        first = client.get(path)
        assert first.headers["cache-control"] == "no-cache"
        etag = first.headers["etag"]
        again = client.get(path, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
        assert client.get(path, headers={"If-None-Match": '"other"'}).content == first.content
