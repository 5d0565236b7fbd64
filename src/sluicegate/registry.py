"""The route registry: every HTTP route's policy, declared once, in `ROUTES`.

An entry is a path and what holds for it: the methods mounted there, who may call it (no key, any valid key, or
a key with a scope), whether a POST to it creates engine work (metered), its error dialect, whether it reads the
caller's deadline headers, takes an Idempotency-Key, answers while the server drains, is a health probe, takes
an upload, and which batch items may run on it. The middlewares (auth, key limits, deadlines, drain, body limit,
Anthropic's errors), the error rendering (api/dialects.py), the connection guard, the batch items and the job
intake read it; none keeps a path table of its own, and a new route is one entry here (docs/architecture.md).
tests/api/test_route_registry.py checks it against the routes the app mounts, and that no other path table
comes back.

Which paths an entry covers:

- A guarded entry (a scope, or any key) covers its path and every path below it: `/v1/files` covers
  `/v1/files/{file_id}/content`, and an unknown `/v1/files/x/y` too, which needs the `batch` scope before it
  is told 404 (a key without it learns nothing of the routes there). `methods` are those of every route
  mounted at or below the path.
- A public entry covers its own path only (`/healthz/x` needs a key), unless `tree` (static assets).
- The most specific entry wins (`/v1/messages/count_tokens` over `/v1/messages`); a path none covers needs any
  valid key (`FALLBACK`: unknown routes).

`work` holds for every POST the entry covers: the usage ledger's row (under the entry's path) and the key's
request limits. The other facts hold for the entry's own path only, and `deadline`, `idempotent`, `upload` and
`batch` for its POST only.

Below `api/` (it imports nothing of it: the `foundations` contract) so that jobs/ and protocol/ read it too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypedDict

from sluicegate.errorcatalog import DOCS_PATH
from sluicegate.tenancy.keys import Scope as KeyScope


class Access(enum.StrEnum):
    PUBLIC = "public"  # no key, ever
    ANY_KEY = "any key"  # any valid key, whatever its scopes


class Dialect(enum.StrEnum):
    """The shape of the route's errors: chosen here alone, written as api/dialects.py `RENDERING` maps it."""

    NATIVE = "native"  # the envelope (api/envelope.py)
    OPENAI = "openai"  # OpenAI's statuses (api/openai_errors.py)
    ANTHROPIC = "anthropic"  # every error re-rendered in Anthropic's shape (api/anthropic_errors.py)


class Upload(enum.StrEnum):
    """A POST body streamed to the store, under the upload limit (`--max-file-bytes`) instead of the JSON one."""

    FILE = "file"  # a multipart file (and its form fields)
    JSONL = "jsonl"  # a JSONL body (by its Content-Type; a JSON body stays under the JSON limit)


class Shape(enum.StrEnum):
    """A batch job's shape (jobs/store.py `shape`)."""

    OPENAI = "openai"  # OpenAI's Batch API: an input file, strict validation
    SEED = "seed"  # batch predictions: the body is the input, a bad line fails alone


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    methods: tuple[str, ...]
    auth: KeyScope | Access
    dialect: Dialect = Dialect.NATIVE
    tree: bool = False  # a public entry covering the paths below it too
    work: bool = False  # a POST creates engine work: metered (a ledger row per POST) and under the key's limits
    deadline: bool = False  # X-Request-Timeout and the SDKs' timeout headers read (api/middleware/deadline.py)
    idempotent: bool = False  # Idempotency-Key accepted (api/idempotency.py)
    drain_exempt: bool = False  # answered while the server drains (api/drain.py)
    probe: bool = False  # a health probe: answered on the connections past --max-connections (api/server)
    upload: Upload | None = None
    batch: Shape | None = None  # batch items of this shape may run on this route (api/batch_items.py)
    jobs: Shape | None = None  # creates batch jobs of this shape: their items' ledger route

    @property
    def public(self) -> bool:
        return self.auth is Access.PUBLIC

    @property
    def scope(self) -> KeyScope | None:
        """The scope a key needs; None: none (public, or any valid key)."""
        return self.auth if isinstance(self.auth, KeyScope) else None

    def covers(self, path: str) -> bool:
        return path == self.path or ((self.tree or not self.public) and path.startswith(self.path + "/"))


class _Surface(TypedDict):
    work: bool
    deadline: bool
    idempotent: bool


GET, POST, DELETE, PATCH = "GET", "POST", "DELETE", "PATCH"
_WORK: _Surface = {"work": True, "deadline": True, "idempotent": True}  # a surface that runs the model

# named where other code runs them: the batch items' adapters (api/batch_items.py)
CHAT = Route("/v1/chat/completions", (POST,), KeyScope.GENERATE, Dialect.OPENAI, **_WORK, batch=Shape.OPENAI)
COMPLETIONS = Route("/v1/completions", (POST,), KeyScope.GENERATE, Dialect.OPENAI, **_WORK, batch=Shape.OPENAI)
PREDICTIONS = Route("/v1/predictions", (POST, GET), KeyScope.GENERATE, **_WORK, batch=Shape.SEED)

ROUTES: tuple[Route, ...] = (
    Route("/openapi.json", (GET, "HEAD"), Access.ANY_KEY),  # FastAPI's own: the OpenAPI document
    Route("/healthz", (GET,), Access.PUBLIC, drain_exempt=True, probe=True),
    Route("/readyz", (GET,), Access.PUBLIC, drain_exempt=True, probe=True),  # it says 503 itself while draining
    Route("/metrics", (GET,), KeyScope.METRICS, drain_exempt=True),
    Route("/", (GET,), Access.PUBLIC),  # the playground page (api/routes/playground.py): no data, no work
    Route("/playground", (GET,), Access.PUBLIC),
    Route("/playground/assets", (GET,), Access.PUBLIC, tree=True),
    Route(DOCS_PATH, (GET,), Access.PUBLIC),  # /docs/errors, the error catalog's page: where docs_url points
    Route("/v1/generate", (POST,), KeyScope.GENERATE, **_WORK),
    CHAT,
    COMPLETIONS,
    Route("/v1/messages", (POST,), KeyScope.GENERATE, Dialect.ANTHROPIC, **_WORK),
    Route("/v1/messages/count_tokens", (POST,), KeyScope.GENERATE, Dialect.ANTHROPIC),  # no work
    Route("/v1/responses", (POST, GET, DELETE), KeyScope.GENERATE, Dialect.OPENAI, **_WORK),  # stored: by their key
    PREDICTIONS,
    Route("/tokenize", (POST,), KeyScope.GENERATE),
    Route("/detokenize", (POST,), KeyScope.GENERATE),
    Route("/v1/models", (GET,), Access.ANY_KEY, Dialect.OPENAI),
    Route("/v1/usage", (GET,), Access.ANY_KEY),
    Route("/v1/files", (POST, GET, DELETE), KeyScope.BATCH, Dialect.OPENAI, upload=Upload.FILE),
    Route("/v1/batches", (POST, GET), KeyScope.BATCH, Dialect.OPENAI, jobs=Shape.OPENAI),
    Route("/v1/batch-predictions", (POST, GET, DELETE), KeyScope.BATCH, upload=Upload.JSONL, jobs=Shape.SEED),
    Route("/v1/webhook-endpoints", (POST, GET, DELETE), KeyScope.BATCH),  # webhooks announce batch events
    Route("/v1/webhook-deliveries", (GET,), KeyScope.BATCH),
    Route("/v1/admin", (POST, GET, PATCH, DELETE), KeyScope.ADMIN),  # keys over HTTP
)
FALLBACK = Route("", (), Access.ANY_KEY)  # a path no entry covers (unknown routes): any valid key

_MOST_SPECIFIC_FIRST = sorted(ROUTES, key=lambda r: len(r.path), reverse=True)


def route_for(path: str) -> Route:
    """The entry covering `path` (a request's path, or a mounted route's template), else `FALLBACK`."""
    for route in _MOST_SPECIFIC_FIRST:
        if route.covers(path):
            return route
    return FALLBACK


def batch_targets(shape: Shape) -> tuple[str, ...]:
    """The routes a batch job of this shape may run its items on (the `endpoint` it names), in registry order."""
    return tuple(r.path for r in ROUTES if r.batch is shape)


_JOBS_ROUTE = {r.jobs: r.path for r in ROUTES if r.jobs is not None}


def jobs_route(endpoint: str) -> str:
    """The route that creates the batch jobs whose items run on `endpoint` (the usage ledger's route for them);
    KeyError when no batch item runs there."""
    shape = {r.path: r.batch for r in ROUTES if r.batch is not None}[endpoint]
    return _JOBS_ROUTE[shape]


__all__ = ["CHAT", "COMPLETIONS", "FALLBACK", "PREDICTIONS", "ROUTES", "Access", "Dialect", "Route", "Shape", "Upload",
           "batch_targets", "jobs_route", "route_for"]
