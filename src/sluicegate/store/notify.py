"""Work announced across replicas at once: Postgres LISTEN/NOTIFY.

A replica that queues work another could do (a batch job's items become pending, leases handed back at
shutdown, a webhook delivery queued or a retry scheduled) announces it inside the same transaction
(`announce`): Postgres delivers the notification at commit, to every connection listening on the channel,
never for a transaction that rolled back. Each replica holds one listening connection (`Listener`) and wakes
its batch worker or webhook dispatcher when told, so an idle replica starts another's work within a round trip
instead of at its next poll (up to 4 s for items, 8 s for deliveries at the idle back-off, store/polling.py).
A retry's notification carries its due time (Unix seconds), and the dispatcher looks when it comes due.

The polls stay: they find what no notification announces (leases of a process that died), and they are all
SQLite has (one process per file). A listener whose connection drops reconnects with back-off and then wakes
everyone once, since it may have missed something meanwhile; its wait is bounded (a keep-alive query every
`HEARTBEAT_S`), so a connection that died silently is noticed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sluicegate.tasks import cancel

log = logging.getLogger("sluicegate.store")

JOBS = "sluicegate_jobs"  # items became leasable
WEBHOOKS = "sluicegate_webhooks"  # deliveries due (payload: Unix seconds when due; empty: now)
HEARTBEAT_S = 30.0
BACKOFF_S = (0.5, 30.0)


def announce(session: Session, channel: str, payload: str = "") -> None:
    """Notify every listening replica when the session's transaction commits (Postgres); nothing on SQLite."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": channel, "payload": payload})


class Listener:
    """One connection listening on `handlers`' channels; each notification calls its channel's handler with the
    payload (on the event loop that started it)."""

    def __init__(self, url: URL, handlers: Mapping[str, Callable[[str], None]]) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._handlers = dict(handlers)
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()  # set while LISTEN is in force (tests wait on it)
        self.waits: list[float] = []  # the back-offs slept so far (the last few; tests read them)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _run(self) -> None:
        backoff = BACKOFF_S[0]
        missed = False
        while True:
            try:
                await self._listen(missed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away: listen again when it is back
                if self.listening.is_set():  # it had been listening: a new outage starts the back-off afresh
                    backoff = BACKOFF_S[0]
                self.listening.clear()
                log.warning("listening for other replicas' work failed (%s); polling meanwhile, retrying in "
                            "%.1f s", type(exc).__name__, backoff)
                missed = True
                self.waits = [*self.waits[-63:], backoff]
                await self._sleep(backoff)
                backoff = min(BACKOFF_S[1], backoff * 2)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _listen(self, missed: bool) -> None:
        import psycopg
        from psycopg import sql

        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True,
                                                         connect_timeout=10) as conn:
            for channel in self._handlers:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self.listening.set()
            if missed:
                self._dispatch_all()
            while True:
                async for note in conn.notifies(timeout=HEARTBEAT_S):
                    self._dispatch(note.channel, note.payload)
                await conn.execute("SELECT 1")  # a connection that died without a word fails here

    def _dispatch(self, channel: str, payload: str) -> None:
        handler = self._handlers.get(channel)
        if handler is None:
            return
        try:
            handler(payload)
        except Exception:
            log.exception("a %s notification could not be handled", channel)

    def _dispatch_all(self) -> None:
        for channel in self._handlers:
            self._dispatch(channel, "")


__all__ = ["JOBS", "WEBHOOKS", "Listener", "announce"]
