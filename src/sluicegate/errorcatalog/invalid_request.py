"""The codes of `invalid_request` (422 on the native routes, 400 `invalid_request_error` on OpenAI's and
Anthropic's): what was wrong with the request, most of them naming the field in `param`."""

from __future__ import annotations

from sluicegate.errorcatalog.entry import ErrorEntry, rows
from sluicegate.errorcatalog.types import ENTRIES as TYPES

_STATUS = next(e.status for e in TYPES if e.type == "invalid_request")


def _codes(table: str) -> tuple[ErrorEntry, ...]:
    """`code: meaning`, then `-> action` (errorcatalog/entry.py, `rows`)."""
    return tuple(ErrorEntry("invalid_request", code, _STATUS, meaning, action)
                 for (code,), meaning, action in rows(table))


# the schema's rules, as the validator reports them (serving/validation.py)
SCHEMA = _codes("""
unknown_field: an unknown (often misspelt) field, or an option sent in the query string
  -> fix the name; see the route's schema for the accepted ones
missing_field: a required field is missing
  -> send it
wrong_type: a value of the wrong JSON type (a string or a boolean for a count, a body that is no object)
  -> send the type the schema says
out_of_range: a number outside its bounds
  -> send a number within the bounds the message gives
too_long: a string or list longer than allowed
  -> send less
too_short: a string or list shorter than allowed
  -> send at least the minimum the message gives
not_finite: a number that is not finite
  -> send a finite number
not_allowed: a value that is not one of the allowed ones
  -> use one of the values the message lists
invalid_string: text that is not valid Unicode (an unpaired surrogate)
  -> send valid Unicode text
invalid_value: a value that is not acceptable (the message says why)
  -> change the value in param
invalid_combination: fields that cannot go together, or one that needs another
  -> change the fields as the message says
conflicting_fields: both of two fields that exclude each other (prompt and messages)
  -> send exactly one of them
""")

# what a surface refuses by name (protocol/*.py, serving/*.py)
SURFACES = _codes("""
unsupported_parameter: a parameter this server knows but does not implement
  -> leave it out
unsupported_value: a value this server does not implement for its field
  -> use a supported value (the message lists them)
unsupported_content: a content part of a type this server does not take (an image, audio, a file)
  -> send text
unsupported_role: a message role this route does not take
  -> use a role the message lists
unsupported_tool: a tool of a type other than a function (a built-in tool)
  -> send function tools only
unsupported_tool_choice: a tool_choice of a type this server does not take
  -> use auto, none, required or a named function
unsupported_schema: a JSON schema this server cannot enforce
  -> use the supported subset (docs/openai.md)
unsupported_for_model: a feature the upstream engine serving this model cannot give (logprobs, a grammar)
  -> leave the feature out, or use another model
unknown_function: tool_choice names a tool that is not in tools
  -> name one of the tools sent
duplicate_function: two tools have the same name
  -> give each tool its own name
invalid_strict_schema: strict is true but the parameters are not a strict schema (objects closed, all required)
  -> make the schema strict, or leave strict out (undeclared properties are refused either way)
misplaced_block: a content block where the message's role does not allow it
  -> move the block as the message says
no_chat_template: the model ships no chat template, so it cannot take messages
  -> send a prompt instead, or the operator gives the model one (--chat-template-file)
template_error: the model's chat template refused these messages (their roles or order)
  -> change the messages as the message says
empty_prompt: the prompt has no tokens
  -> send a prompt with text in it
invalid_token_id: a token id outside the model's vocabulary
  -> use ids from 0 to the vocabulary size - 1
too_many_choices: prompts times n is more than one request may generate
  -> send fewer prompts or a smaller n
conversation_too_long: a stored conversation has more than 1024 messages, or a message more than 256 parts
  -> start a new conversation
invalid_cursor: `after` names nothing of this API key
  -> use an id from the list
""")

HEADERS = _codes("""
invalid_header: a timeout header is not a positive number of seconds, or comes twice with two values
  -> send one valid value (docs/timeouts.md)
invalid_idempotency_key: the Idempotency-Key header is empty, over 255 characters, not visible ASCII, or sent twice
  -> send one key of 1 to 255 visible ASCII characters
""")

# batch jobs and files (docs/jobs.md), webhooks (docs/webhooks.md), API keys (docs/keys.md)
RESOURCES = _codes("""
too_many_items: more requests than one batch job may hold
  -> split the batch
file_in_use: a batch that has not finished reads this file
  -> cancel the batch or let it end first
batch_not_cancellable: the batch has ended, so it cannot be cancelled
  -> read its results
invalid_multipart: the upload is not a valid multipart/form-data body
  -> send the file as multipart/form-data (fields `file` and `purpose`)
too_many_files: the upload carries more than one file
  -> send one file a request
too_many_fields: the upload has more than 16 form fields besides the file
  -> send the documented fields
field_too_large: a form field of the upload is over its size limit
  -> send a shorter field
invalid_url: a webhook URL is malformed, too long, not http(s), or carries a user name
  -> send a plain http(s) URL
url_not_allowed: a webhook URL reaches a private, loopback, link-local or other forbidden address
  -> use a public address
url_unresolvable: a webhook URL's host does not resolve
  -> fix the host name
too_many_endpoints: the API key has as many webhook endpoints as it may
  -> delete one first
key_revoked: the API key is revoked, so it cannot change
  -> create a new key
expires_in_past: expires_at is not in the future
  -> give a time in the future
invalid_name: a key's name holds a control character, a line break or a bidirectional override
  -> send a name of printable characters
weak_secret: a secret to import as an API key is guessable (repeats, sequences, words)
  -> import only random secrets, or let the server make the key
key_expired: the API key has expired, so it cannot change (an expired key is not revived)
  -> create a new key
""")

ENTRIES: tuple[ErrorEntry, ...] = (*SCHEMA, *SURFACES, *HEADERS, *RESOURCES)
