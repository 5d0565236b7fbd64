"""Every error `type`, with its HTTP status on the native routes (the dialects map it: api/openai_errors.py,
api/anthropic_errors.py), what it means and what the caller should do. Order: as docs/errors.md lists them."""

from __future__ import annotations

from sluicegate.errorcatalog.entry import ErrorEntry, rows

# `type status: meaning`, then `-> action` (errorcatalog/entry.py, `rows`)
ENTRIES: tuple[ErrorEntry, ...] = tuple(ErrorEntry(type_, None, int(status), meaning, action)
                                        for (type_, status), meaning, action in rows("""
invalid_json 400: the body is not acceptable JSON
  -> fix the encoder; do not retry as is
untrusted_host 400: the Host header names a host this server does not serve (DNS rebinding protection)
  -> address the server by a name it serves, or have the operator add it to --allowed-hosts
cors_refused 400: a browser's CORS preflight asks for what the server does not allow
  -> call from an origin the operator allows (--cors-origin)
malformed_http 400: the request is not valid HTTP/1.1; the connection is closed
  -> fix the client; do not retry as is
request_timeout 408: the request's headers or body came too slowly; the connection is closed
  -> retry, sending the whole request promptly
headers_too_large 431: the request line and headers are too large, or too many
  -> send fewer or smaller headers, or a shorter URL
unsupported_transfer_encoding 501: Transfer-Encoding names a coding other than chunked
  -> send the body as it is, with Content-Length or chunked
unsupported_media_type 415: the body is not sent as Content-Type: application/json (UTF-8)
  -> set the Content-Type header
body_too_large 413: the body is over the size limit
  -> send less; never retry as is
authentication_required 401: the server holds API keys and the request carries none
  -> send Authorization: Bearer KEY or x-api-key: KEY
invalid_api_key 401: the API key is unknown, revoked or expired
  -> use a valid key; retrying the same key never helps
permission_denied 403: the API key lacks the scope the route needs, or the request is not allowed to do this
  -> use a key with the scope the message names; the code says which rule refused it
invalid_request 422: well-formed JSON, but a field is not acceptable
  -> change the field named in param as the message says
prompt_too_long 422: the prompt is more tokens than the prompt-token limit
  -> shorten the prompt
context_length_exceeded 422: prompt tokens plus the new tokens asked for do not fit the context window
  -> ask for fewer new tokens, or send a shorter prompt
not_found 404: no such route, or no such object for this API key
  -> fix the URL or the id
model_not_found 404: this server does not serve the model named
  -> use a name (or name@version) from /v1/models
method_not_allowed 405: the route does not take this method
  -> use a method the Allow header names
idempotency_key_in_use 409: a request with the same Idempotency-Key is still running
  -> retry after Retry-After: you get its answer
deadline_too_short 422: the request cannot meet its deadline even on an idle server
  -> ask for fewer new tokens, send a shorter prompt or allow more time; never retry as is
idempotency_key_reused 422: the Idempotency-Key was used for a different request
  -> send a new key with a new request; never retry as is
rate_limit_exceeded 429: the API key is over one of its rate limits
  -> retry after retry-after-ms (or Retry-After)
budget_exceeded 429: the API key's monthly token budget cannot hold this request
  -> wait for the next month, or have the operator raise the budget; do not retry
request_exceeds_capacity 413: the request costs more tokens than the key's capacity: no wait makes it fit
  -> ask for fewer new tokens or send a shorter prompt; never retry as is
overloaded 503: not now: the server cannot take this request at its present load
  -> retry after Retry-After
rate_limiter_unavailable 503: the shared rate limiter did not answer, and the server fails closed
  -> retry after Retry-After
not_ready 503: the model is not ready to serve
  -> retry after Retry-After
store_unavailable 503: the database of keys, idempotency keys or usage cannot be read
  -> retry after Retry-After; if it lasts, the operator must fix the database
shutting_down 503: the server is draining for a restart
  -> retry on another replica, or after Retry-After
deadline_exceeded 504: the request's deadline passed before its answer was complete
  -> retry with a longer timeout, or later
upstream_error 502: the upstream engine that serves the model broke its side
  -> retry later; if it lasts, the operator must fix the upstream
upstream_unavailable 503: the upstream engine could not be reached, or refused for now
  -> retry after Retry-After
upstream_timeout 504: the upstream engine sent no first token in time
  -> retry later, or with a longer budget
internal_error 500: a bug: the detail is in the server log under the request id, never in the body
  -> report the request_id
"""))
