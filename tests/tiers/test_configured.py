"""``tier_specs`` (a scheduler's ledger, no bytes) equals the specs of the tiers
``build_tiers`` makes from the same config (a worker's), so both accept the same objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid_connector.core.config import load_config
from hybrid_connector.tiers.backend import spec_of
from hybrid_connector.tiers.configured import build_tiers, tier_specs


@pytest.mark.parametrize("pools", [
    {"host": {"kv": "3MB", "state": "1MB", "anchor": "256KB"}},
    {"device": {"kv": "1MB", "state": "2MB"}, "host": {"kv": "5MB", "state": "777KB"},
     "disk": {"kv": "9MB", "state": "4MB", "anchor": "1MB"}},
])
def test_specs_without_tiers_equal_the_specs_of_built_tiers(tmp_path: Path, pools: dict) -> None:
    cfg = load_config(overrides={"pools": pools, "local_disk": str(tmp_path / "d"),
                                 "max_local_disk_size": "14MB", "disk_fsync": False})
    built = build_tiers(cfg, device="cpu", disk_path=tmp_path / "rank0")
    try:
        assert [spec_of(t) for t in built] == tier_specs(cfg)
        assert {t.name for t in built} >= {"host"}
    finally:
        for t in built:
            t.close()
