"""`/v1/webhook-endpoints` and the delivery log: schemas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel, StrictModel

_PORT = "[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]"
# The form webhooks/ssrf.py `check_url` accepts, in printable ASCII: http(s), a host, no user name or
# password, a port of 1 to 65535, no whitespace or control characters.
URL_PATTERN = rf"^[Hh][Tt][Tt][Pp][Ss]?://[A-Za-z0-9._~%-]+(:({_PORT}))?([/?#][!-~]*)?$"

EventType = Literal["batch.completed", "batch.failed", "batch.cancelled", "batch.expired"]


class WebhookEndpointCreate(StrictModel):
    model_config = StrictModel.model_config | {"json_schema_extra": {"description": (
        "Rules this schema cannot state: the URL's host must resolve (`url_unresolvable`) to public addresses "
        "(`url_not_allowed`), and a key holds a bounded number of endpoints (`too_many_endpoints`); each names "
        "`url`.")}}

    url: str = Field(min_length=1, max_length=2048, description="http(s) URL that receives the events; it must "
                     "resolve to public addresses (docs/webhooks.md)",
                     json_schema_extra={"format": "uri", "pattern": URL_PATTERN})
    event_types: list[EventType] = Field(min_length=1, max_length=4, description="the events to receive")


class WebhookEndpointOut(ResponseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    url: str
    event_types: list[str]
    created_at: str = Field(description="RFC 3339, UTC")
    status: Literal["enabled", "disabled"]
    disabled_reason: str | None = None
    secret: str | None = Field(None, description="`whsec_...`: shown once, in the answer that created it")


class WebhookEndpointList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[WebhookEndpointOut]


class WebhookEndpointDeleted(ResponseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    deleted: Literal[True] = True


class WebhookDeliveryOut(ResponseModel):
    id: str
    object: Literal["webhook_delivery"] = "webhook_delivery"
    event_id: str = Field(description="the webhook-id header: the same on every retry")
    event_type: str
    endpoint_id: str
    subject: str | None = Field(description="what the event is about (a batch's id)")
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: str
    delivered_at: str | None
    next_attempt_at: str | None = Field(description="pending: when the next attempt is due")
    log: list[dict[str, Any]] = Field(description="every attempt: at, status_code, error, duration_ms")


class WebhookDeliveryList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[WebhookDeliveryOut]
