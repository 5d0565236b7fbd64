"""Admission: what a request passes, once its cost is known, before the engine sees it.

Two parts, both made outside the serving layer and handed to it explicitly, by the caller that starts the work
(the work lifecycle, api/work.py), as one `Admission`:

- the `reservation` (a `Reservation`: the key's rate limit and monthly budget, api/middleware/ratelimit.py
  `KeyAdmission`): `reserve(cost)` with the serving core's one cost estimate, `cancel()` when the request
  will not run after all; its maker settles it with the request's usage (`RequestContext.used()`, the same
  figure the usage ledger records) when the response has ended;
- the `gate` (a `Gate`: an Idempotency-Key's claim, api/idempotency.py `Held.claim`): passed, or raises why
  the work does not run (a replay, a key in use or reused).

`Admission.admit` runs both (serving/core.py `start_runs` calls it with the runs' cost): when the reservation
is a round trip (Redis) the two run at once, since the claim is one too (the database). The gate's refusal
wins: a replayed or in-use key is answered as such even when the reservation was refused, and a reservation
made for a request that then does not run is given back at once. `OPEN` admits everything (batch items: their
tokens are not charged to the key's interactive bucket).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from sluicegate.serving.context import RequestContext


class Reservation(Protocol):
    """A reservation made once a request's cost is known; `reserve` raises ApiError to refuse. Whoever makes
    it settles it when the response has ended."""

    remote: bool  # a reservation is a round trip (Redis): `Admission.admit` overlaps it with the gate's

    async def reserve(self, cost: int, param: str | None = None) -> None: ...

    async def cancel(self) -> None:
        """Give back what `reserve` took, now: the request will not run."""


Gate = Callable[[], Awaitable[None]]  # passed before the engine sees work, or raises why it does not run


@dataclass(frozen=True, slots=True)
class Admission:
    """The reservation and the gate of one request (either may be absent), passed to the serving core (not
    engine/admission.py's `DeadlineAdmission`: the engine's own judgement of a deadline against the load)."""

    reservation: Reservation | None = None
    gate: Gate | None = None

    async def admit(self, ctx: RequestContext, cost: int, new_param: str | None) -> None:
        """Reserve `cost` (a refusal names `new_param`) and pass the gate (module doc)."""
        admission, gate = self.reservation, self.gate

        async def reserve() -> None:
            assert admission is not None
            t = time.perf_counter()
            try:
                await admission.reserve(cost, new_param)
            finally:
                ctx.record.stage("ratelimit", t)

        if gate is None or admission is None:
            if gate is not None:
                await gate()
            if admission is not None:
                await reserve()
            return
        if not admission.remote:  # nothing to overlap: the reservation takes microseconds in this process
            await gate()
            await reserve()
            return
        reserving = asyncio.ensure_future(reserve())
        try:
            await gate()
        except BaseException:
            with contextlib.suppress(Exception):
                await reserving  # to its end, so its decision is known, never left half made
                await admission.cancel()  # the request will not run: its response shows the bucket without it
            raise
        await reserving


OPEN = Admission()  # nothing reserved, no gate

__all__ = ["OPEN", "Admission", "Gate", "Reservation"]
