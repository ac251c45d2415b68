"""``policies.tier_value``: the per-tier value of an object (its sign is load vs recompute,
likelihood from uses and age), its defaults (the capacity benchmark's rates), and the
``tier_eviction`` switch through a real ``HybridCache`` over real tiers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybrid_connector import assemble
from hybrid_connector.bench.schema import CapacityConfig
from hybrid_connector.core.config import ConfigError, load_config
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import load_geometry
from hybrid_connector.index.plan import SaveItem
from hybrid_connector.policies.eviction.tier_value import TierValue, likelihood, since_of

K = ObjectKind
QWEN = load_geometry("qwen3.5-4b")


def kv(start: int, end: int) -> ObjectKey:
    return ObjectKey("fp", b"\x01" * 16, K.KV, start, end)


def state(p: int) -> ObjectKey:
    return ObjectKey("fp", b"\x02" * 16, K.STATE, p, p)


def test_defaults_are_the_capacity_benchmarks_rates() -> None:
    cfg = load_config(None, {}, environ={})
    bench = CapacityConfig()
    tv = TierValue.from_config(QWEN, cfg)
    assert tv.read_bps == {"device": bench.load_gbps["device"] * 1e9,
                           "host": bench.load_gbps["host"] * 1e9,
                           "nvme": bench.load_gbps["nvme"] * 1e9, "remote": 2e9}
    assert tv.flops_per_s == pytest.approx(bench.device_tflops * bench.mfu * 1e12, rel=1e-3)
    with pytest.raises(ConfigError):
        load_config(None, {"tier_read_gbps": {"disk": 0}}, environ={})
    with pytest.raises(ConfigError):
        load_config(None, {"tier_eviction": "fifo"}, environ={})


def test_value_is_positive_exactly_when_loading_beats_recomputing() -> None:
    tv = TierValue(QWEN, {"device": 1500e9, "host": 25e9, "nvme": 6e9, "slow": 0.1e9}, 445e12)
    n = QWEN.state_bytes()
    for p in (64, 256, 1024, 8192):
        recompute = QWEN.flops_saved(p).total / 445e12
        for tier, bps in tv.read_bps.items():
            v = tv(state(p), n, tier, 0, 0)
            assert v is not None
            assert (v > 0) == (recompute > n / bps), (p, tier)
            assert v == pytest.approx((recompute - n / bps) / n)
    chunk = 256 * QWEN.kv_bytes_per_token()
    deep, shallow = tv(kv(8192, 8448), chunk, "nvme", 0, 0), tv(kv(0, 256), chunk, "nvme", 0, 0)
    assert deep is not None and shallow is not None and deep > shallow > 0  # attention context
    assert tv(kv(0, 256), chunk, "somewhere", 0, 0) is None  # an unknown tier: unknown
    assert since_of(state(300)) == 0 and since_of(kv(256, 512)) == 256


def test_likelihood_grows_with_uses_and_falls_with_age() -> None:
    assert likelihood(3, 10) > likelihood(1, 10) > likelihood(1, 20)
    assert likelihood(0, 0) == 1.0
    tv = TierValue(QWEN, {"nvme": 6e9}, 445e12)
    n = QWEN.state_bytes()
    used, idle = tv(state(4096), n, "nvme", 5, 3), tv(state(4096), n, "nvme", 0, 30)
    assert used is not None and idle is not None and used > idle > 0


# A tiny hybrid: its few bytes cost less to recompute than to read from anywhere, so with
# the switch on nothing is worth a slower tier; with it off the LRU demotes everything.
GEO = ModelGeometry.from_dict({
    "name": "tiny", "architecture": "qwen3_5_text", "hidden_size": 8, "vocab_size": 64,
    "layers": ["gdn+mlp", "attention+mlp"],
    "attention": {"num_heads": 2, "num_kv_heads": 2, "head_dim": 4},
    "gdn": {"num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 2, "head_v_dim": 4,
            "conv_kernel": 5},
    "mlp": {"intermediate_size": 16},
})


def _items(toks: np.ndarray) -> list[SaveItem]:
    import torch

    def pay(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.uint8)

    out = [SaveItem(K.KV, s, min(s + 8, len(toks)), pay((min(s + 8, len(toks)) - s) * GEO.kv_bytes_per_token()))
           for s in range(0, len(toks), 8)]
    return out + [SaveItem(K.STATE, p, p, pay(GEO.state_bytes())) for p in range(8, len(toks) + 1, 8)]


@pytest.mark.parametrize("mode", ["lru", "value"])
def test_switch_through_the_cache(tmp_path: Path, mode: str) -> None:
    cfg = load_config(None, {
        "chunk_size": 8, "hash_block_size": 4, "alignment": 4, "tier_eviction": mode,
        "device_size": 0, "local_disk": str(tmp_path / "disk"), "max_local_cpu_size": "1MB",
        "pools": {"device": {"kv": "2KiB", "state": "1KiB"}, "host": {"kv": "2KiB", "state": "1KiB"},
                  "disk": {"kv": "64KiB", "state": "32KiB"}},
    }, environ={})
    store = assemble.store(cfg)
    cache = assemble.cache(cfg, GEO, store)
    try:
        assert (store.ledger.value_window > 0) == (mode == "value")
        assert (store.hooks_of(ObjectKey(cache.fingerprint, b"\x00" * 16, K.KV, 0, 8))
                .tier_value is not None) == (mode == "value")
        rng = np.random.default_rng(0)
        for _ in range(30):
            toks = rng.integers(0, 1000, 40).astype(np.int64)
            cache.save(toks, _items(toks))
            cache.check_integrity()
            store.ledger.check()
        cache.flush()
        on_nvme = len(store.ledger.held("nvme"))
        assert (on_nvme > 0) == (mode == "lru"), on_nvme
    finally:
        cache.close()
