"""A threaded server on a given store, and a second engine on the same database for making keys (as the CLI or
another process would)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import update

from sluicegate.config import Config
from sluicegate.store.db import Store
from sluicegate.store.models import ApiKey
from sluicegate.tenancy.keys import KeyRecord, Scope, create_key
from tests.api.threaded_server import SlowRunner, Threaded, threaded_server


@dataclass
class Served:
    srv: Threaded
    admin: Store  # its own engine on the server's database

    @property
    def url(self) -> str:
        return self.srv.url

    def key(self, *scopes: Scope, name: str = "test") -> tuple[KeyRecord, str]:
        return create_key(self.admin, name, set(scopes) or {Scope.GENERATE})

    def expire(self, key_id: str) -> None:
        with self.admin.session() as s, s.begin():
            past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
            s.execute(update(ApiKey).where(ApiKey.id == key_id).values(expires_at=past))


@contextmanager
def served(db_url: str, config: Config | None = None,
           runner: Callable[[], SlowRunner] | None = None) -> Iterator[Served]:
    store = Store.open(db_url)
    admin = Store.open(db_url)
    try:
        with threaded_server(config, runner, store=store) as srv:
            yield Served(srv, admin)
    finally:
        admin.close()
        store.close()


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


GEN = {"prompt": "Hello there", "max_new_tokens": 4, "temperature": 0}


def status(url: str, path: str, secret: str | None = None, method: str = "GET",
           json: dict[str, Any] | None = None) -> int:
    headers = auth(secret) if secret else {}
    return httpx.request(method, url + path, headers=headers, json=json, timeout=30).status_code
