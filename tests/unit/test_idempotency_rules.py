"""Which answers an Idempotency-Key keeps (api/idempotency.py): everything the work answered, except what tells
the client to retry (429, 503, 504), a stream's error event included."""

from __future__ import annotations

import pytest

from sluicegate.api.detached import Finished
from sluicegate.api.idempotency import _storable
from sluicegate.serving.errors import ApiError


@pytest.mark.parametrize(("status", "error", "kept"), [
    (200, None, True),
    (500, "internal_error", True),  # as Stripe does: the first answer is the answer
    (503, "shutting_down", False),
    (504, "deadline_exceeded", False),
    (429, "rate_limit_exceeded", False),
    (200, "shutting_down", False),  # a stream whose error event says: retry
    (200, "internal_error", True),  # a stream that failed for good
])
def test_what_is_kept(status: int, error: str | None, kept: bool) -> None:
    err = ApiError(error, "x") if error else None
    assert _storable(Finished(status, {}, b"", err)) is kept
