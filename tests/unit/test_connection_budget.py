"""The connection budget: as configured, never more than the file descriptors allow."""

from __future__ import annotations

import resource

from sluicegate.api.server.run import DEFAULT_MAX_CONNECTIONS, FD_RESERVE, connection_budget, raise_fd_limit
from sluicegate.config import ConnectionConfig


def test_the_default_budget_when_descriptors_are_plenty() -> None:
    assert connection_budget(ConnectionConfig(), 1 << 20) == DEFAULT_MAX_CONNECTIONS


def test_a_configured_budget_is_kept_when_it_fits() -> None:
    assert connection_budget(ConnectionConfig(max_connections=100), 1 << 20) == 100


def test_the_budget_leaves_the_reserve_and_the_health_headroom() -> None:
    conn = ConnectionConfig(max_connections=10_000, health_connections=32)
    assert connection_budget(conn, 1024) == 1024 - FD_RESERVE - 32
    assert connection_budget(ConnectionConfig(), 1024) == 1024 - FD_RESERVE - 32


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    soft = raise_fd_limit()
    now_soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == now_soft
    assert hard == resource.RLIM_INFINITY or soft == hard
