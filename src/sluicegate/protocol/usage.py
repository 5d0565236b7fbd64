"""`GET /v1/usage`: what API keys used, by UTC day."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel


class UsageDay(ResponseModel):
    key_id: str | None = Field(description="the API key; null for requests served while auth was off")
    day: dt.date = Field(description="the UTC day the requests ended")
    requests: int = Field(description="requests on the generation routes")
    failed_requests: int = Field(description="of those, the ones answered with status 400 or above (499: the "
                                             "client left)")
    prompt_tokens: int
    cached_tokens: int = Field(description="prompt tokens whose KV was reused from the prefix cache")
    generated_tokens: int
    total_tokens: int = Field(description="prompt_tokens + generated_tokens")


class UsageList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[UsageDay] = Field(description="by day, then key")
    unwritten_requests: int = Field(0, description="requests this server has finished and not yet written to the "
                                    "store, so not in `data`: 0 unless the store is not taking writes")
