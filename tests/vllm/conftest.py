"""vLLM reads VLLM_TARGET_DEVICE when it first resolves its platform: set it before any
test module imports vllm (no GPU here)."""

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiers"))

from tier_servers import run_lmcache, run_redis  # noqa: E402


@pytest.fixture(scope="session")
def lmcache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``lm://127.0.0.1:PORT`` of a real ``lmcache_server`` (see tests/tiers/tier_servers.py)."""
    with run_lmcache(tmp_path_factory.mktemp("lmcache")) as url:
        yield url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a real ``redis-server``."""
    with run_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url
