"""Fixtures for the tier tests: keys, payloads, and real servers on 127.0.0.1.

``lmcache_server`` and ``redis_server`` start the real binaries on a free port and tear
them down. A missing binary skips the test, except with ``CI=true`` where it fails (so CI
can never pass by silently skipping the integration tests).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster_servers import redis_cluster  # noqa: F401  (fixture)
from server_fixtures import lmcache_server, redis_server  # noqa: F401  (fixtures)
from tier_servers import StalledServer, free_port


@pytest.fixture
def stalled_server() -> Iterator[StalledServer]:
    """A ``StalledServer`` on 127.0.0.1 (``.addr`` is ``host:port``)."""
    srv = StalledServer()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def dead_port() -> int:
    """A port nobody listens on (connection refused)."""
    return free_port()
