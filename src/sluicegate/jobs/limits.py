"""The per-key limits on batch work (JobsConfig), each refused with its number."""

from __future__ import annotations

from sluicegate.config import JobsConfig
from sluicegate.refusal import Rejected


def too_many_items(limit: int) -> Rejected:
    return Rejected("invalid_request", f"a job may hold at most {limit} requests", code="too_many_items")


def check_concurrency(cfg: JobsConfig, active_jobs: int) -> None:
    if active_jobs >= cfg.max_concurrent_jobs:
        raise Rejected("rate_limit_exceeded", f"this API key has {active_jobs} unfinished jobs; the limit is "
                       f"{cfg.max_concurrent_jobs}: wait for one to finish, or cancel one",
                       code="concurrent_jobs_limit", retry_after=60)


def check_tokens(cfg: JobsConfig, enqueued: int, new: int) -> None:
    if enqueued + new > cfg.max_enqueued_tokens:
        raise Rejected("rate_limit_exceeded", f"this job's estimated {new} tokens plus the {enqueued} already "
                       f"enqueued for this API key pass the limit of {cfg.max_enqueued_tokens}",
                       code="enqueued_tokens_limit", retry_after=60)
