"""Who may call and what they used: API keys (format, storage, the cached lookup), the usage ledger, the
monthly token budget (budget.py), rate limits (ratelimit/: token buckets in-process or on Redis) and idempotency
keys (idempotency.py, with the claims on SQLite and Postgres in sqlite_claims.py and pg_claims.py).

Below `api/`, above `store/`; it never imports `api/` or `serving/`. A refusal is a `sluicegate.refusal.Rejected`
(no HTTP in it); the rate limiter's headers are rendered in ratelimit/headers.py, and api/ sends them.
"""

from sluicegate.tenancy.key_cache import KeyCache
from sluicegate.tenancy.keys import ALL_SCOPES, KeyRecord, Scope, create_key, list_keys, revoke_key
from sluicegate.tenancy.usage import DayTotals, UsageLedger

__all__ = ["ALL_SCOPES", "DayTotals", "KeyCache", "KeyRecord", "Scope", "UsageLedger", "create_key", "list_keys",
           "revoke_key"]
