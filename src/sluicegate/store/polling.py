"""How long a store poller (the batch worker, the webhook dispatcher) waits before it looks again.

Both look for work they were not woken for: items another replica queued, leases a dead process left, retries
coming due. A look costs a few ORM queries in a worker thread; at a fixed half second to a second, an idle
server spent about 15% of a core on them (docs/benchmarks.md, "An idle server's CPU"), CPU that llama.cpp's
compute threads, which wait on each other at every barrier, feel at once. So an idle poller backs off: the
wait is `poll_s` after a look that found work, and doubles after each look that found none, up to
`IDLE_FACTOR` times `poll_s`. Work made in this process still wakes its poller at once, and a webhook retry this
process scheduled is looked for when it comes due; what changes is how soon a replica notices work another
replica left it without a word: within `IDLE_FACTOR * poll_s` (4 s for batch items, 8 s for webhook deliveries
by default) instead of `poll_s`. On Postgres every replica announces the work it queues (store/notify.py), so
what is left to the poll there is the leases of a process that died; on SQLite (one process) the poll is all.
"""

from __future__ import annotations

IDLE_FACTOR = 8


class IdlePoll:
    """The wait before the next look, from whether the last one found work."""

    __slots__ = ("_idle", "base_s", "max_s")

    def __init__(self, base_s: float, factor: int = IDLE_FACTOR) -> None:
        self.base_s = base_s
        self.max_s = base_s * max(1, factor)
        self._idle = 0  # looks in a row that found nothing

    def after(self, found: bool) -> float:
        """`poll_s` after a look that found work; after the n-th idle look in a row, `poll_s * 2**(n-1)`, capped."""
        self._idle = 0 if found else self._idle + 1
        return min(self.max_s, self.base_s * float(2 ** max(0, self._idle - 1)))
