"""Upstream engines (vLLM, llama-server, TGI, another sluicegate) behind our boundary: an engine-like client
(`AsyncUpstream`), the endpoints with their circuit breakers, the wire, the start-up checks, and loading the
configured upstream models (load.py)."""

from sluicegate.upstream.client import AsyncUpstream, new_http_client
from sluicegate.upstream.load import Probed, TokenizerFactory, load_upstreams
from sluicegate.upstream.pool import Endpoint
from sluicegate.upstream.startup import UpstreamRefused, probe

__all__ = ["AsyncUpstream", "Endpoint", "Probed", "TokenizerFactory", "UpstreamRefused", "load_upstreams",
           "new_http_client", "probe"]
