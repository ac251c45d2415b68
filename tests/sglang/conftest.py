"""Fixtures for the SGLang backend tests: SGLang's real storage module, host pools in
SGLang's page layouts, a backend per tier, and a real ``redis-server`` on 127.0.0.1.

The redis fixture follows ``tests/tiers/conftest.py`` (``tier_servers`` is imported from
there by path): a missing binary skips, except with ``CI=true`` where it fails.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tiers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tier_servers import run_redis  # noqa: E402

TIERS = ("host", "nvme", "remote")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a real, non-persistent ``redis-server``."""
    with run_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


def tier_overrides(tier: str, tmp_path: Path, redis: Callable[[], str],
                   kv: str = "4MB", state: str = "1MB") -> dict[str, Any]:
    """``load_config`` overrides with ``tier`` as the only tier (budgets per kind)."""
    pools = {"kv": kv, "state": state}
    if tier == "host":
        return {"pools": {"host": pools}}
    if tier == "nvme":
        return {"local_cpu": False, "local_disk": str(tmp_path / "nvme"),
                "max_local_disk_size": "64MB", "disk_fsync": False, "pools": {"disk": pools}}
    if tier == "remote":
        return {"local_cpu": False, "remote_url": redis(), "pools": {"remote": pools}}
    raise ValueError(tier)
