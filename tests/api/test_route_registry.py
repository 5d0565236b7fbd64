"""The route registry (sluicegate/registry.py) against the app: every mounted route has its entry and every entry
its routes, the per-path facts land on a mounted path, Idempotency-Key is read exactly where the registry says,
and no path table grows back beside it in the source."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

import sluicegate
from sluicegate.api.batch_items import handlers
from sluicegate.api.dialects import RENDERING
from sluicegate.errorcatalog import DOCS_PATH
from sluicegate.registry import FALLBACK, ROUTES, Dialect, Route, Shape, batch_targets, jobs_route, route_for
from sluicegate.serving.errors import ApiError
from tests.conftest import make_client

SRC = Path(sluicegate.__file__).parent
# Clients of an API, not its routes: the paths they name are requests they send (this server's for cli/,
# contract/ and testing/; an upstream's for upstream/), so they are not scanned for route policy.
CLIENTS = ("cli", "contract", "testing", "upstream")
TABLES = (ast.Tuple, ast.List, ast.Set, ast.Dict)


@pytest.fixture(scope="module")
def app() -> FastAPI:
    app = make_client().app  # no lifespan: the routes are mounted when the app is built
    assert isinstance(app, FastAPI)
    return app


def mounted(app: FastAPI) -> list[tuple[str, frozenset[str]]]:
    """(path template, methods) of every route the app mounts, FastAPI's OpenAPI document included."""
    out = [(c.path, frozenset(c.methods or ())) for c in iter_route_contexts(app.routes) if c.path is not None]
    assert len(out) > 40, out  # the walk reached into the included routers
    return out


def test_every_mounted_route_has_one_entry_and_every_entry_its_routes(app: FastAPI) -> None:
    paths = [r.path for r in ROUTES]
    assert len(paths) == len(set(paths)), "two entries for one path"  # so the most specific entry is one entry
    methods: dict[Route, set[str]] = defaultdict(set)
    for path, verbs in mounted(app):
        route = route_for(path)
        assert route is not FALLBACK, f"{path} is mounted but no registry entry covers it: add one"
        methods[route] |= verbs
    for route in ROUTES:
        assert methods[route] == set(route.methods), f"{route.path}: the methods mounted at or below it"


def test_the_facts_of_a_path_land_on_a_mounted_path(app: FastAPI) -> None:
    at = {(path, m) for path, verbs in mounted(app) for m in verbs}
    for r in ROUTES:
        if r.work or r.deadline or r.idempotent or r.upload or r.batch or r.jobs:
            assert (r.path, "POST") in at, f"{r.path}: its POST facts need a POST route mounted at the path"
        if r.drain_exempt or r.probe:
            assert (r.path, "GET") in at, f"{r.path}: drain and probes answer a GET mounted at the path"
        if r.deadline or r.idempotent or r.batch:
            assert r.work, f"{r.path}: deadlines, Idempotency-Key and batch items are for routes that create work"


def test_batch_items_run_where_the_registry_says() -> None:
    targets = batch_targets(Shape.OPENAI) + batch_targets(Shape.SEED)
    assert set(handlers(lambda name: pytest.fail("no item runs here"))) == set(targets)
    assert jobs_route(batch_targets(Shape.OPENAI)[0]) == "/v1/batches"
    assert jobs_route(batch_targets(Shape.SEED)[0]) == "/v1/batch-predictions"
    with pytest.raises(KeyError):
        jobs_route("/v1/generate")  # no batch item runs there


def test_every_dialect_is_rendered_one_way() -> None:
    """Each registry dialect has its rendering (api/dialects.py), and a batch item's status is what the route
    answers (Anthropic's route answer is the envelope, re-rendered by its middleware: not compared here)."""
    assert set(RENDERING) == set(Dialect)
    errors = (ApiError("invalid_request", "x", code="unknown_field"), ApiError("model_not_found", "x"),
              ApiError("not_found", "x", code="response_not_found"), ApiError("overloaded", "x", retry_after=1))
    for dialect in (Dialect.NATIVE, Dialect.OPENAI):
        for exc in errors:
            assert RENDERING[dialect].render(exc, "r").status_code == RENDERING[dialect].status(exc)


def test_idempotency_key_is_read_on_the_registry_s_routes_only(app: FastAPI, client: TestClient) -> None:
    """A malformed Idempotency-Key on every mounted POST: refused by its name exactly where the registry says
    the route takes one (the handlers read it themselves, so this checks the registry against them)."""
    posts = sorted(path for path, verbs in mounted(app) if "POST" in verbs)
    for template in posts:
        path = template.replace("{", "").replace("}", "")  # a parameter stands for itself: any id will do
        r = client.post(path, content=b"{", headers={"Idempotency-Key": "two words",
                                                     "Content-Type": "application/json"})
        refused = r.status_code in (400, 422) and r.json()["error"]["code"] == "invalid_idempotency_key"
        route = route_for(template)
        assert refused == (route.idempotent and route.path == template), (template, r.status_code, r.text)


def path_literals(app: FastAPI) -> dict[str, list[tuple[str, str | None]]]:
    """path -> (where, the table it is in) for each string or bytes constant in the server's source that is a
    route's path (`/` left out: too common a string to be told from one)."""
    paths = ({r.path for r in ROUTES} | {path for path, _ in mounted(app)}) - {"/"}
    found: dict[str, list[tuple[str, str | None]]] = defaultdict(list)

    def walk(node: ast.AST, where: Path, table: str | None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            value = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if value in paths:
                found[value].append((f"{where}:{node.lineno}", table))
        if table is None and isinstance(node, TABLES):  # the outermost one: a table of Route(...) is one table
            table = f"{where}:{node.lineno}"
        for child in ast.iter_child_nodes(node):
            walk(child, where, table)

    for file in sorted(SRC.rglob("*.py")):
        where = file.relative_to(SRC)
        if where.parts[0] not in CLIENTS:
            walk(ast.parse(file.read_text(encoding="utf-8")), where, None)
    assert len(found) > 20, found  # the scan saw the registry and the routes
    return found


def test_no_route_path_is_in_two_tables(app: FastAPI) -> None:
    for path, seen in path_literals(app).items():
        tables = {table for _, table in seen if table is not None}
        assert len(tables) <= 1, f"{path} is in {len(tables)} tables: {sorted(tables)}; declare it in the registry"


def test_route_paths_are_written_in_the_registry_and_where_routes_mount_only(app: FastAPI) -> None:
    """A path compared or listed anywhere else is route policy outside the registry (a table grown back). One
    exception: the error catalog's page, whose path the catalog names (`DOCS_PATH`, every envelope's default
    `docs_url`) and the registry and its route read, since the catalog imports nothing of sluicegate."""
    for path, seen in path_literals(app).items():
        for where, _ in seen:
            if path == DOCS_PATH and where.startswith("errorcatalog/__init__.py:"):
                continue
            assert where.startswith(("registry.py:", "api/routes/")), (
                f"{path} is written at {where}: read the route registry (sluicegate/registry.py) instead")
