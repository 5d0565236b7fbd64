"""Who may call and what they used: API keys (format, storage, the cached lookup) and the usage ledger.

Below `api/`, above `store/`; nothing here knows HTTP. Rate limits and idempotency join this package.
"""

from sluicegate.tenancy.key_cache import KeyCache
from sluicegate.tenancy.keys import ALL_SCOPES, KeyRecord, Scope, create_key, list_keys, revoke_key
from sluicegate.tenancy.usage import DayTotals, UsageLedger

__all__ = ["ALL_SCOPES", "DayTotals", "KeyCache", "KeyRecord", "Scope", "UsageLedger", "create_key", "list_keys",
           "revoke_key"]
