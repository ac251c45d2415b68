"""One budget for KV and states (``pools.<tier>.kv_state``): the ledger's accounting under a
shared pool (each kind grows into what the other leaves, never above the budget, ``check``
holds after every step), victims across kinds, budget groups over tiers that group kinds
differently, and the slab tiers holding exactly what the ledger allows."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.backend import spec_of
from hybrid_connector.tiers.configured import build_tiers, tier_specs
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.ledger.ledger import Ledger, TierSpec
from hybrid_connector.tiers.ledger.records import pool_groups
from hybrid_connector.tiers.ops import Move, Put, Remove

K = ObjectKind
JOINT = (K.KV, K.STATE)


def key(i: int, kind: ObjectKind = K.KV) -> ObjectKey:
    return ObjectKey("fp", i.to_bytes(16, "little"), kind, 0, 8 if kind is not K.STATE else 0)


def ready(led: Ledger, k: ObjectKey, n: int = 10) -> str | None:
    pl = led.place(k, n)
    for op in pl.ops:
        if isinstance(op, Put):
            led.commit(k, True, shared=op.tier == led.shared_tier)
    return pl.tier


def pooled(total: int = 100, anchor: int = 0, name: str = "host", **kw: object) -> TierSpec:
    return TierSpec.per_kind(name, {K.KV: total, K.STATE: total, K.ANCHOR: anchor},
                             joint=JOINT, **kw)  # type: ignore[arg-type]


def test_per_kind_with_joint_builds_one_pool() -> None:
    s = pooled(100, 20, grains={K.KV: 4, K.STATE: 4, K.ANCHOR: 2})
    assert dict(s.pools) == {"kv_state": 100, "anchor": 20}
    assert s.kind_pool[K.KV] == s.kind_pool[K.STATE] == "kv_state"
    assert s.budget(K.KV) == s.budget(K.STATE) == 100 and s.grain(K.STATE) == 4
    with pytest.raises(ValueError, match="one budget"):
        TierSpec.per_kind("host", {K.KV: 100, K.STATE: 50}, joint=JOINT)


def test_kv_grows_into_room_states_do_not_use_and_back() -> None:
    led = Ledger([pooled(100)])
    for i in range(9):  # 90 B of KV: more than any fixed split short of 90:10 allows
        assert ready(led, key(i)) == "host"
    assert led.used(K.KV) == 90 and led.fits({K.STATE: 10}) and not led.fits({K.STATE: 11})
    assert ready(led, key(100, K.STATE)) == "host"
    assert not led.fits({K.KV: 1}) and not led.fits({K.STATE: 1})
    led.check()
    for i in range(9):  # the KV leaves; states take its room
        led.remove(key(i))
    for i in range(101, 110):
        assert ready(led, key(i, K.STATE)) == "host"
    assert led.used(K.STATE) == 100 and led.used(K.KV) == 0
    led.check()


def test_eviction_picks_the_oldest_across_kinds() -> None:
    led = Ledger([pooled(30)])
    ready(led, key(0, K.STATE))
    ready(led, key(1))
    ready(led, key(2, K.STATE))
    led.touch([key(0, K.STATE)])  # now key(1), a KV chunk, is the oldest
    pl = led.place(key(3, K.STATE), 10)
    assert pl.dropped == (key(1),) and pl.ops[0] == Remove(key(1), "host")
    assert led.room_kinds(K.STATE) == (K.STATE, K.KV) and led.room_kinds(K.KV) == (K.KV, K.STATE)
    led.check()


def test_host_pool_above_per_kind_disk_pools() -> None:
    host = pooled(30)
    disk = TierSpec.per_kind("disk", {K.KV: 20, K.STATE: 10}, slow=True)
    led = Ledger([host, disk])
    assert pool_groups(led.specs)[K.KV] == pool_groups(led.specs)[K.STATE] == "kv_state"
    assert led.fits({K.KV: 60}) and not led.fits({K.KV: 61})  # 30 + 20 + 10, one group
    for i in range(3):
        ready(led, key(i, K.STATE))
    pl = led.place(key(3), 10)  # the host's oldest, a state, goes down to the disk's state pool
    assert pl.ops[0] == Move(key(0, K.STATE), "host", "disk") and not pl.dropped
    led.check()


def test_random_traffic_never_exceeds_the_shared_budget() -> None:
    rng = random.Random(7)
    led = Ledger([pooled(500, grains={K.KV: 8, K.STATE: 8}),
                  TierSpec.per_kind("disk", {K.KV: 300, K.STATE: 200}, slow=True)])
    live: list[ObjectKey] = []
    for i in range(3000):
        r = rng.random()
        if r < 0.7 or not live:
            k = key(i, K.KV if rng.random() < (0.8 if i < 1500 else 0.2) else K.STATE)
            ready(led, k, rng.randint(1, 60))
            if led.knows(k):
                live.append(k)
        elif r < 0.85:
            led.remove(live.pop(rng.randrange(len(live))))
        else:
            led.touch([rng.choice(live)])
        live = [k for k in live if led.knows(k)]
        with led.lock:
            host = led._local[0]
            assert host.used.get("kv_state", 0) <= 500
        led.check()
    assert led.used(K.KV) + led.used(K.STATE) <= 1000  # host 500 + disk 300 + 200


def test_slab_tier_holds_what_the_ledger_allows() -> None:
    tier = HostTier({K.KV: 4096, K.STATE: 4096, K.ANCHOR: 1024}, pin_memory=False, joint=JOINT)
    assert tier._slab.numel() == 4096 + 1024  # one pool for both kinds, not two
    spec = spec_of(tier)
    assert dict(spec.pools) == {"kv_state": 4096, "anchor": 1024}
    kv = [(key(i), torch.full((512,), i, dtype=torch.uint8)) for i in range(7)]
    assert all(tier.put(kv))
    assert tier.fits(K.STATE, 512) and not tier.fits(K.STATE, 513)
    assert tier.put([(key(9, K.STATE), torch.ones(600, dtype=torch.uint8))]) == [False]
    assert tier.put([(key(9, K.STATE), torch.ones(512, dtype=torch.uint8))]) == [True]
    tier.remove([k for k, _ in kv])
    assert all(tier.put([(key(10 + i, K.STATE), torch.ones(512, dtype=torch.uint8))
                         for i in range(7)]))
    got = tier.get([key(9, K.STATE)])[0]
    assert got is not None and bool((got == 1).all())
    tier.close()


def test_config_kv_state_reaches_the_tiers_and_the_ledger_view() -> None:
    cfg = load_config(overrides={"max_local_cpu_size": "1MiB",
                                 "pools": {"host": {"kv_state": "900KiB", "anchor": "100KiB"}}},
                      environ={})
    tiers = build_tiers(cfg)
    try:
        assert [spec_of(t) for t in tiers] == tier_specs(cfg)
        assert dict(tier_specs(cfg)[0].pools) == {"kv_state": 900 << 10, "anchor": 100 << 10}
    finally:
        for t in tiers:
            t.close()


def test_a_shared_budget_counts_once_in_a_stores_totals() -> None:
    """Regression: per-tier stats listed the ``kv_state`` budget under KV and under states,
    so totals summed from them (the server's "X of Y used", ``inspect --server``) showed
    twice the configured bytes. The totals count each pool once; the per-kind figures
    still give each kind's room (the shared budget) and the pools say which is shared."""
    from hybrid_connector.cli.inspect_cmd import server_report
    from hybrid_connector.tiers.manager import build_store

    cfg = load_config(overrides={"max_local_cpu_size": "1MiB",
                                 "pools": {"host": {"kv_state": "924KiB", "anchor": "100KiB"}}},
                      environ={})
    store = build_store(cfg)
    try:
        host = store.stats()["tiers"]["host"]
        report = server_report({
            "server": {"uptime_s": 1.0, "sessions": 0, "connections": 0, "leases": 0},
            "tiers": {"host": dataclasses.asdict(host)}, "models": {}, "plain": {"held": {}}})
        assert "0 B of 1.00 MiB used" in report, report  # was 1.90 MiB: kv_state twice
        assert "kv and state share 924.00 KiB" in report, report
        assert store.total_capacity() == 1 << 20
        assert host.pools == {"kv_state": 924 << 10, "anchor": 100 << 10}
        assert host.capacity == {"kv": 924 << 10, "state": 924 << 10, "anchor": 100 << 10}
        assert store.capacity(K.KV) == store.capacity(K.STATE) == 924 << 10
    finally:
        store.close()
