"""The batch system of one process: the job and file stores, and the worker once the model has loaded.

The worker runs each item through its route's handler (api/batch_items.py builds them, from the surfaces'
adapters); the app hands them in when it starts the worker, so nothing here imports the HTTP layer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from sluicegate.config import JobsConfig
from sluicegate.jobs.files import FileStore
from sluicegate.jobs.output import render_files
from sluicegate.jobs.states import EVENTS
from sluicegate.jobs.store import JobStore
from sluicegate.jobs.worker import Handler, ItemResult, Worker
from sluicegate.registry import jobs_route
from sluicegate.store.db import Store
from sluicegate.store.models import BatchJob
from sluicegate.tenancy.usage import UsageLedger
from sluicegate.webhooks import Webhooks

log = logging.getLogger("sluicegate.jobs")
PRUNE_EVERY_S = 600.0

class JobsRuntime:
    def __init__(self, config: JobsConfig, store: Store, ledger: UsageLedger, webhooks: Webhooks) -> None:
        self.config = config
        self.jobs = JobStore(store)
        self.files = FileStore(store)
        self.ledger = ledger
        self.worker: Worker | None = None
        self.webhooks = webhooks
        self._prune: asyncio.Task[None] | None = None

    def start(self, handlers: Mapping[str, Handler], engine_slots: int) -> None:
        """Start this process's worker (on the serving loop, once every served model, local or upstream, can
        serve); `handlers`: each route's item handler, by its path (api/batch_items.py)."""
        c = self.config
        slots = c.worker_slots if c.worker_slots is not None else max(1, engine_slots // 4)
        output_ttl = c.output_ttl_hours * 3600

        def finalize(job: BatchJob) -> tuple[str | None, str | None]:
            return render_files(self.jobs, self.files, job, output_ttl)

        self.worker = Worker(self.jobs, handlers, slots=slots, lease_s=c.lease_s, poll_s=c.poll_s,
                             finalizer=finalize, on_usage=self._usage, on_final=self.announce,
                             validating_timeout_s=c.validating_timeout_s, discard=self.files.delete)
        self.worker.start()
        self._prune = asyncio.create_task(self._prune_loop())

    async def stop(self) -> None:
        """Hand this process's leases back (SIGTERM, shutdown): before the engine stops."""
        if self._prune is not None:
            self._prune.cancel()
            self._prune = None
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None

    def wake(self) -> None:
        if self.worker is not None:
            self.worker.wake()

    def cancelled(self, job_id: str) -> None:
        if self.worker is not None:
            self.worker.cancel_job(job_id)

    def _usage(self, key_id: str | None, endpoint: str, outcome: ItemResult, request_id: str) -> None:
        u = outcome.usage  # under the route that made the job (the route registry's `jobs`)
        self.ledger.record(key_id, jobs_route(endpoint), u.prompt_tokens, u.cached_tokens, u.generated_tokens,
                           outcome.status_code, request_id=request_id)

    def announce(self, job: BatchJob, final: str) -> None:
        """The job's end as a webhook event (OpenAI's name, for both shapes), queued in the store; the event id
        is stable per job and state, so announcing twice (a finalizer that crashed) queues it once."""
        event = EVENTS[final]
        data = {"id": job.id, "object": "batch" if job.shape == "openai" else "batch_prediction", "status": final}
        try:
            self.webhooks.enqueue(job.key_id, event, data, subject=job.id, event_id=f"evt_{job.id}_{final}")
        except Exception:
            log.exception("batch %s: queueing the %s event failed", job.id, event)

    async def _prune_loop(self) -> None:
        while True:
            try:
                n = await asyncio.to_thread(self.files.prune)
                if n:
                    log.info("deleted %d expired batch files", n)
            except Exception:
                log.exception("pruning expired batch files failed")
            await asyncio.sleep(PRUNE_EVERY_S)
