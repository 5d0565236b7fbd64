"""How the api layer writes each error dialect; which dialect a route speaks is the route registry's alone.

A route's `dialect` (sluicegate/registry.py `Dialect`: native, openai, anthropic) is declared once, on its
registry entry. This module maps each to its `DialectRendering`; the work lifecycle (api/work.py), the route
handlers' own refusals, the deadline middleware and the batch items look the rendering up from the request's
path (`rendering_of`) or the entry's dialect (`RENDERING`), never choose one of their own.

Anthropic's `render` is the envelope: every error answered on its routes, by the route or by anything that
refuses before it, is re-rendered in Anthropic's shape and statuses by one middleware (api/anthropic_errors.py
`AnthropicErrors`); its stream events and a batch item's error are rendered here, directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from fastapi import Response
from starlette.types import Scope

from sluicegate.api.anthropic_errors import anthropic_envelope, anthropic_view
from sluicegate.api.detached import Render
from sluicegate.api.envelope import envelope, error_response, http_status
from sluicegate.api.openai_errors import openai_envelope, openai_error_response, openai_view
from sluicegate.api.sse import ANTHROPIC_FRAMING, OPENAI_FRAMING, Framing
from sluicegate.refusal import Rejected
from sluicegate.registry import Dialect, route_for

RenderEvent = Callable[[Rejected, str], dict[str, Any]]  # an error as a body: (error, request id) -> JSON


@dataclass(frozen=True, slots=True)
class DialectRendering:
    """The functions that write one registry `Dialect`'s errors and streams."""

    render: Render  # an error answered before the answer or the stream starts
    render_event: RenderEvent  # a stream's error event, and a batch item's error body
    status: Callable[[Rejected], int]  # the status the client gets for an error (a batch item's result)
    framing: Framing  # a stream's events


def _openai_status(exc: Rejected) -> int:
    return openai_view(exc)[0]


def _anthropic_status(exc: Rejected) -> int:
    return anthropic_view(http_status(exc), exc.type)[0]


RENDERING: Mapping[Dialect, DialectRendering] = MappingProxyType({
    Dialect.NATIVE: DialectRendering(error_response, envelope, http_status, OPENAI_FRAMING),
    Dialect.OPENAI: DialectRendering(openai_error_response, openai_envelope, _openai_status, OPENAI_FRAMING),
    # `render`: the envelope, re-rendered by the AnthropicErrors middleware (module doc)
    Dialect.ANTHROPIC: DialectRendering(error_response, anthropic_envelope, _anthropic_status, ANTHROPIC_FRAMING),
})


def rendering_of(scope: Scope) -> DialectRendering:
    """The rendering of the dialect of the registry entry covering the request's path."""
    return RENDERING[route_for(scope.get("path", "")).dialect]


def render_error(scope: Scope, exc: Rejected, request_id: str) -> Response:
    """A refusal answered by a route handler, in its route's dialect."""
    return rendering_of(scope).render(exc, request_id)


__all__ = ["RENDERING", "DialectRendering", "RenderEvent", "render_error", "rendering_of"]
