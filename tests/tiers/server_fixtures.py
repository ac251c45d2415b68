"""The real-server fixtures (``lmcache_server``, ``redis_server``), imported by every
conftest that needs them (tests/tiers, tests/vllm)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tier_servers import run_lmcache, run_redis


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
