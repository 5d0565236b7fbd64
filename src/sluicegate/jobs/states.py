"""One state machine for every batch job; each API shape maps it to its own statuses (docs/jobs.md).

    validating -> in_progress -> finalizing -> completed
         |             |  \\
         v             |   -> cancelling -> (finalizing) -> cancelled
       failed          +-> expired (the completion window passed)

Items: held (while the job validates) -> pending -> leased (owner, expiry) -> done | failed; a cancelled
job's pending items become `cancelled`, an expired job's `expired`. A lease that expires makes its item
pending again for any worker.
"""

from __future__ import annotations

from typing import Final

# job states (OpenAI's own names: the OpenAI shape shows them as they are)
VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED, FAILED, EXPIRED, CANCELLING, CANCELLED = (
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
ACTIVE: Final = frozenset({VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING})
FINAL: Final = frozenset({COMPLETED, FAILED, EXPIRED, CANCELLED})

# item states; HELD: written while its job is validating, not leasable until the job starts
HELD, PENDING, LEASED, DONE, ITEM_FAILED, ITEM_CANCELLED, ITEM_EXPIRED = (
    "held", "pending", "leased", "done", "failed", "cancelled", "expired")
OPEN_ITEMS: Final = (HELD, PENDING, LEASED)


def seed_status(state: str, done: int, failed: int, total: int) -> str:
    """The seed shape's five: queued (nothing finished yet), running, succeeded, failed, cancelled.

    A job whose every item failed (and that had any) is `failed`; one with some good items `succeeded` (its
    failures are in the results). An expired job is `failed`: its window passed before it could finish.
    """
    if state in (CANCELLED, CANCELLING):
        return "cancelled"
    if state in (FAILED, EXPIRED):
        return "failed"
    if state == COMPLETED:
        return "failed" if total and failed == total else "succeeded"
    return "running" if done + failed > 0 else "queued"


# webhook event for each final state (OpenAI's names, for both shapes)
EVENTS: Final = {COMPLETED: "batch.completed", FAILED: "batch.failed", CANCELLED: "batch.cancelled",
                 EXPIRED: "batch.expired"}
