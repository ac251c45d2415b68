"""Fixtures for the tier tests: keys, payloads, and real servers on 127.0.0.1.

``lmcache_server`` and ``redis_server`` start the real binaries on a free port and tear
them down. A missing binary skips the test, except with ``CI=true`` where it fails (so CI
can never pass by silently skipping the integration tests).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tier_servers import StalledServer, free_port, run_lmcache, run_redis


@pytest.fixture(scope="session")
def lmcache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``lm://127.0.0.1:PORT`` of a real ``lmcache_server`` (lmcache 0.5.6, CPU storage)."""
    with run_lmcache(tmp_path_factory.mktemp("lmcache")) as url:
        yield url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a real, non-persistent ``redis-server``."""
    with run_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


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
