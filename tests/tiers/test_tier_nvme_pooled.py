"""One budget for KV and states on the NVMe tier (``pools.disk.kv_state``): the config is
accepted and reaches the tier and the ledger view as one pool; the tier holds both kinds
together within it (each grows into what the other leaves); a restart over the directory
keeps the newest files that fit the shared budget, not a budget per kind."""

from __future__ import annotations

from pathlib import Path

from tier_helpers import make_key, make_payload

from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.backend import spec_of
from hybrid_connector.tiers.configured import build_tiers, tier_specs
from hybrid_connector.tiers.nvme import NvmeTier

K = ObjectKind
JOINT = (K.KV, K.STATE)
POOL = 40_000  # bytes KV and states share


def _pooled(path: Path) -> NvmeTier:
    return NvmeTier(path, {K.KV: POOL, K.STATE: POOL, K.ANCHOR: 0}, joint=JOINT)


def test_kinds_share_the_disk_budget(tmp_path: Path) -> None:
    tier = _pooled(tmp_path / "n")
    kv = [(make_key(i), make_payload(i, (2500,))) for i in range(3)]  # 30,000 B of KV
    assert tier.put(kv) == [True] * 3
    state = make_payload(9, (2500,))  # 10,000 B: exactly the room KV left
    assert tier.put([(make_key(9, K.STATE), state)]) == [True]
    assert tier.put([(make_key(10, K.STATE), state)]) == [False]  # the pool is full
    assert tier.used(K.KV) + tier.used(K.STATE) == POOL
    tier.close()


def test_a_restart_keeps_what_fits_the_shared_budget(tmp_path: Path) -> None:
    """Written under a budget per kind (40,000 B each, 60,000 B in all), reopened under one
    shared 40,000 B budget: the newest files that fit stay, the rest are dropped."""
    path = tmp_path / "n"
    wide = NvmeTier(path, {K.KV: POOL, K.STATE: POOL, K.ANCHOR: 0})
    for i in range(3):
        assert wide.put([(make_key(i), make_payload(i, (2500,)))]) == [True]
        assert wide.put([(make_key(i, K.STATE), make_payload(10 + i, (2500,)))]) == [True]
    wide.close()
    again = _pooled(path)
    held = again.used(K.KV) + again.used(K.STATE)
    assert held <= POOL and len(again.dropped_at_start) == 2
    assert len([f for f in path.iterdir() if not f.name.startswith(".")]) == 4
    again.close()


def test_config_disk_kv_state_reaches_the_tier_and_the_ledger_view(tmp_path: Path) -> None:
    cfg = load_config(overrides={"max_local_cpu_size": "1MiB", "local_disk": str(tmp_path / "d"),
                                 "max_local_disk_size": "1MiB",
                                 "pools": {"host": {"kv_state": "900KiB", "anchor": "100KiB"},
                                           "disk": {"kv_state": "1MiB"}}},
                      environ={})
    assert cfg.budget("disk").pooled
    tiers = build_tiers(cfg)
    try:
        assert [spec_of(t) for t in tiers] == tier_specs(cfg)
        assert dict(tier_specs(cfg)[1].pools) == {"kv_state": 1 << 20}
        assert isinstance(tiers[1], NvmeTier) and tiers[1].joint == frozenset(JOINT)
    finally:
        for t in tiers:
            t.close()
