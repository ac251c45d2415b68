"""Fixtures for the SGLang backend tests: a real ``redis-server`` on 127.0.0.1 (helpers
are in ``sglang_helpers.py``, host pools in ``host_pools.py``).

The redis fixture follows ``tests/tiers/conftest.py`` (``tier_servers`` is imported from
there by path): a missing binary skips, except with ``CI=true`` where it fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# No importorskip here: a skip raised while loading a conftest aborts the run. Each test
# module skips itself when SGLang is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tiers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tier_servers import run_redis  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a real, non-persistent ``redis-server``."""
    with run_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url
