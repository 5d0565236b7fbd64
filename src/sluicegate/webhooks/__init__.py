"""Signed event notifications (Standard Webhooks) for batch jobs: endpoints per API key, persisted deliveries,
a dispatcher with retries, and the SSRF guard. docs/webhooks.md."""

from sluicegate.webhooks.dispatcher import EVENT_TYPES, Webhooks, sign
from sluicegate.webhooks.ssrf import Guard, Target, UnsafeUrl

__all__ = ["EVENT_TYPES", "Guard", "Target", "UnsafeUrl", "Webhooks", "sign"]
