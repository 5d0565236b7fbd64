"""The one error the serving layer raises; the API layer renders it as the envelope.

`type` and `code` values are stable, listed with their status and the client's action in the error catalog
(src/sluicegate/errorcatalog/, published as docs/errors.md); `message` may change.
Messages give the parameter and the numbers, never the client's input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.errorcatalog import STATUS  # type -> HTTP status on the native routes


@dataclass(slots=True)
class ApiError(Exception):
    type: str
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in STATUS:
            raise ValueError(f"unknown error type {self.type!r}")

    @property
    def status(self) -> int:
        return STATUS[self.type]

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


__all__ = ["STATUS", "ApiError"]
