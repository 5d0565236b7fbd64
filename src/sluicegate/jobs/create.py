"""Creating a job from its input, for both shapes: limits, validation, items written page by page."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from sluicegate.config import JobsConfig
from sluicegate.jobs.files import FileStore, LineSplitter
from sluicegate.jobs.intake import LINE_DEPTH, PAGE, Intake, TooManyItems
from sluicegate.jobs.limits import check_concurrency, check_tokens, too_many_items
from sluicegate.jobs.store import JobStore, OverLimit
from sluicegate.refusal import Rejected
from sluicegate.registry import Shape, batch_targets
from sluicegate.serving.strict_json import parse_json

WINDOW_S = {"24h": 24 * 3600.0}
SEED_WINDOW = "24h"
(SEED_ENDPOINT,) = batch_targets(Shape.SEED)  # the one route a seed job's items run on (the route registry)


def create_openai(jobs: JobStore, files: FileStore, cfg: JobsConfig, estimate_new: int, *, key_id: str | None,
                  input_file_id: str, endpoint: str, window: str, meta: dict[str, str] | None) -> str:
    """Validate the whole input file (streamed) and queue its requests; a bad input fails the job (OpenAI's
    rule), a per-key limit refuses it (Rejected, and no job remains). Synchronous: call it in a thread."""
    job_id = new_job(jobs, cfg, key_id=key_id, shape="openai", endpoint=endpoint, window_s=WINDOW_S[window],
                     window=window, input_file_id=input_file_id, meta=meta)
    intake = Intake(jobs, job_id, cfg.max_items_per_job, estimate_new)
    try:
        for line, raw in enumerate(files.lines(input_file_id), 1):
            intake.openai_line(line, raw, endpoint)
        intake.flush()
        if not intake.errors and intake.count == 0:
            intake.errors.append({"code": "empty_file", "message": "The input file has no request.", "param": None,
                                  "line": None})
        if intake.errors:
            jobs.fail(job_id, intake.errors)
            return job_id
        start(jobs, cfg, job_id, key_id, intake)
    except TooManyItems as exc:
        jobs.discard(job_id)
        raise too_many_items(exc.limit) from None
    except BaseException:  # a refusal by a limit, or anything unforeseen: no job left `validating`
        jobs.discard(job_id)
        raise
    return job_id


def new_job(jobs: JobStore, cfg: JobsConfig, **kw: Any) -> str:
    """A job created within the key's concurrent-jobs limit (checked atomically: jobs/store.py)."""
    try:
        return jobs.create(**kw, max_active=cfg.max_concurrent_jobs)
    except OverLimit as exc:
        check_concurrency(cfg, exc.before)
        raise AssertionError("unreachable: over the limit") from None


def start(jobs: JobStore, cfg: JobsConfig, job_id: str, key_id: str | None, intake: Intake) -> None:
    """Start the validated job within the key's enqueued-token limit (checked atomically: jobs/store.py)."""
    check_tokens(cfg, 0, intake.est_tokens)  # alone over the limit: refused before anything is locked
    try:
        jobs.start(job_id, intake.count, intake.est_tokens, key_id=key_id, max_tokens=cfg.max_enqueued_tokens)
    except OverLimit as exc:
        check_tokens(cfg, exc.before, intake.est_tokens)
        raise AssertionError("unreachable: over the limit") from None


class SeedJob:
    """A `/v1/batch-predictions` job read from its body: a JSON list, or JSONL streamed line by line."""

    def __init__(self, jobs: JobStore, cfg: JobsConfig, estimate_new: int, key_id: str | None,
                 meta: dict[str, str] | None = None) -> None:
        self.jobs, self.cfg, self.key_id = jobs, cfg, key_id
        self.meta = meta
        self.estimate_new = estimate_new
        self.job_id = ""
        self.intake: Intake | None = None

    def _begin(self) -> None:
        self.job_id = new_job(self.jobs, self.cfg, key_id=self.key_id, shape="seed", endpoint=SEED_ENDPOINT,
                              window_s=WINDOW_S[SEED_WINDOW], window=SEED_WINDOW, input_file_id=None,
                              meta=self.meta)
        self.intake = Intake(self.jobs, self.job_id, self.cfg.max_items_per_job, self.estimate_new)

    def _finish(self) -> None:
        assert self.intake is not None
        self.intake.flush()
        start(self.jobs, self.cfg, self.job_id, self.key_id, self.intake)

    async def _guarded(self, fn: Callable[[], None]) -> None:
        try:
            await asyncio.to_thread(fn)
        except TooManyItems as exc:
            await asyncio.to_thread(self.jobs.discard, self.job_id)
            raise too_many_items(exc.limit) from None
        except BaseException:  # a refusal by a limit, or anything unforeseen: no job left `validating`
            if self.job_id:
                await asyncio.shield(asyncio.to_thread(self.jobs.discard, self.job_id))
            raise

    async def from_list(self, items: list[Any]) -> str:
        await self._guarded(self._begin)
        intake = self.intake
        assert intake is not None

        def add() -> None:
            for i, obj in enumerate(items, 1):
                intake.seed_item(i, obj)
            self._finish()

        await self._guarded(add)
        return self.job_id

    async def from_jsonl(self, stream: AsyncIterator[bytes]) -> str:
        await self._guarded(self._begin)
        intake = self.intake
        assert intake is not None
        split = LineSplitter()
        page: list[bytes | None] = []
        first = 1  # the line number of page[0]

        def add(lines: list[bytes | None], start: int, last: bool = False) -> None:
            for n, raw in enumerate(lines, start):
                intake.seed_line(n, raw)
            if last:
                self._finish()

        try:
            async for chunk in stream:
                page += split.feed(chunk)
                if len(page) >= PAGE:
                    batch, start = page, first
                    page, first = [], first + len(batch)
                    await self._guarded(functools.partial(add, batch, start))
        except BaseException:
            if self.job_id:
                await asyncio.shield(asyncio.to_thread(self.jobs.discard, self.job_id))
            raise
        page += split.end()
        await self._guarded(functools.partial(add, page, first, last=True))
        return self.job_id


def parse_list(raw: bytes) -> list[Any]:
    data = parse_json(raw, LINE_DEPTH)  # the list around each request: a request nests as deep as a body
    if not isinstance(data, list):
        raise Rejected("invalid_request", "the body must be a JSON list of prediction requests (or JSONL, one a "
                       "line, as application/jsonl)", code="wrong_type")
    return data
