"""TieredStore: budgets, demotion/drop reporting, promotion, pins, per-kind isolation, async
loads, and the config factory — against real device/host/NVMe tiers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.device import DeviceTier
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore, build_store
from hybrid_connector.tiers.nvme import NvmeTier

K = ObjectKind


def three_tiers(tmp: Path, dev: int = 1024, host: int = 2048, disk: int = 4096,
                fsync: bool = False) -> TieredStore:
    b = lambda n: {K.KV: n, K.STATE: n // 2, K.ANCHOR: n // 4}  # noqa: E731
    return TieredStore([DeviceTier(b(dev)), HostTier(b(host)),
                        NvmeTier(tmp / "disk", b(disk), fsync=fsync)])


def check_budgets(m: TieredStore) -> None:
    for t in m.tiers:
        for k in K:
            assert 0 <= t.used(k) <= t.capacity(k), (t.name, k)


def test_put_goes_top_and_demotes_lru_down(tmp_path: Path) -> None:
    m = three_tiers(tmp_path)
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    keys = [make_key(i) for i in range(16)]
    vals = [make_payload(i, (64,)) for i in range(16)]  # 256 B: device 4, host 8, nvme 16
    assert all(m.put(list(zip(keys, vals, strict=True))))
    where = m.where(keys)
    assert where == ["nvme"] * 4 + ["host"] * 8 + ["device"] * 4  # newest on top
    assert dropped == [] and m.used(K.KV) == 16 * 256
    check_budgets(m)
    # overflow the bottom: the LRU objects are dropped and reported, never silently
    more = [(make_key(100 + i), make_payload(100 + i, (64,))) for i in range(16)]
    assert all(m.put(more))
    assert dropped == keys[:4]  # capacity 28 objects, 32 put: the 4 oldest go
    assert m.used(K.KV) == 28 * 256
    assert set(dropped) <= set(keys) | {k for k, _ in more}
    assert all(w is None for w in m.where(dropped))
    check_budgets(m)
    m.close()


def test_hit_in_lower_tier_is_promoted_bit_identical(tmp_path: Path) -> None:
    m = three_tiers(tmp_path)
    keys = [make_key(i) for i in range(10)]
    vals = [make_payload(i, (64,), torch.bfloat16) for i in range(10)]  # 128 B
    m.put(list(zip(keys, vals, strict=True)))
    assert m.where([keys[0]]) == ["host"] or m.where([keys[0]]) == ["nvme"]
    assert same_bits(m.get([keys[0]])[0], vals[0])
    assert m.where([keys[0]]) == ["device"]
    for k, v in zip(keys, vals, strict=True):  # every tier reads back bit-identically
        assert same_bits(m.get([k])[0], v)
    assert m.stats()["promotions"]["kv"] >= 1
    m.close()


def test_demotion_filter_false_drops_and_reports(tmp_path: Path) -> None:
    m = three_tiers(tmp_path)
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    m.set_demotion_filter(lambda key: key.prefix[0] % 2 == 0)  # only even keys merit
    keys = [make_key(i) for i in range(8)]
    m.put([(k, make_payload(i, (64,))) for i, k in enumerate(keys)])  # device holds 4
    assert sorted(k.prefix[0] for k in dropped) == [1, 3]
    assert m.where([keys[0], keys[2]]) == ["host", "host"]
    m.close()


def test_pinned_objects_are_never_moved(tmp_path: Path) -> None:
    m = three_tiers(tmp_path)
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    first = [make_key(i) for i in range(4)]
    m.put([(k, make_payload(i, (64,))) for i, k in enumerate(first)])
    assert m.pin(first + [make_key(999)]) == [True] * 4 + [False]
    # the device pool is all pinned: new objects go below instead of evicting them
    others = [(make_key(10 + i), make_payload(10 + i, (64,))) for i in range(30)]
    m.put(others)
    assert m.where(first) == ["device"] * 4 and not set(first) & set(dropped)
    m.unpin(first)
    m.put([(make_key(500), make_payload(500, (64,)))])
    assert "device" in m.where([make_key(500)])
    check_budgets(m)
    m.close()


def test_anchor_pressure_never_evicts_kv(tmp_path: Path) -> None:
    m = three_tiers(tmp_path)
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    kv = [(make_key(i, K.KV), make_payload(i, (32,))) for i in range(6)]
    st_ = [(make_key(i, K.STATE), make_payload(50 + i, (32,))) for i in range(3)]
    assert all(m.put(kv + st_))
    before = m.where([k for k, _ in kv + st_])
    anchors = [(make_key(i, K.ANCHOR), make_payload(200 + i, (32,))) for i in range(200)]
    m.put(anchors)
    assert dropped and all(k.kind is K.ANCHOR for k in dropped)
    assert m.where([k for k, _ in kv + st_]) == before
    for k, v in kv + st_:
        assert same_bits(m.get([k])[0], v)
    check_budgets(m)
    m.close()


def test_a_pinned_hit_is_read_where_it_is_and_promoted_once_unpinned(tmp_path: Path) -> None:
    """The cache pins a lease's objects before loading them: a pinned object is never moved
    (it is read from its tier), and a read after the last unpin promotes it."""
    m = three_tiers(tmp_path)
    items = [(make_key(i), make_payload(i, (64,))) for i in range(16)]  # 256 B each
    m.put(items)
    k, v = items[0]
    assert m.where([k]) == ["nvme"]
    assert m.pin([k, k]) == [True, True]
    assert same_bits(m.get([k])[0], v)
    assert m.where([k]) == ["nvme"]                  # pinned: not moved
    m.put([(make_key(100 + i), make_payload(100 + i, (64,))) for i in range(40)])
    assert m.where([k]) == ["nvme"]                  # nor dropped by a flood of new objects
    m.unpin([k])
    m.unpin([k])
    assert same_bits(m.get([k])[0], v)
    assert m.where([k]) == ["device"]                # promoted once unpinned
    assert not (tmp_path / "disk" / k.digest()).exists()  # the old copy was released
    m.close()


def test_anchors_die_with_their_kv(tmp_path: Path) -> None:
    m = TieredStore([HostTier({K.KV: 1024, K.ANCHOR: 4096})])
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    # anchor pages i*10 .. i*10+2 ride on KV chunk i (the index's knowledge)
    m.set_companions(lambda kv: [make_key(kv.prefix[0] * 10 + j, K.ANCHOR) for j in range(3)])
    kv = [(make_key(i), make_payload(i, (64,))) for i in range(4)]  # 256 B: the pool is full
    anchors = [(make_key(i * 10 + j, K.ANCHOR), make_payload(100 + i * 10 + j, (16,)))
               for i in range(5) for j in range(3)]
    assert all(m.put(kv + anchors))
    m.pin([make_key(11, K.ANCHOR)])  # being loaded: survives
    assert m.put([(make_key(9), make_payload(9, (64,)))]) == [True]  # evicts KV 0
    assert set(dropped) == {make_key(0)} | {make_key(j, K.ANCHOR) for j in range(3)}
    dropped.clear()
    assert m.put([(make_key(8), make_payload(8, (64,)))]) == [True]  # evicts KV 1
    assert set(dropped) == {make_key(1), make_key(10, K.ANCHOR), make_key(12, K.ANCHOR)}
    assert m.where([make_key(11, K.ANCHOR), make_key(20, K.ANCHOR)]) == ["host", "host"]
    m.close()


def test_async_loads_per_object(tmp_path: Path) -> None:
    m = three_tiers(tmp_path)
    items = [(make_key(i), make_payload(i, (64,), torch.float16)) for i in range(14)]
    m.put(items)
    missing = make_key(777)
    h = m.get_async([k for k, _ in items] + [missing])
    for i, (_, v) in enumerate(items):
        assert same_bits(h.wait(i, timeout=30), v)
    assert h.wait(len(items), timeout=30) is None
    assert h.done()
    outs = [torch.empty_like(v) for _, v in items]
    h2 = m.get_into_async([k for k, _ in items], outs)
    for i, (_, v) in enumerate(items):
        got = h2.wait(i, timeout=30)
        assert got is outs[i] and same_bits(got, v)
    with pytest.raises(IndexError):
        h2.wait(99)
    m.close()


def test_build_store_from_config(tmp_path: Path) -> None:
    cfg = load_config(overrides={
        "local_disk": f"file://{tmp_path}/disk", "max_local_disk_size": 0.001,
        "max_local_cpu_size": 0.0001, "device_size": "64KiB",
        "extra_config": {"disk_zstd": ["state"]},
    }, environ={})
    s = build_store(cfg)
    assert isinstance(s, TieredStore)
    assert [t.name for t in s.tiers] == ["device", "host", "nvme"]
    cap = s.capacity(K.KV)
    assert cap == sum(cfg.budget(t).kinds()["kv"] for t in ("device", "host", "disk"))
    k, v = make_key(1, K.STATE), make_payload(1, (128,), torch.bfloat16)
    assert s.put([(k, v)]) == [True] and same_bits(s.get([k])[0], v)
    s.close()
    with pytest.raises(ValueError, match="disk_zstd"):
        build_store(load_config(overrides={
            "local_disk": str(tmp_path / "d2"), "max_local_disk_size": 0.001,
            "extra_config": {"disk_zstd": ["bogus"]}}, environ={}))


# ---------------------------------------------------------------- property test
OPS = st.lists(st.tuples(st.sampled_from(["put", "put", "put", "get", "remove", "pin", "unpin"]),
                         st.integers(0, 24), st.sampled_from(list(K)), st.integers(1, 96)),
               min_size=1, max_size=60)


@settings(max_examples=int(os.environ.get("HC_TIER_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, merit_mod=st.integers(1, 3))
def test_random_sequences_keep_every_invariant(tmp_path_factory: pytest.TempPathFactory,
                                               ops: list[tuple[str, int, ObjectKind, int]],
                                               merit_mod: int) -> None:
    m = three_tiers(tmp_path_factory.mktemp("prop"), dev=512, host=1024, disk=2048)
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    m.set_demotion_filter(lambda key: key.prefix[0] % merit_mod == 0)
    alive: dict[ObjectKey, torch.Tensor] = {}
    pins: dict[ObjectKey, int] = {}
    pinned_where: dict[ObjectKey, str | None] = {}
    try:
        for op, i, kind, n in ops:
            key = make_key(i, kind)
            if op == "put":
                v = make_payload(i * 1000 + n, (n,), torch.bfloat16)
                ok = m.put([(key, v)])[0]
                if ok:
                    alive[key] = v
                    if pins.get(key):  # a re-put replaced a pinned object: pins move on
                        pinned_where[key] = m.where([key])[0]
            elif op == "get":
                got = m.get([key])[0]
                if key in alive:
                    assert got is None or same_bits(got, alive[key])
                    if pins.get(key):
                        assert got is not None, "a pinned object could not be read"
                        # a hit may promote a pinned object (its pins move with it), never down
                        now = m.where([key])[0]
                        order = [t.name for t in m.tiers]
                        assert now is not None and order.index(now) <= order.index(pinned_where[key] or now)
                        pinned_where[key] = now
                else:
                    assert got is None
            elif op == "remove":
                m.remove([key])
                alive.pop(key, None)
            elif op == "pin" and key in alive and not pins.get(key):
                if m.pin([key])[0]:
                    pins[key] = 1
                    pinned_where[key] = m.where([key])[0]
            elif op == "unpin" and pins.get(key):
                m.unpin([key])
                pins[key] = 0
            for d in dropped:
                assert not (pins.get(d) and d in alive), f"pinned {d} was dropped"
                alive.pop(d, None)
            dropped.clear()
            check_budgets(m)
            # the store holds exactly what was stored and neither removed nor reported
            held = {k for t in m.tiers for k in t.held_keys()}
            assert held == set(alive)
            for k, w in pinned_where.items():
                if pins.get(k) and k in alive:
                    assert m.where([k])[0] == w, "a pinned object moved"
            assert m.used(kind) <= m.capacity(kind)
        for k, v in list(alive.items()):
            if k in dropped:  # a promotion made room by dropping an unmeriting object
                continue
            assert same_bits(m.get([k])[0], v)
    finally:
        m.close()
