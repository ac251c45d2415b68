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


@pytest.mark.parametrize(("extra", "keeps"), [
    ({}, False),  # host only: a copy dies with its worker, no metadata to build
    ({"local_disk": "DISK", "max_local_disk_size": "8MB"}, True),  # NVMe: warm restarts
    ({"remote_url": "redis://127.0.0.1:1", "pools": {"remote": {"kv": "1MB", "state": "1MB"}}},
     True),  # shared: manifests
])
def test_the_ledger_backend_asks_for_metadata_only_for_a_lasting_tier(
        tmp_path: Path, extra: dict, keeps: bool) -> None:
    """Saves built an ``ObjectMeta`` (the object's tokens as a tuple, its chain hashes) for
    every object, host-only too, where nothing reads it (~5% of the vLLM scheduler side's
    CPU at 256 requests in flight)."""
    from hybrid_connector.tiers.configured import ledger_backend

    over = {k: (str(tmp_path / "d") if v == "DISK" else v) for k, v in extra.items()}
    over["pools"] = {"host": {"kv": "2MB", "state": "1MB"}, **over.get("pools", {})}
    backend = ledger_backend(load_config(overrides=over))
    assert backend.keeps_meta is keeps
