"""Every `code` the server sends under each error `type` (a code equal to its type, or none, is the type's own
entry). tests/unit/test_error_catalog.py scans the source for the codes it can emit and fails on one not here."""

from __future__ import annotations

from sluicegate.errorcatalog.entry import ErrorEntry, rows
from sluicegate.errorcatalog.types import ENTRIES as TYPES

_STATUS = {e.type: e.status for e in TYPES}


def _codes(table: str) -> tuple[ErrorEntry, ...]:
    """`type code: meaning`, then `-> action` (errorcatalog/entry.py, `rows`)."""
    return tuple(ErrorEntry(type_, code, _STATUS[type_], meaning, action)
                 for (type_, code), meaning, action in rows(table))


INVALID_JSON = _codes("""
invalid_json duplicate_key: an object has the same key twice
  -> send each key once
invalid_json empty_body: the body is empty
  -> send a JSON object
invalid_json invalid_encoding: the body is not UTF-8, or starts with a byte order mark
  -> send UTF-8 without a BOM
invalid_json invalid_number: NaN or Infinity, which are not JSON numbers
  -> send finite numbers
invalid_json invalid_unicode: a lone UTF-16 surrogate escape, which is not Unicode text
  -> send valid Unicode text
invalid_json number_out_of_range: a number beyond a double, or an integer over 64 digits
  -> send a number in range
invalid_json syntax_error: not JSON (a raw control character in a string included)
  -> fix the encoder
invalid_json too_deep: arrays and objects nest deeper than 64 levels
  -> send a flatter body
""")

CONNECTION = _codes("""
cors_refused cors: the preflight's origin, method or private-network access is not allowed
  -> call from an origin the operator allows (--cors-origin)
request_timeout header_timeout: the headers did not all arrive within --header-timeout
  -> retry, sending the headers promptly
request_timeout body_timeout: the body fell silent for --body-timeout
  -> retry, sending the body promptly
headers_too_large header_bytes: the request line and headers are over --max-header-bytes
  -> send smaller headers or a shorter URL
headers_too_large header_count: more header fields than --max-headers
  -> send fewer headers
unsupported_transfer_encoding transfer_coding: a transfer coding other than chunked (gzip, ...)
  -> send the body as it is, with Content-Length or chunked
unsupported_media_type wrong_content_type: the Content-Type is not the one the route takes
  -> send application/json (multipart/form-data for an upload)
unsupported_media_type wrong_charset: the Content-Type declares a charset other than UTF-8
  -> send UTF-8, and say so or say nothing
body_too_large file_too_large: the uploaded file is over --batch-max-file-bytes
  -> upload a smaller file (split the batch)
body_too_large storage_quota_exceeded: the key's stored files would pass --batch-max-stored-bytes
  -> delete files this key no longer needs
method_not_allowed wrong_method: the route does not take this method
  -> use a method the Allow header names
""")

KEYS = _codes("""
authentication_required missing_api_key: the request carries no API key
  -> send Authorization: Bearer KEY or x-api-key: KEY
invalid_api_key malformed_api_key: not a sluicegate key, or its checksum fails
  -> copy the key again: it was cut or mistyped
invalid_api_key unsupported_scheme: Authorization uses a scheme other than Bearer
  -> send Authorization: Bearer KEY
invalid_api_key conflicting_api_keys: the request carries two different API keys
  -> send one key
permission_denied missing_scope: the API key lacks the scope this route needs
  -> use a key with the scope the message names
permission_denied scope_not_held: a key may not create or change a key to hold a scope it does not hold itself
  -> ask for the scopes this key holds, or use a wider admin key
permission_denied expiry_not_held: a key that expires may not create or change a key to expire later (or never)
  -> send expires_at at or before the calling key's own
permission_denied cross_site: a write from a web page of another origin (Origin or Sec-Fetch-Site says so)
  -> call from the server's own origin, or from one the operator allows (--cors-origin)
""")

NOT_FOUND = _codes("""
not_found unknown_route: no such route
  -> fix the URL
not_found prediction_not_found: no such prediction for this API key
  -> fix the id
not_found response_not_found: no stored response with this id for this API key
  -> fix the id
not_found endpoint_not_found: no such webhook endpoint for this API key
  -> fix the id
not_found key_not_found: no such API key
  -> fix the key id
not_found asset_not_found: no such playground asset
  -> fix the URL
model_not_found model_version_not_found: the model is served, but not in the version named
  -> use a version the message lists
""")

BUDGETS = _codes("""
prompt_too_long prompt_tokens_exceeded: the prompt is more tokens than the prompt-token limit
  -> shorten the prompt
context_length_exceeded context_window_exceeded: prompt tokens plus the new-token limit exceed the context window
  -> ask for at most the new tokens the message says fit, or shorten the prompt
deadline_too_short answer: its new tokens take longer than its budget at the best measured speed
  -> ask for fewer new tokens, or allow more time
deadline_too_short first_token: a stream's first token cannot come within the client's read timeout
  -> send a shorter prompt, or raise the read timeout
""")

LIMITS = _codes("""
rate_limit_exceeded tokens: the request's cost is more than the key's token bucket holds now
  -> retry after retry-after-ms, or ask for fewer new tokens to fit sooner
rate_limit_exceeded requests: the key is over its requests per minute
  -> retry after retry-after-ms
rate_limit_exceeded concurrent_requests: the key has as many requests in flight as it may
  -> retry after Retry-After, once one has ended
rate_limit_exceeded concurrent_jobs_limit: the key has as many unfinished batch jobs as it may
  -> wait for a job to finish, or cancel one
rate_limit_exceeded enqueued_tokens_limit: the key's unfinished batch jobs hold as many tokens as it may
  -> wait for jobs to finish, or send a smaller batch
budget_exceeded monthly_tokens: the key's monthly_tokens budget cannot hold this request's cost
  -> wait for the month to turn (Retry-After), or have the operator raise the budget
request_exceeds_capacity tokens: the request's cost is above the key's token capacity (--burst)
  -> ask for fewer new tokens or send a shorter prompt
""")

NOT_NOW = _codes("""
overloaded queue_full: the engine's waiting queue is full
  -> retry after Retry-After
overloaded wait_exceeds_deadline: at the present load the request would miss its deadline
  -> retry after Retry-After, or allow more time
overloaded too_many_connections: the server holds --max-connections open connections
  -> retry after Retry-After on a new connection
not_ready loading: the model is still loading
  -> retry after Retry-After
not_ready load_failed: the model failed to load
  -> the operator must fix the model; retry later
not_ready upstream_starting: an upstream engine is being checked again (on /readyz)
  -> retry after Retry-After
shutting_down draining: the server is draining and takes no new request
  -> retry on another replica, or after Retry-After
upstream_unavailable circuit_open: the upstream's circuit breaker refuses at once after its failures
  -> retry after Retry-After
internal_error item_failed: a batch item failed its worker too many times, or names no endpoint it runs
  -> report the item's request_id
""")

ENTRIES: tuple[ErrorEntry, ...] = (*INVALID_JSON, *CONNECTION, *KEYS, *NOT_FOUND, *BUDGETS, *LIMITS, *NOT_NOW)
