"""The one error the serving layer raises; the API layer renders it as the envelope.

`ApiError` is a `Rejected` (sluicegate/refusal.py: the type, code, message, parameter and retry hint that
every layer can raise) that may also carry response headers of the HTTP layer's own (`WWW-Authenticate`,
`Connection: close`, the rate-limit headers). `type` and `code` values are stable, listed with their status
and the client's action in the error catalog (src/sluicegate/errorcatalog/, published as docs/errors.md);
`message` may change. Messages give the parameter and the numbers, never the client's input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sluicegate.errorcatalog import STATUS  # type -> HTTP status on the native routes
from sluicegate.refusal import Rejected


@dataclass(slots=True)
class ApiError(Rejected):
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def status(self) -> int:
        return STATUS[self.type]

    @classmethod
    def of(cls, refused: Rejected, headers: Mapping[str, str] | None = None) -> ApiError:
        """A refusal from a layer with no HTTP in it as the serving layer's error, with these headers added."""
        if isinstance(refused, ApiError) and not headers:
            return refused
        own = refused.headers if isinstance(refused, ApiError) else {}
        return cls(refused.type, refused.message, refused.param, refused.code, refused.retry_after,
                   {**own, **(headers or {})})


__all__ = ["STATUS", "ApiError"]
