"""Shared fixtures: an in-process app on the reference backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sluicegate.api.app import create_app
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config
from sluicegate.store.migrate import upgrade
from sluicegate.testing.wait import wait_for
from tests.dbs import BACKENDS, postgres_database, sqlite_url, truncate, url_string


def make_client(config: Config | None = None, factory: Callable[[], ReferenceRunner] | None = None) -> TestClient:
    app = create_app(config or Config(), factory or (lambda: ReferenceRunner(n_ctx=512, n_slots=8)))
    # 127.0.0.1, not TestClient's `testserver`: the default config binds loopback, which serves loopback names only
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


def wait_ready(client: TestClient, timeout: float = 60.0) -> None:
    wait_for(lambda: client.get("/readyz").status_code == 200, timeout, message="the app to become ready")


@pytest.fixture
def client() -> Iterator[TestClient]:
    """The app on the reference backend, lifespan run, model loaded."""
    with make_client() as c:
        wait_ready(c)
        yield c


@pytest.fixture(scope="session")
def postgres_store_url() -> Iterator[str]:
    """This session's Postgres database, migrated to head (skips when Postgres is absent)."""
    with postgres_database() as url:
        upgrade(url)
        yield url_string(url)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store migrated to head and holding nothing: a SQLite file, then the session's Postgres database."""
    if request.param == "sqlite":
        url = sqlite_url(tmp_path)
        upgrade(url)
        return url
    url = str(request.getfixturevalue("postgres_store_url"))
    truncate(url)
    return url


@pytest.fixture(params=BACKENDS)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no schema at all: a new SQLite file, or a new Postgres database."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path)
        return
    with postgres_database() as url:
        yield url_string(url)
