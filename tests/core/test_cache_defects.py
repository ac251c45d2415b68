"""Regression tests for the cache and index defects of issue 9 (items 1-13), one or more per
item, named ``test_item<N>_...``. Each failed on the code before its fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from cache_support import (
    CHUNK,
    TINY,
    TINY_ATTN,
    config,
    kv_items,
    made_for,
    make_cache,
    payload,
    save_seq,
    state_item,
)

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.plan import SaveItem
from hybrid_connector.tiers.device import DeviceTier
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore, build_store
from hybrid_connector.tiers.memory import MemoryTier
from hybrid_connector.tiers.size_only import Budget, SizeOnlyStore

KVB = TINY.kv_bytes_per_token()
SB = TINY.state_bytes()


def disk_config(path: Path, kv: int, state: int, **over):
    return config(local_disk=str(path), pools={
        "device": {"kv": 0, "state": 0}, "host": {"kv": 0, "state": 0},
        "disk": {"kv": kv, "state": state}}, **over)


def seq(i: int, n: int = 24) -> np.ndarray:
    return np.arange(n, dtype=np.int64) + 1000 * i


# ------------------------------------------------------------------------- item 1
def test_item1_restart_over_a_full_nvme_tier_still_accepts_saves(tmp_path: Path) -> None:
    cfg = disk_config(tmp_path / "d", kv=4 * 24 * KVB, state=4 * SB)
    first = assemble.cache(cfg, TINY, build_store(cfg))
    for i in range(4):
        assert save_seq(first, seq(i), states=[24]).stored == 4
    first.close()
    again = assemble.cache(cfg, TINY, build_store(cfg))   # same directory, empty index
    for i in range(10, 14):
        r = save_seq(again, seq(i), states=[24])
        assert r.stored == 4 and r.rejected == 0
        again.check_integrity()
    assert again.lookup(np.r_[seq(13), [7]]).num_tokens == 24
    for k in (ObjectKind.KV, ObjectKind.STATE):
        assert again.store.used(k) <= again.store.capacity(k)
    again.close()


# ------------------------------------------------------------------------- item 2
def test_item2_corrupt_leased_state_is_reported_not_raised(tmp_path: Path) -> None:
    cfg = disk_config(tmp_path / "d", kv=10**5, state=10**5)
    c = assemble.cache(cfg, TINY, build_store(cfg))
    a = seq(0)
    save_seq(c, a, states=[24])
    plan = c.lookup(np.r_[a, [5]])
    assert plan.num_tokens == 24
    lease = c.acquire(plan)
    f = tmp_path / "d" / plan.state.ref.key.digest()
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0xFF                                  # one flipped payload byte
    f.write_bytes(bytes(raw))
    res = c.load(plan)                               # used to raise "state ... is locked"
    assert res.num_tokens == 0 and plan.state.ref in res.failed
    c.check_integrity()
    assert c.lookup(np.r_[a, [5]]).num_tokens == 0   # never promised again
    c.release(lease)
    c.check_integrity()
    assert c.lookup(np.r_[a, [5]]).num_tokens == 0
    save_seq(c, a, states=[24])                      # and it heals on the next save
    assert c.lookup(np.r_[a, [5]]).num_tokens == 24
    c.close()


# ------------------------------------------------------------------------- item 3
@pytest.mark.parametrize("order", [((0, 16), (8, 16)), ((8, 16), (0, 16))])
def test_item3_kv_chunks_with_the_same_end_leave_no_orphan(order) -> None:
    c = make_cache()
    a = seq(0, 20)
    for s, e in order:
        c.save(a, [SaveItem(ObjectKind.KV, s, e, payload(a, ObjectKind.KV, s, e))])
        assert c.store.used(ObjectKind.KV) == c.tree.bytes[ObjectKind.KV]
        c.check_integrity()
    c.save(a, [state_item(a, 16)])
    plan = c.lookup(a)
    assert plan.num_tokens == 16
    lease = c.acquire(plan)
    res = c.load(plan)
    assert all(made_for(t, a, o.ref.end) for o, t in zip(plan.kv, res.kv, strict=True))
    c.release(lease)


# ------------------------------------------------------------------------- item 4
def test_item4_a_rejected_save_leaves_the_index_unchanged() -> None:
    c = make_cache(state=SB)
    a = seq(0)
    save_seq(c, a, states=[24])
    before = (len(c.tree), c.tree.next_id)
    b = np.r_[a[:12], seq(5, 12)]                    # would split a's edge at 12
    r = c.save(b, [SaveItem(ObjectKind.STATE, 24, 24, payload(b, ObjectKind.STATE, 24, 24,
                                                               size=SB * 2))])
    assert r.stored == 0 and r.rejected == 1
    assert len(c.tree) == before[0]
    c.check_integrity()


def test_item4_eviction_goes_on_past_victims_that_free_nothing() -> None:
    c = make_cache(kv=3 * 24 * KVB, state=10 * SB)
    for i in range(3):
        save_seq(c, seq(i), states=[24])
    # token-only leaves (a save that stores nothing): never victims that stop eviction
    for i in range(3, 6):
        c.save(seq(i), [state_item(seq(i), 24)])     # a state with no KV: KV pool untouched
    for i in range(6, 12):
        r = save_seq(c, seq(i), states=[24])
        assert r.rejected == 0, f"request {i}: {r}"
        c.check_integrity()


# ------------------------------------------------------------------------- item 5
def test_item5_pooled_budget_accounts_the_whole_batch() -> None:
    a_kv, b_kv = 24 * KVB, 24 * KVB
    store = SizeOnlyStore(Budget.pooled(a_kv + b_kv + SB + SB // 2))
    c = assemble.cache(config(), TINY, store)
    assert save_seq(c, seq(0), states=[24]).rejected == 0
    r = save_seq(c, seq(1), states=[24])             # needs a's state evicted for room
    assert r.rejected == 0 and r.stored == 4
    assert c.lookup(np.r_[seq(1), [3]]).num_tokens == 24


# ------------------------------------------------------------------------- item 6
def test_item6_replay_needs_whole_pages_covering_the_window() -> None:
    c = make_cache(replay=True, anchor_page_size=8)
    a = seq(0, 20)
    save_seq(c, a, states=[])
    bad = SaveItem(ObjectKind.ANCHOR, 0, 4, payload(a, ObjectKind.ANCHOR, 0, 4))
    r = c.save(a, [bad, SaveItem(ObjectKind.ANCHOR, 14, 16, payload(a, ObjectKind.ANCHOR, 14, 16))])
    assert r.stored == 0 and r.rejected == 2         # not pages of the configured size
    plan = c.lookup(a)
    assert not plan.hit, plan
    size = c.expected_nbytes(ObjectKind.ANCHOR, 0, 8)
    c.save(a, [SaveItem(ObjectKind.ANCHOR, 0, 8, payload(a, ObjectKind.ANCHOR, 0, 8, size=size))])
    plan = c.lookup(a)
    assert plan.num_tokens == 8 and not plan.exact
    assert [(o.ref.start, o.ref.end) for o in plan.anchors] == [(0, 8)]
    c.check_integrity()


# ------------------------------------------------------------------------- item 7
def test_item7_two_caches_share_one_tiered_store() -> None:
    kv, st = 2 * 24 * KVB, 2 * SB
    store = TieredStore([DeviceTier({ObjectKind.KV: kv, ObjectKind.STATE: st}, device="cpu"),
                         HostTier({ObjectKind.KV: 10 * kv, ObjectKind.STATE: 10 * st})])
    a = assemble.cache(config(), TINY, store, model_id="a")
    b = assemble.cache(config(), TINY, store, model_id="b")
    save_seq(a, seq(0), states=[24])
    for i in range(1, 4):
        save_seq(b, seq(i), states=[24])             # pushes a's objects down to host
    plan = a.lookup(np.r_[seq(0), [1]])
    assert plan.num_tokens == 24                     # demoted, not dropped
    lease = a.acquire(plan)
    res = a.load(plan)
    assert res.num_tokens == 24 and not res.failed
    a.release(lease)
    for cache in (a, b):
        cache.check_integrity()
        refs = [r for n in cache.tree.nodes() for r in (*n.kv.values(), *([n.state] if n.state else []))]
        assert all(w is not None for w in store.where([r.key for r in refs]))


# ------------------------------------------------------------------------- item 8
def test_item8_no_eviction_for_an_object_no_tier_can_hold() -> None:
    per_tier = 2 * CHUNK * KVB
    store = TieredStore([DeviceTier({ObjectKind.KV: per_tier, ObjectKind.STATE: 10 * SB}, device="cpu"),
                         HostTier({ObjectKind.KV: per_tier, ObjectKind.STATE: 10 * SB})])
    c = make_cache(store=store, chunk_size=24)
    a = seq(0, 16)
    save_seq(c, a, states=[16])
    used = store.used(ObjectKind.KV)
    big = seq(1, 24)                                 # one 24-token chunk: 1.5x a tier
    r = c.save(big, [SaveItem(ObjectKind.KV, 0, 24, payload(big, ObjectKind.KV, 0, 24)),
                     state_item(big, 24)])
    assert r.rejections[0].reason == "too_large"
    assert r.evicted_bytes == 0 and store.used(ObjectKind.KV) == used
    assert c.lookup(np.r_[a, [1]]).num_tokens == 16


# ------------------------------------------------------------------------- item 9
def test_item9_a_silently_lost_object_heals_on_the_next_save() -> None:
    c = make_cache()
    a = seq(0)
    save_seq(c, a, states=[24])
    plan = c.lookup(np.r_[a, [1]])
    c.store.remove([plan.state.ref.key])             # lost without a drop report
    lease = c.acquire(plan)
    res = c.load(plan)
    c.release(lease)
    assert res.num_tokens == 0 and res.failed
    r = save_seq(c, a, states=[24])
    assert r.stored >= 1 and r.present == 0          # stored again, not "present"
    assert c.lookup(np.r_[a, [1]]).num_tokens == 24
    c.check_integrity()


def test_item9_a_lost_object_found_by_lookup_heals_too() -> None:
    c = make_cache()
    a = seq(0)
    save_seq(c, a, states=[24])
    key = c.lookup(np.r_[a, [1]]).state.ref.key
    c.store.remove([key])                            # a restarted remote: nothing reported
    assert not c.lookup(np.r_[a, [1]]).hit           # never promised (the store says absent)
    r = save_seq(c, a, states=[24])                  # the engine recomputed and saves again
    assert r.stored == 1 and r.present == 3
    assert c.lookup(np.r_[a, [1]]).num_tokens == 24
    c.check_integrity()


# ------------------------------------------------------------------------ item 10
def test_item10_finish_of_an_empty_request_with_the_tuner_running() -> None:
    c = make_cache(kv=2 * 24 * KVB, state=2 * SB, alpha="auto")
    for i in range(4):                               # evictions start the alpha tuner
        c.finish(seq(i), kv_items(seq(i), 0, 24) + [state_item(seq(i), 24)], prompt_len=20)
    r = c.finish(np.zeros(0, dtype=np.int64), [])
    assert r.stored == 0
    c.close()


# ------------------------------------------------------------------------ item 11
def test_item11_payload_sizes_are_checked_against_the_geometry() -> None:
    c = make_cache()
    a = seq(0)
    r = c.save(a, [SaveItem(ObjectKind.STATE, 24, 24, torch.ones(1, dtype=torch.uint8)),
                   SaveItem(ObjectKind.KV, 0, 8, torch.ones(3, dtype=torch.uint8))])
    assert r.stored == 0 and r.rejected == 2
    assert len(c.tree) == 0 and c.store.used(ObjectKind.KV) == 0


def test_item11_a_short_read_is_a_failed_load() -> None:
    class HalfTier(MemoryTier):
        """Returns half of every state (a store that lost the rest)."""

        def get(self, keys, device=None):
            return [t[: t.numel() // 2] if t is not None and k.kind is ObjectKind.STATE else t
                    for k, t in zip(keys, super().get(keys, device), strict=True)]

    c = make_cache(store=TieredStore([HalfTier("half", {k: 10**6 for k in ObjectKind})]))
    a = seq(0)
    save_seq(c, a, states=[24])
    plan = c.lookup(np.r_[a, [1]])
    lease = c.acquire(plan)
    res = c.load(plan)
    c.release(lease)
    assert res.num_tokens == 0 and plan.state.ref in res.failed and res.state is None


# ------------------------------------------------------------------------ item 12
def test_item12_api_edges_are_rejected() -> None:
    c = make_cache()
    a = seq(0, 40)
    save_seq(c, a, states=[12, 24])
    with pytest.raises(ValueError, match="align"):
        c.lookup_at(a, 7)
    with pytest.raises(ValueError, match="alignment"):
        c.plan_saves(a, alignment=-4)
    with pytest.raises(ValueError, match="alignment"):
        c.lookup(a, alignment=-4)
    with pytest.raises(ValueError, match="integer"):
        c.lookup(a.astype(np.float64) + 0.9)
    with pytest.raises(ValueError, match="integer"):
        c.lookup([1.5, 2.0])
    plan = c.lookup(a)
    one, two = c.acquire(plan), c.acquire(plan)
    c.release(one)
    with pytest.raises(ValueError, match="released"):
        c.release(one)
    node = c.tree.node(plan.node_id)
    assert node.state_lock == 1                      # the other lease keeps its locks
    c.release(two)
    c.check_integrity()


# ------------------------------------------------------------------------ item 13
def test_item13_a_failed_chunk_shortens_an_attention_only_hit() -> None:
    c = make_cache(geo=TINY_ATTN)
    a = seq(0, 40)
    save_seq(c, a, states=[])
    plan = c.lookup(a)
    assert plan.num_tokens == 36
    c.store.remove([plan.kv[2].ref.key])             # chunk [16, 24) is lost
    lease = c.acquire(plan)
    res = c.load(plan)
    c.release(lease)
    assert res.num_tokens == 16 and len(res.kv) == 2
    assert [r.start for r in res.failed] == [16]


def test_item13_a_hybrid_hit_is_all_or_nothing() -> None:
    c = make_cache()
    a = seq(0, 40)
    save_seq(c, a, states=[24])
    plan = c.lookup(a)
    c.store.remove([plan.kv[2].ref.key])
    lease = c.acquire(plan)
    res = c.load(plan)
    c.release(lease)
    assert res.num_tokens == 0 and res.state is None
    assert len(res.kv) == 2 and res.kv_tokens == 16  # the KV that did load, for engines

