"""The caller's time budget, made into deadlines (docs/timeouts.md).

Where the budget comes from, first found wins:

- `X-Request-Timeout` (anyone): seconds, decimal; bounds the whole answer, streamed or not;
- `x-stainless-read-timeout` (the official Python SDK, on every request; its default is `600.0`): seconds;
  bounds a whole answer, but only a stream's first token;
- `x-stainless-timeout` (the official Node SDK): whole seconds (its timeout truncated); the same as Python's.

An SDK's timeout is a *read* timeout (Python: httpx's per-read timeout; Node: a timer that stops once the
response headers arrive). A whole answer sends nothing before it is done, so the timeout bounds all of it; a
stream's bytes (its first chunk, then heartbeats every `HEARTBEAT_S`) keep resetting the client's timer, so
only the wait for its first token is bounded: after that the stream has no deadline from that header. The
Node SDK sends `0` for a timeout under a second (it truncates milliseconds to seconds); that is read as 1 s.

No header: the server's default (`--default-timeout`; none by default). Every budget, the default included,
is capped by the server's maximum (`--max-timeout`, 1800 s): no request runs longer than that. A budget
counts from the request's arrival (the first middleware's stamp), so reading, parsing and tokenising count.

A malformed value (not a plain positive decimal number of seconds: `PATTERN`, which the OpenAPI document
states; or two different values) is refused with
`invalid_request` naming the header (422; 400 on the OpenAI routes), never ignored: a caller who sends a
budget means it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sluicegate.config import DeadlineConfig
from sluicegate.engine import DeadlineTooShort
from sluicegate.serving.context import Bound, Deadlines, RequestContext
from sluicegate.serving.errors import ApiError

# (lower-case name, name as documented and reported in `param`, bounds a whole stream too)
HEADERS: tuple[tuple[str, str, bool], ...] = (
    ("x-request-timeout", "X-Request-Timeout", True),
    ("x-stainless-read-timeout", "x-stainless-read-timeout", False),
    ("x-stainless-timeout", "x-stainless-timeout", False),
)
_NODE = "x-stainless-timeout"
# A positive decimal number of seconds, as the OpenAPI document states it (api/routes/common.py): a non-zero
# digit somewhere, at most 29 + 15 digits and a two-digit exponent, so float() of it is finite and above 0.
PATTERN = (r"^([0-9]{0,14}[1-9][0-9]{0,14}(\.[0-9]{1,15})?|[0-9]{1,15}\.[0-9]{0,14}[1-9][0-9]{0,14})"
           r"([eE][+-]?[0-9]{1,2})?$")
_NUMBER = re.compile(PATTERN)
DEFAULT_SOURCE = "the server's default timeout (--default-timeout)"
MAX_SOURCE = "the server's maximum timeout (--max-timeout)"


@dataclass(frozen=True, slots=True)
class CallerTimeout:
    seconds: float
    header: str  # as documented: the `param` of an error about it
    whole: bool  # bounds a whole stream too (X-Request-Timeout); False: an SDK's read timeout


def caller_timeout(headers: Mapping[str, Sequence[str]]) -> CallerTimeout | None:
    """The caller's budget from `headers` (lower-case name -> every value sent), or None when it sent none."""
    for key, name, whole in HEADERS:
        values = {v.strip() for v in headers.get(key, ())}
        if not values:
            continue
        if len(values) > 1:
            raise _malformed(name, f"{name} was sent more than once, with different values")
        (text,) = values
        seconds = float(text) if _NUMBER.match(text) else math.nan
        if key == _NODE and text == "0":
            seconds = 1.0  # the Node SDK's truncation of a sub-second timeout
        if not (math.isfinite(seconds) and seconds > 0):
            raise _malformed(name, f"{name} must be a positive number of seconds, such as 30 or 2.5")
        return CallerTimeout(seconds, name, whole)
    return None


def _malformed(name: str, message: str) -> ApiError:
    return ApiError("invalid_request", message, param=name, code="invalid_header")


def deadlines(timeout: CallerTimeout | None, arrival: float, config: DeadlineConfig) -> Deadlines:
    """The request's deadlines: its own budget, else the server's default, capped by the server's maximum."""

    def bound(seconds: float | None, source: str) -> Bound | None:
        cap = config.max_timeout_s
        if cap is not None and (seconds is None or seconds > cap):
            seconds, source = cap, MAX_SOURCE
        return None if seconds is None else Bound(arrival + seconds, seconds, source)

    server = bound(config.default_timeout_s, DEFAULT_SOURCE)
    if timeout is None:
        return Deadlines(server, server, None)
    own = bound(timeout.seconds, timeout.header)
    if timeout.whole:
        return Deadlines(own, own, None)
    return Deadlines(own, server, own)


def apply(ctx: RequestContext, timeout: CallerTimeout | None, config: DeadlineConfig) -> None:
    """Set the request's deadlines (a whole answer's; `RequestContext.streaming` switches to a stream's)."""
    d = deadlines(timeout, ctx.arrival, config)
    ctx.deadlines = d
    ctx.deadline = None if d.answer is None else d.answer.at
    ctx.first_token_deadline = None


def caller_set(ctx: RequestContext, *, stream: bool) -> bool:
    """Whether the request's whole-answer deadline (a stream's, when it streams) is the caller's own budget:
    only such a deadline may refuse a request by forecast (engine/forecast.py). The server's default and cap
    end a request that outlives them, but never refuse one up front."""
    d = ctx.deadlines
    b = None if d is None else d.stream if stream else d.answer
    return b is not None and b.source not in (DEFAULT_SOURCE, MAX_SOURCE)


def too_short(exc: DeadlineTooShort, ctx: RequestContext, *, stream: bool, new_param: str | None) -> ApiError:
    """The 4xx for a request that cannot meet its deadline even on an idle server, with the numbers."""
    j = exc.judgement
    d = ctx.deadlines
    b = None if d is None else (d.first_token if j.first_token else d.stream if stream else d.answer)
    budget = f"a budget of {j.left_s:.1f} s" if b is None else f"a budget of {b.budget_s:g} s ({b.source})"
    header = b is not None and b.source not in (DEFAULT_SOURCE, MAX_SOURCE)
    if j.first_token:
        what, fix, param = "its first token", "send a shorter prompt", b.source if b is not None and header else None
    else:
        what, fix, param = "its answer", "ask for fewer new tokens", new_param
    if b is None or b.source != MAX_SOURCE:  # a longer timeout header can still help
        fix += " or allow more time (X-Request-Timeout)"
    return ApiError(
        "deadline_too_short",
        f"{what} needs at least {j.needed_s:.1f} s at this server's best measured speed, over {budget}; {fix}",
        param=param, code="first_token" if j.first_token else "answer",
    )
