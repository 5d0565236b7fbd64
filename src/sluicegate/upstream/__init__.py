"""Upstream engines (vLLM, llama-server, TGI, another sluicegate) behind our boundary: an engine-like client
(`AsyncUpstream`), the endpoints with their circuit breakers, the wire, and the start-up checks."""

from sluicegate.upstream.client import AsyncUpstream, new_http_client
from sluicegate.upstream.pool import Endpoint
from sluicegate.upstream.startup import UpstreamRefused, probe

__all__ = ["AsyncUpstream", "Endpoint", "UpstreamRefused", "new_http_client", "probe"]
