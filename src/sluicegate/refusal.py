"""A refusal any layer can raise: the error's kind and what the client is told, with no HTTP in it.

`type` and `code` are the error catalog's (src/sluicegate/errorcatalog/, published as docs/errors.md): stable,
each with its status and the client's action there. `message` may change; it gives the parameter and the
numbers, never the client's input. `param` names the request field at fault; `retry_after` is a hint in whole
seconds (a retry after it can succeed), not a header.

Tenancy, jobs and the upstream client raise `Rejected`; the serving layer raises its `ApiError`
(serving/errors.py), a `Rejected` that also carries response headers. api/envelope.py maps either to a status,
headers and the envelope, so catching `Rejected` catches both.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.errorcatalog import TYPES


@dataclass(slots=True)
class Rejected(Exception):
    """The error a request is answered with, raised by any layer (module doc); a raw-JSON field check's finding
    is a `protocol.openai_common.FieldRefusal` until the route raises it as one of these."""

    type: str
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None  # seconds

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"unknown error type {self.type!r}")

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


__all__ = ["Rejected"]
