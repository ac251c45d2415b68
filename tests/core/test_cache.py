import numpy as np
import pytest
import torch
from cache_support import (
    CHUNK,
    TINY,
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
from hybrid_connector.tiers.memory import MemoryStore

GEO = TINY
KVB = TINY.kv_bytes_per_token()
SB = TINY.state_bytes()


def test_hit_rule_examples():
    c = make_cache()
    seq = np.arange(40)
    save_seq(c, seq, states=[12, 21, 40])
    assert c.lookup(np.arange(100)).num_tokens == 40
    assert c.lookup(seq).num_tokens == 12          # 40 is the whole prompt, 21 unaligned
    assert c.lookup(seq[:13]).num_tokens == 12
    assert c.lookup(seq[:12]).num_tokens == 0      # never the full prompt
    assert c.lookup(np.r_[seq[:30], [999] * 5]).num_tokens == 12
    assert c.lookup([5, 6, 7]).num_tokens == 0
    # KV missing in the middle: no hit beyond the gap, even with a deeper state
    c2 = make_cache()
    save_seq(c2, seq, states=[12, 40])
    key = [o for o in c2.lookup(np.arange(100)).kv if o.ref.start == 8][0].ref.key
    c2.store.remove([key])
    c2.store.report_dropped([key])
    assert c2.lookup(np.arange(100)).num_tokens == 0
    c2.check_integrity()


def test_lookup_has_no_side_effects():
    c = make_cache()
    save_seq(c, np.arange(40), states=[16, 40])
    before = (len(c.tree), dict(c.tree.bytes), c.stats.lookups, c.tree.num_states)
    for q in (np.arange(50), np.r_[np.arange(20), [7, 7]], [1, 2, 3]):
        c.lookup(q)
        c.plan_saves(q)
    assert before == (len(c.tree), dict(c.tree.bytes), c.stats.lookups, c.tree.num_states)


def test_plan_saves_speculative_branch_point():
    c = make_cache()
    save_seq(c, np.arange(40), states=[40])
    sp = c.plan_saves(np.r_[np.arange(22), [500, 501, 502]])
    assert sp.branch_point == 22 and sp.state_positions == (20,)
    assert sp.kv_from == 16
    assert c.plan_saves(np.arange(60)).state_positions == ()


def test_a_pass_through_boundary_from_chunked_saves_is_a_branch_point():
    """A prefix saved in two saves has a node boundary at the first save's end; a prompt
    diverging exactly there branches as if the prefix had been saved at once."""
    c = make_cache()
    a = np.arange(40)
    c.save(a[:16], kv_items(a, 0, 16))                # prefill: the first chunks
    c.save(a, kv_items(a, 16, 40) + [state_item(a, 40)])  # finish: the rest
    b = np.r_[a[:16], [99, 98, 97, 96, 95]]
    assert c.plan_saves(b).state_positions == (16,)
    once = make_cache()
    once.save(a, kv_items(a, 0, 40) + [state_item(a, 40)])
    assert once.plan_saves(b).state_positions == (16,)
    assert c.plan_saves(np.r_[a, [1, 2]]).state_positions == ()  # a continuation: no branch


def test_load_roundtrip_and_locked_objects_survive_eviction():
    c = make_cache(state=2 * SB)  # room for two checkpoints
    a = np.arange(40)
    save_seq(c, a, states=[40])
    plan = c.lookup(np.arange(50))
    lease = c.acquire(plan)
    res = c.load(plan)
    assert res.num_tokens == 40 and torch.equal(res.state, payload(a, ObjectKind.STATE, 40, 40))
    for other in range(3):
        save_seq(c, np.arange(100, 140) + 100 * other, states=[40])
    assert c.lookup(np.arange(50)).num_tokens == 40  # pinned by the lease
    c.release(lease)
    save_seq(c, np.arange(1000, 1040), states=[40])
    c.check_integrity()
    assert c.store.used(ObjectKind.STATE) <= 2 * SB


def test_stale_plan_is_refused():
    c = make_cache(state=SB)
    save_seq(c, np.arange(40), states=[40])
    plan = c.lookup(np.arange(50))
    save_seq(c, np.arange(100, 140), states=[40])  # evicts the only checkpoint
    assert c.acquire(plan) is None
    assert c.lookup(np.arange(50)).num_tokens == 0


def test_save_rejects_out_of_range_and_bad_items():
    c = make_cache()
    r = c.save(np.arange(10), [SaveItem(ObjectKind.STATE, 20, 20, torch.ones(SB // 4))])
    assert r.rejected == 1 and r.stored == 0
    with pytest.raises(ValueError):
        SaveItem(ObjectKind.STATE, 3, 4, torch.ones(2))
    with pytest.raises(ValueError):
        SaveItem(ObjectKind.KV, 4, 4, torch.ones(2))
    with pytest.raises(ValueError):
        SaveItem(ObjectKind.KV, 0, 4, torch.ones(0))


def test_finish_releases_dead_kv():
    c = make_cache(admission="last_token")
    seq = np.arange(30)
    c.finish(seq, [SaveItem(ObjectKind.KV, 0, 8, payload(seq, ObjectKind.KV, 0, 8))])
    assert len(c.tree) == 0 and c.store.used(ObjectKind.KV) == 0
    c.check_integrity()


def test_lookup_at_exact_position_only():
    c = make_cache()
    seq = np.arange(40)
    save_seq(c, seq, states=[12, 24])
    q = np.arange(60)
    assert c.lookup_at(q, 12).num_tokens == 12
    assert c.lookup_at(q, 24).state.ref.end == 24
    assert c.lookup_at(q, 16).num_tokens == 0  # KV there, but no state at exactly 16
    assert c.lookup_at(seq[:24], 24).num_tokens == 0  # never the whole prompt


def test_fingerprint_separates_models_and_layouts():
    a = make_cache()
    store = a.store
    b = assemble.cache(a.config, GEO, store, model_id="other/weights")
    c = assemble.cache(a.config, GEO, store, layout={"block_size": 32})
    assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
    save_seq(a, np.arange(40), states=[40])
    assert a.lookup(np.arange(50)).num_tokens == 40 and b.lookup(np.arange(50)).num_tokens == 0


def test_load_async_and_pins_follow_the_lease():
    store = MemoryStore({ObjectKind.KV: 10**6, ObjectKind.STATE: 10**6, ObjectKind.ANCHOR: 0})
    c = assemble.cache(make_cache().config, GEO, store)

    def pins():
        return sum(e.pins for e in store.ledger.entries.values())

    seq = np.arange(40)
    save_seq(c, seq, states=[40])
    plan = c.lookup(np.arange(45))
    lease = c.acquire(plan)
    assert pins() == len(plan.objects) == 6          # pinned in the ledger: never moved
    res = c.load_async(plan).result(timeout=10)
    assert res.num_tokens == 40 and torch.equal(res.state, payload(seq, ObjectKind.STATE, 40, 40))
    c.release(lease)
    assert pins() == 0
    c.close()


def test_kv_chunk_past_a_branch_point_still_serves_the_shared_part():
    c = make_cache()
    a = np.arange(40)
    save_seq(c, a, states=[40])                      # chunks [0,8) ... [32,40)
    b = np.r_[a[:20], 100 + np.arange(20)]           # branches at 20, inside chunk [16,24)
    save_seq(c, b, states=[20], kv_upto=16)          # B only adds its checkpoint at 20
    q = np.r_[a[:20], [7, 7, 7]]                     # a third branch at exactly 20
    plan = c.lookup(q)
    assert plan.num_tokens == 20 and plan.kv[-1].ref.end == 24
    lease = c.acquire(plan)
    assert made_for(c.load(plan).kv[-1], q, 20)
    c.release(lease)
    c.check_integrity()


def test_finish_keeps_the_tail_chunk_an_aligned_final_checkpoint_needs():
    c = make_cache()
    full = np.arange(30)                       # final checkpoint at 28 (alignment 4)
    end = c.final_checkpoint(len(full))
    items = [SaveItem(ObjectKind.KV, s, min(s + CHUNK, 30), payload(full, ObjectKind.KV, s, min(s + CHUNK, 30)))
             for s in range(0, 30, CHUNK)]     # last chunk [24, 30) runs across 28
    items.append(SaveItem(ObjectKind.STATE, end, end, payload(full, ObjectKind.STATE, end, end)))
    c.finish(full, items, prompt_len=20)
    plan = c.lookup(np.r_[full, [9, 9]])
    assert end == 28 and plan.num_tokens == 28 and plan.kv[-1].ref.end == 30
    c.check_integrity()
    # a dead tail with no checkpoint above its chunks is still released
    c2 = make_cache()
    c2.finish(full, items[:-1], prompt_len=20)
    assert len(c2.tree) == 0


def test_one_batched_put_survives_demotion_within_the_batch():
    from hybrid_connector.tiers.device import DeviceTier
    from hybrid_connector.tiers.host import HostTier
    from hybrid_connector.tiers.manager import TieredStore

    small = {ObjectKind.KV: 3 * CHUNK * KVB, ObjectKind.STATE: SB, ObjectKind.ANCHOR: 0}
    big = {ObjectKind.KV: 100 * CHUNK * KVB, ObjectKind.STATE: 100 * SB, ObjectKind.ANCHOR: 0}
    store = TieredStore([DeviceTier(small, device="cpu"), HostTier(big)])
    c = assemble.cache(make_cache().config, GEO, store)
    seq = np.arange(80)
    r = save_seq(c, seq, states=[40, 80])      # 10 chunks + 2 states in one put: most demoted
    assert r.stored == 12 and r.rejected == 0
    plan = c.lookup(np.arange(90))
    assert plan.num_tokens == 80 and {o.tier for o in plan.objects} >= {"host"}
    lease = c.acquire(plan)
    res = c.load(plan)
    assert res.num_tokens == 80 and torch.equal(res.state, payload(seq, ObjectKind.STATE, 80, 80))
    c.release(lease)
    c.check_integrity()
    c.close()
