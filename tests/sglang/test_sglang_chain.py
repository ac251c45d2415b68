"""FLOP-aware eviction behind SGLang's hash-only calls (``integrations/sglang_chain.py``):
the page chain rebuilt from ``prefix_keys``, and the order the real backend evicts in with
``tier_eviction: value`` against the LRU default, through SGLang's own hash function,
transfers and MAMBA host pool."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage")

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo  # noqa: E402
from sglang_helpers import (  # noqa: E402
    PAGE,
    dynamic_backend,
    kv_transfer,
    page_hashes,
    pools,
    register,
    state_transfer,
)

from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.integrations.sglang.chain import PageChain  # noqa: E402
from hybrid_connector.integrations.sglang.keys import hash_bytes  # noqa: E402

KV_PAGE, SLOT = 512, 640  # bytes of one page / one MAMBA slot in sglang_helpers.pools


def _chain_of(n: int, start: int = 0) -> list[str]:
    return page_hashes(list(range(start, start + n * PAGE)))


def test_the_chain_gives_depths_and_counts_the_states_below_each_page() -> None:
    h = _chain_of(5)
    c = PageChain()
    c.learn(None, h)  # SGLang not passing prefix_keys: nothing to learn from
    c.stored(ObjectKind.KV, [hash_bytes(x) for x in h])
    assert len(c) == 0 and c.depth(hash_bytes(h[0])) is None
    c.learn([], h[:2])
    c.learn(h[:2], h[2:])  # a later batch of the same request
    c.stored(ObjectKind.KV, [hash_bytes(x) for x in h])
    assert [c.depth(hash_bytes(x)) for x in h] == [1, 2, 3, 4, 5]
    assert [c.states_below(hash_bytes(x)) for x in h] == [0] * 5
    c.stored(ObjectKind.STATE, [hash_bytes(h[4]), hash_bytes(h[1])])
    c.stored(ObjectKind.STATE, [hash_bytes(h[4])])  # stored again: counted once
    assert [c.states_below(hash_bytes(x)) for x in h] == [2, 2, 1, 1, 1]
    c.check_integrity()
    c.dropped(ObjectKind.KV, [hash_bytes(x) for x in h[1:4]])  # links kept for the state
    assert len(c) == 5 and c.states_below(hash_bytes(h[0])) == 2
    c.check_integrity()
    c.dropped(ObjectKind.STATE, [hash_bytes(h[4])])
    assert [c.states_below(hash_bytes(x)) for x in h] == [1, 1, 0, 0, 0]
    assert len(c) == 3  # 1 and 5: their KV; 2: its state; 3-4 had nothing left: released
    c.dropped(ObjectKind.STATE, [hash_bytes(h[1])])
    assert len(c) == 2 and c.depth(hash_bytes(h[1])) is None and c.depth(hash_bytes(h[4])) == 5
    c.check_integrity()
    with pytest.raises(ValueError):
        c.learn([], [""])


def _backend(tmp_kv: int, tmp_state: int, value: bool) -> tuple[Any, Any, Any]:
    over: dict[str, Any] = {"pools": {"host": {"kv": tmp_kv, "state": tmp_state}}}
    if value:
        over |= {"tier_eviction": "value", "model": "qwen3.5-4b"}
    b = dynamic_backend(over)
    kv, mamba = pools(kv_pages=32, slots=8)
    register(b, kv, mamba)
    return b, kv, mamba


def _write(b: Any, prefix: list[str], pages: list[str], first: int,
           state_slot: int | None = None) -> None:
    ts = [kv_transfer(pages, first)]
    if state_slot is not None:
        ts.append(state_transfer(pages[-1], state_slot))
    # SGLang groups transfers so that prefix_keys + keys is one chain per call
    kv_ok = b.batch_set_v2(ts[:1], HiCacheStorageExtraInfo(prefix_keys=list(prefix)))
    assert all(kv_ok["kv"])
    if state_slot is not None:
        info = HiCacheStorageExtraInfo(prefix_keys=list(prefix) + pages[:-1])
        assert all(b.batch_set_v2(ts[1:], info)["mamba"])


def _held(b: Any, pool: str, hashes: list[str]) -> list[bool]:
    return b._present(pool, hashes)


@pytest.mark.parametrize("value", [False, True], ids=["lru", "value"])
def test_a_full_state_pool_gives_up_the_shallowest_state_with_value(value: bool) -> None:
    """Two slots of states. The deepest state was stored first: LRU gives it up for a new
    one; the FLOP-aware order keeps it (its hit saves a whole 32-page prefill) and gives up
    the 2-page one."""
    b, _, _ = _backend(64 * KV_PAGE, 2 * SLOT, value)
    h = _chain_of(8)
    _write(b, [], h, 0)
    for slot, depth in enumerate((8, 2, 4)):
        info = HiCacheStorageExtraInfo(prefix_keys=h[: depth - 1])
        assert all(b.batch_set_v2([state_transfer(h[depth - 1], slot)], info)["mamba"])
    held = _held(b, "mamba", [h[7], h[1], h[3]])
    assert held == ([False, True, True] if not value else [True, False, True])
    b.chain.check_integrity()
    b.close()


@pytest.mark.parametrize("value", [False, True], ids=["lru", "value"])
def test_a_full_kv_pool_gives_up_dead_pages_first_with_value(value: bool) -> None:
    """Six KV pages fit: request A's four pages with its state at the end, then request B's
    two pages without a state (it was aborted before its state was written). A third
    request's page needs room: LRU gives up A's first page, which leaves A no hit at all;
    the value order gives up a page of B, which no state ends on or after (part of no L3
    hit), and A still hits in full."""
    b, _, _ = _backend(6 * KV_PAGE, 2 * SLOT, value)
    a = _chain_of(4)
    _write(b, [], a, 0, state_slot=0)
    dead = _chain_of(2, start=5_000)
    _write(b, [], dead, 4)
    _write(b, [], _chain_of(1, start=10_000), 8)
    assert _held(b, "kv", a) == ([False, True, True, True] if not value else [True] * 4)
    assert _held(b, "kv", dead) == ([True, True] if not value else [False, True])
    ex = b.batch_exists_v2(a, [state_transfer(a[-1], None)], HiCacheStorageExtraInfo(prefix_keys=[]))
    assert ex.kv_hit_pages == (0 if not value else 4)
    b.chain.check_integrity()
    b.close()


def test_without_prefix_keys_value_eviction_falls_back_to_lru() -> None:
    b, _, _ = _backend(4 * KV_PAGE, 2 * SLOT, True)
    a = _chain_of(4)
    assert all(b.batch_set_v2([kv_transfer(a, 0)])["kv"])  # no extra_info: depths unknown
    assert all(b.batch_set_v2([kv_transfer(_chain_of(1, start=10_000), 8)])["kv"])
    assert _held(b, "kv", a) == [False, True, True, True]
    assert len(b.chain) == 0
    b.close()


def test_value_eviction_without_a_model_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="model"):
        dynamic_backend({"tier_eviction": "value", "pools": {"host": {"kv": 4096, "state": 4096}}})


@pytest.mark.parametrize("value", [False, True], ids=["lru", "value"])
def test_across_tiers_a_dead_page_is_dropped_and_a_live_one_demoted(value: bool,
                                                                    tmp_path: Any) -> None:
    """Host (six KV pages) over NVMe: the host victim goes down to NVMe when it can still
    be part of a hit; with the value order a page no stored state ends on or after is the
    victim and leaves both tiers (nothing of value to keep), and the live chain stays on
    the host."""
    over: dict[str, Any] = {
        "local_disk": str(tmp_path / "nvme"), "max_local_disk_size": "1MB", "disk_fsync": False,
        "pools": {"host": {"kv": 6 * KV_PAGE, "state": 2 * SLOT},
                  "disk": {"kv": 64 * KV_PAGE, "state": 8 * SLOT}}}
    if value:
        over |= {"tier_eviction": "value", "model": "qwen3.5-4b"}
    b = dynamic_backend(over)
    kv, mamba = pools(kv_pages=32, slots=8)
    register(b, kv, mamba)
    a, dead = _chain_of(4), _chain_of(2, start=5_000)
    _write(b, [], a, 0, state_slot=0)
    _write(b, [], dead, 4)
    _write(b, [], _chain_of(1, start=10_000), 8)
    where = [t for t in b.store.where([b.keys.key("kv", h) for h in (a[0], dead[0])])]
    assert where == (["nvme", "host"] if not value else ["host", None])
    ex = b.batch_exists_v2(a, [state_transfer(a[-1], None)], HiCacheStorageExtraInfo(prefix_keys=[]))
    assert ex.kv_hit_pages == 4  # from host alone or host + NVMe
    b.close()


def test_the_shipped_sglang_config_turns_flop_aware_eviction_on() -> None:
    from pathlib import Path

    from hybrid_connector.core.config import load_config
    from hybrid_connector.geometry.presets import load_geometry

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "sglang-qwen3_5.yaml")
    assert cfg.tier_eviction == "value" and cfg.model
    assert load_geometry(cfg.model).state_bytes() > 0
