"""Keys end to end: the `keys` and `db` commands as subprocesses, `serve` refusing what it must before it loads
anything, and the real server (SmolLM2) turning auth on and refusing a revoked key made by another process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from sluicegate.store.db import display_url
from sluicegate.store.migrate import head_revision, upgrade
from sluicegate.tenancy.keys import KEY_PATTERN, new_secret, well_formed
from tests.dbs import postgres_database, url_string
from tests.e2e.conftest import free_port, start_server, stop_server

GEN = {"prompt": "The capital of France is", "max_new_tokens": 2, "temperature": 0}


def sluicegate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluicegate", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(params=["sqlite", "postgres"])
def store_args(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """How a command names its store: a data directory (SQLite, created on demand), or a new Postgres database
    brought to head with `sluicegate db upgrade`."""
    if request.param == "sqlite":
        yield ["--data-dir", str(tmp_path / "data")]
        return
    with postgres_database() as url:
        args = ["--database-url", url_string(url)]
        done = sluicegate("db", "upgrade", *args)
        assert done.returncode == 0, done.stderr
        head = head_revision()  # the newest migration the package ships
        assert f"upgraded from an empty schema to revision {head}" in done.stdout
        again = sluicegate("db", "upgrade", *args)
        assert again.returncode == 0 and f"already at revision {head}" in again.stdout
        yield args


def test_keys_create_list_revoke(store_args: list[str]) -> None:
    made = sluicegate("keys", "create", "--name", "ci bot", "--scope", "generate", "--scope", "metrics",
                      "--tpm", "1000", "--burst", "200", "--expires-in", "30", *store_args)
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    secret = lines[-1]
    assert KEY_PATTERN.match(secret) and well_formed(secret)
    assert all(secret not in line for line in lines[:-1])
    key_id = lines[0].split()[1]
    assert key_id.startswith("key_") and "generate,metrics" in lines[0] and "tpm 1000" in lines[0]

    listed = sluicegate("keys", "list", *store_args)
    assert listed.returncode == 0
    (line,) = listed.stdout.splitlines()
    assert line.split()[0] == key_id and " active " in line and line.endswith("ci bot")
    assert secret not in listed.stdout and secret[8:16] in line  # the lookup prefix identifies it, nothing more

    revoked = sluicegate("keys", "revoke", key_id, *store_args)
    assert revoked.returncode == 0 and f"revoked {key_id}" in revoked.stdout
    assert " revoked " in sluicegate("keys", "list", *store_args).stdout
    assert "already revoked" in sluicegate("keys", "revoke", key_id, *store_args).stdout
    missing = sluicegate("keys", "revoke", "key_nope", *store_args)
    assert missing.returncode == 1 and "no key key_nope" in missing.stderr
    assert sluicegate("keys", "create", "--name", "x", "--scope", "root", *store_args).returncode == 2
    assert sluicegate("keys", "create", "--name", "x", "--tpm", "0", *store_args).returncode == 2


def test_serve_refuses_a_postgres_schema_older_than_the_code() -> None:
    with postgres_database() as url:
        shown = display_url(url)
        for revision in (None, "0001"):
            if revision is not None:
                upgrade(url, revision)
            started = time.monotonic()
            done = sluicegate("serve", "--port", str(free_port()), "--database-url", url_string(url))
            assert done.returncode == 2, done.stderr
            assert f"Run: sluicegate db upgrade --database-url {shown}" in done.stderr
            print(f"refused in {time.monotonic() - started:.1f}s: {done.stderr.strip()}")


def test_serve_without_keys_binds_only_to_loopback(tmp_path: Path) -> None:
    done = sluicegate("serve", "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(tmp_path))
    assert done.returncode == 2
    assert "holds no API key" in done.stderr and "--insecure-no-auth" in done.stderr


def test_insecure_no_auth_is_logged(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--host", "0.0.0.0", "--insecure-no-auth", "--slots", "2")
    try:
        assert httpx.post(f"{server.url}/v1/generate", json=GEN, timeout=60).status_code == 200
    finally:
        stop_server(server)
    assert "--insecure-no-auth: serving on 0.0.0.0 WITHOUT authentication" in server.log()


def test_the_real_server_with_keys_made_by_another_process(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    server = start_server(tmp_path, *data, "--slots", "2")
    try:
        url = server.url
        assert httpx.post(f"{url}/v1/generate", json=GEN, timeout=60).status_code == 200  # no key yet: open
        made = sluicegate("keys", "create", "--name", "e2e", *data)
        secret = made.stdout.splitlines()[-1]
        key_id = made.stdout.split()[1]

        def refused_without() -> bool:
            return httpx.post(f"{url}/v1/generate", json=GEN, timeout=60).status_code == 401

        started = time.monotonic()
        while not refused_without():
            assert time.monotonic() - started < 60, "auth never turned on"
        r = httpx.post(f"{url}/v1/generate", json=GEN, headers={"x-api-key": secret}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2

        with (
            openai.OpenAI(base_url=f"{url}/v1", api_key=new_secret(), max_retries=0, timeout=60) as c,
            pytest.raises(openai.AuthenticationError),
        ):
            c.chat.completions.create(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}])
        with openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=60) as c:
            out = c.chat.completions.create(model="smollm2-135m-instruct", max_tokens=3,
                                            messages=[{"role": "user", "content": "Hi"}])
            assert out.usage is not None and out.usage.completion_tokens <= 3

        usage = httpx.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {secret}"}, timeout=60).json()
        (day,) = usage["data"]
        assert day["key_id"] == key_id and day["requests"] == 2 and day["generated_tokens"] >= 3

        assert sluicegate("keys", "revoke", key_id, *data).returncode == 0
        revoked_at = time.monotonic()
        while httpx.get(f"{url}/v1/models", headers={"x-api-key": secret}, timeout=60).status_code != 401:
            assert time.monotonic() - revoked_at < 60, "the revocation never took effect"
        print(f"revoked key refused {(time.monotonic() - revoked_at) * 1e3:.0f} ms after `keys revoke` returned")
    finally:
        stop_server(server)
    assert secret not in server.log()
