"""Shared fixtures: an in-process app on the reference backend."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from sluicegate.api.app import create_app
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config


def make_client(config: Config | None = None, factory: Callable[[], ReferenceRunner] | None = None) -> TestClient:
    app = create_app(config or Config(), factory or (lambda: ReferenceRunner(n_ctx=512, n_slots=8)))
    return TestClient(app, raise_server_exceptions=False)


def wait_ready(client: TestClient, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError("the app did not become ready")


@pytest.fixture
def client() -> Iterator[TestClient]:
    """The app on the reference backend, lifespan run, model loaded."""
    with make_client() as c:
        wait_ready(c)
        yield c
