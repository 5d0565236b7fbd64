"""`/v1/admin/keys`: API keys over HTTP, with the `admin` scope. The fields are `sluicegate keys create`'s flags."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel, StrictModel

ScopeName = Literal["generate", "batch", "admin", "metrics"]
MAX = 1 << 40


class KeyLimits(StrictModel):
    tpm: int | None = Field(None, ge=1, le=MAX, description="sustained tokens per minute; null: the server's default")
    burst: int | None = Field(None, ge=1, le=MAX, description="token bucket capacity; null: the server's default")
    rpm: int | None = Field(None, ge=1, le=MAX, description="requests per minute, beside the tokens; null: the "
                            "server's default (none unless --default-rpm)")
    max_concurrent: int | None = Field(None, ge=1, le=MAX, description="requests in flight at once; null: the server's "
                                       "default (none unless --default-max-concurrent)")
    monthly_tokens: int | None = Field(None, ge=1, le=MAX, description="tokens (prompt + generated) per calendar "
                                       "month, UTC; null: no budget")
    expires_at: str | None = Field(None, max_length=40, description="RFC 3339 with a time zone "
                                   "(2027-01-31T00:00:00Z); after it the key stops working; null: never",
                                   json_schema_extra={"format": "date-time"})


RULES = ("Rules this schema cannot state: `name` holds no control character, line or paragraph separator or "
         "bidirectional formatting character (`invalid_name`: regular expression dialects disagree on such a class "
         "at a line's end); `expires_at` must be in the future (`expires_in_past`, param "
         "`expires_at`) and at most 9999-12-31T23:59:59Z once in UTC (`invalid_value`); a key may not create or "
         "change a key to hold a scope it does not hold itself (403 `scope_not_held`, param `scopes`) or, when it "
         "expires, to expire later than it does or never (403 `expiry_not_held`, param `expires_at`)")


class KeyCreate(KeyLimits):
    model_config = KeyLimits.model_config | {"json_schema_extra": {"description": RULES + "."}}

    name: str = Field(min_length=1, max_length=200, description="what the key is for; no control characters")
    scopes: list[ScopeName] = Field(["generate"], min_length=1, max_length=4,
                                    description="what the key may do (docs/keys.md); scopes do not imply each other")


class KeyUpdate(KeyLimits):
    """Only the fields sent change; a limit or `expires_at` sent as null goes back to the default (never)."""

    model_config = KeyLimits.model_config | {"json_schema_extra": {"description": (
        "Only the fields sent change; a limit or `expires_at` sent as null goes back to the default (never). "
        + RULES + "; a revoked or expired key cannot change (`key_revoked`, `key_expired`).")}}

    # may be left out (only the fields sent change), never null
    name: str = Field(default_factory=str, min_length=1, max_length=200)
    scopes: list[ScopeName] = Field(default_factory=list, min_length=1, max_length=4)


class KeyOut(ResponseModel):
    id: str
    object: Literal["api_key"] = "api_key"
    name: str
    prefix: str = Field(description="how `keys list` shows it: the key's first characters, never the secret")
    scopes: list[str]
    state: Literal["active", "revoked", "expired"]
    tpm: int | None
    burst: int | None
    rpm: int | None
    max_concurrent: int | None
    monthly_tokens: int | None
    created_at: str = Field(description="RFC 3339, UTC")
    expires_at: str | None
    revoked_at: str | None
    secret: str | None = Field(None, description="`sg_live_...`: in the answer that created the key, and only there")


class KeyList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[KeyOut]


__all__ = ["KeyCreate", "KeyList", "KeyOut", "KeyUpdate"]
