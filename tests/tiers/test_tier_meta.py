"""Object metadata (``ObjectMeta``) through the tiers: kept with the object by every tier,
handed on by moves, demotions and promotions, persisted by the NVMe tier and listed again
by ``inventory()`` after a restart (warm restart, issue 10 item 3); files written before
metadata existed still load."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hostile_peers import crafted_blob
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKey, ObjectKind, PrefixHasher
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers import codec
from hybrid_connector.tiers.device import DeviceTier
from hybrid_connector.tiers.executor import Executor
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.memory import MemoryTier
from hybrid_connector.tiers.nvme import NvmeTier
from hybrid_connector.tiers.ops import Move, Put, Take
from hybrid_connector.tiers.tier import Tier

K = ObjectKind
BIG = {k: 1 << 24 for k in K}


def meta_for(key: ObjectKey, v: int = 0) -> ObjectMeta:
    """Metadata that fits a ``make_key`` key (16-token ranges, block size 16); ``v``
    makes versions distinguishable."""
    if key.kind is K.STATE:
        return ObjectMeta(key.prefix, (), (), 16 + v)
    n = key.end - key.start
    hashes = tuple(bytes([v % 256]) * 16 for _ in range(key.end // 16 - key.start // 16))
    return ObjectMeta(bytes([v % 256]) * 16, tuple(range(v, v + n)), hashes, 16)


def make_tier(kind: str, path: Path) -> Tier:
    if kind == "memory":
        return MemoryTier("memory", BIG)
    if kind == "host":
        return HostTier(BIG, pin_memory=False)
    if kind == "device":
        return DeviceTier(BIG, device="cpu")
    return NvmeTier(path / "nvme", BIG, zstd={K.STATE: 1} if kind == "nvme_zstd" else None)


TIERS = ["memory", "host", "device", "nvme", "nvme_zstd"]


@pytest.mark.parametrize("kind", TIERS)
def test_meta_survives_put_and_get_in_every_tier(tmp_path: Path, kind: str) -> None:
    tier = make_tier(kind, tmp_path)
    keys = [make_key(i, k) for i, k in enumerate(K)] + [make_key(9)]
    vals = [make_payload(i) for i in range(len(keys))]
    metas: list[ObjectMeta | None] = [meta_for(k, i) for i, k in enumerate(keys[:-1])] + [None]
    assert tier.put(list(zip(keys, vals, strict=True)), metas) == [True] * 4
    for k, v, m in zip(keys, vals, metas, strict=True):
        assert tier.object_meta(k) == m
        assert same_bits(tier.get([k])[0], v)
    inv = {k: (n, m) for k, n, m in tier.inventory()}
    assert inv == {k: (v.numel() * v.element_size(), m)
                   for k, v, m in zip(keys, vals, metas, strict=True)}
    # an overwrite replaces the metadata too (here: with none)
    assert tier.put([(keys[0], vals[0])]) == [True]
    assert tier.object_meta(keys[0]) is None
    assert tier.object_meta(make_key(99)) is None  # absent
    tier.close()


@pytest.mark.parametrize("kind", ["memory", "nvme"])
def test_meta_that_does_not_fit_its_key_fails_the_put_only(tmp_path: Path, kind: str) -> None:
    tier = make_tier(kind, tmp_path)
    k, s = make_key(1), make_key(2, K.STATE)
    old = make_payload(1)
    assert tier.put([(k, old)], [meta_for(k)]) == [True]
    wrong_len = ObjectMeta(b"", tuple(range(15)), (b"h",), 16)  # 15 tokens for 16
    wrong_prev = ObjectMeta(b"not the prefix")  # a state's prev is its key prefix
    assert tier.put([(k, make_payload(2)), (s, make_payload(3))], [wrong_len, wrong_prev]
                    ) == [False, False]
    assert same_bits(tier.get([k])[0], old) and tier.object_meta(k) == meta_for(k)
    assert tier.contains([s]) == [False]
    with pytest.raises(ValueError, match="metas"):
        tier.put([(k, old)], [])
    with pytest.raises(ValueError, match="ObjectMeta"):
        tier.put([(k, old)], [{"prev": b""}])  # type: ignore[list-item]


def test_inventory_is_per_kind_least_recently_used_first() -> None:
    tier = MemoryTier("memory", BIG)
    k1, k2, k3 = (make_key(i) for i in range(3))
    s1, a1 = make_key(5, K.STATE), make_key(6, K.ANCHOR)
    tier.put([(a1, make_payload(0)), (k1, make_payload(1)), (s1, make_payload(2)),
              (k2, make_payload(3)), (k3, make_payload(4))])
    tier.get([k1])  # k1 becomes the most recently used
    assert tier.pin([k2]) == [True]  # pinned objects are listed too
    assert [k for k, _, _ in tier.inventory()] == [k2, k3, k1, s1, a1]


def test_nvme_restart_lists_the_same_metas_oldest_first(tmp_path: Path) -> None:
    d = tmp_path / "nvme"
    tier = NvmeTier(d, BIG, zstd={K.STATE: 1})
    keys = [make_key(i, kind) for i in range(4) for kind in K]
    metas = [meta_for(k, i) if i % 4 else None for i, k in enumerate(keys)]
    vals = [make_payload(i, (3, 5)) for i in range(len(keys))]
    assert tier.put(list(zip(keys, vals, strict=True)), metas) == [True] * len(keys)
    for i, k in enumerate(reversed(keys)):  # make file age the reverse of put order
        os.utime(d / k.digest(), (1_000_000 + i, 1_000_000 + i))
    before = {k: (n, m) for k, n, m in tier.inventory()}
    tier.close()
    t2 = NvmeTier(d, BIG)
    assert t2.dropped_at_start == []
    inv = t2.inventory()
    assert {k: (n, m) for k, n, m in inv} == before
    for kind in K:  # oldest file first, per kind
        assert [k for k, _, _ in inv if k.kind is kind] == [k for k in reversed(keys)
                                                            if k.kind is kind]
    for k, v, m in zip(keys, vals, metas, strict=True):
        assert t2.object_meta(k) == m and same_bits(t2.get([k])[0], v)


def test_nvme_restart_with_real_chain_metadata_re_links(tmp_path: Path) -> None:
    """Chunks, a state and an anchor page of one 1,024-token sequence stored with
    ``ObjectMeta.for_range``: after a restart each chunk's ``prev`` is the key prefix of
    the chunk before it, and block hashes place the state inside its chunk."""
    toks = np.random.default_rng(0).integers(0, 150_000, 1024)
    h = PrefixHasher(toks, 16)
    items, metas = [], []
    for s in range(0, 1024, 256):
        items.append((ObjectKey("fp", h.at(s + 256), K.KV, s, s + 256), make_payload(s, (64,))))
        metas.append(ObjectMeta.for_range(toks, s, s + 256, K.KV, h))
    items.append((ObjectKey("fp", h.at(608), K.STATE, 608, 608), make_payload(1, (32,))))
    metas.append(ObjectMeta.for_range(toks, 608, 608, K.STATE, h))
    items.append((ObjectKey("fp", h.at(512), K.ANCHOR, 256, 512), make_payload(2, (8,))))
    metas.append(ObjectMeta.for_range(toks, 256, 512, K.ANCHOR, h))
    d = tmp_path / "nvme"
    assert NvmeTier(d, BIG).put(items, metas) == [True] * len(items)
    inv = NvmeTier(d, BIG).inventory()
    by_prefix = {k.prefix: (k, m) for k, _, m in inv if k.kind is K.KV}
    chunk, m = next((k, m) for k, _, m in inv if k.kind is K.KV and k.start == 768)
    chain = []
    while m is not None and chunk.start > 0:
        chain.append(chunk.start)
        chunk, m = by_prefix[m.prev]  # prev hash -> the chunk before
    assert chain == [768, 512, 256] and chunk.start == 0
    state = next(k for k, _, _ in inv if k.kind is K.STATE)
    holders = [k for k, _, m in inv if k.kind is K.KV and m and state.prefix in m.hashes]
    assert [k.start for k in holders] == [512]  # the block hash at 608 is inside it
    assert all(m is not None and m.tokens == tuple(toks[k.start:k.end].tolist())
               for k, _, m in inv if k.kind is not K.STATE)


def test_nvme_metadata_larger_than_the_first_header_read(tmp_path: Path) -> None:
    """100,000 tokens of metadata (400 KB, far past the 4 KiB first read) round-trip."""
    d = tmp_path / "nvme"
    toks = np.arange(100_000) + 70_000
    h = PrefixHasher(toks, 256)
    k = ObjectKey("fp", h.at(100_000), K.ANCHOR, 0, 100_000)
    m = ObjectMeta.for_range(toks, 0, 100_000, K.ANCHOR, h)
    assert NvmeTier(d, BIG).put([(k, make_payload(1))], [m]) == [True]
    t2 = NvmeTier(d, BIG, verify_on_start=True)
    assert t2.object_meta(k) == m and same_bits(t2.get([k])[0], make_payload(1))


def old_format_file(k: ObjectKey, v: torch.Tensor) -> bytes:
    """A file exactly as the tier wrote it before metadata existed."""
    raw = codec.raw_bytes(v).tobytes()
    header = {"key": k.to_str(), "kind": k.kind.value, "shape": list(v.shape),
              "dtype": str(v.dtype).removeprefix("torch."), "nbytes": len(raw),
              "stored": len(raw), "codec": "raw", "checksum": codec.checksum(raw)}
    return crafted_blob(json.dumps(header, separators=(",", ":")).encode(), raw)


def test_old_files_without_metadata_still_load(tmp_path: Path) -> None:
    d = tmp_path / "nvme"
    tier = NvmeTier(d, BIG)
    new, nv = make_key(1), make_payload(1)
    assert tier.put([(new, nv)], [meta_for(new)]) == [True]
    old, ov = make_key(2), make_payload(2)
    (d / old.digest()).write_bytes(old_format_file(old, ov))
    plain, pv = make_key(3), make_payload(3)
    assert tier.put([(plain, pv)]) == [True]  # no metadata: the old layout, byte for byte
    assert (d / plain.digest()).read_bytes() == old_format_file(plain, pv)
    tier.close()  # a restart: one live store per directory
    t2 = NvmeTier(d, BIG)
    assert t2.dropped_at_start == []
    assert {k: m for k, _, m in t2.inventory()} == {new: meta_for(new), old: None, plain: None}
    assert same_bits(t2.get([old])[0], ov) and same_bits(t2.get([new])[0], nv)


def test_blob_carries_metadata_and_bounds_it() -> None:
    k, v, m = make_key(1), make_payload(1), meta_for(make_key(1), 3)
    blob = codec.encode_blob(k, v, 3, m)
    h = codec.blob_meta(blob)
    assert h.meta_len == len(m.to_bytes())
    at = len(blob) - h.stored - h.meta_len
    assert codec.decode_meta(h, blob[at : at + h.meta_len], k) == m
    assert same_bits(codec.decode_blob(k, blob), v)
    assert len(blob) <= codec.max_blob_len(v.numel() * 4, h.meta_len)
    assert codec.decode_meta(codec.blob_meta(codec.encode_blob(k, v)), b"", k) is None


# ------------------------------------------------------------------ moves and the executor
class LegacyTier(MemoryTier):
    """A tier written before ``put`` took metadata."""

    def put(self, items):  # type: ignore[no-untyped-def, override]
        return super().put(items)


def test_executor_passes_metas_through_put_move_take() -> None:
    a, b, c = MemoryTier("a", BIG), MemoryTier("b", BIG), LegacyTier("c", BIG)
    ex = Executor([a, b, c], inline=True)
    k, v, m = make_key(1), make_payload(1), meta_for(make_key(1), 5)
    k2 = make_key(2)
    res = ex.submit([Put(k, "a"), Put(k2, "a"), Move(k, "a", "b")], {k: v, k2: v},
                    metas={k: m}).result()
    assert res == [True] * 3
    assert b.object_meta(k) == m and a.contains([k]) == [False]
    assert a.object_meta(k2) is None  # no metadata given for it
    # a promotion: take from b, then put back without a payload (from the stash)
    assert ex.submit([Take(k, "b"), Put(k, "a")], {}).result() == [True, True]
    assert a.object_meta(k) == m and b.contains([k]) == [False]
    # a legacy tier without metadata still takes puts and moves that carry none
    assert ex.submit([Move(k2, "a", "c")], {}).result() == [True]
    assert c.contains([k2]) == [True]
    ex.close()


def test_threaded_executor_passes_metas_and_reports_done() -> None:
    a = MemoryTier("a", BIG)
    ex = Executor([a])
    keys = [make_key(i) for i in range(20)]
    seen: list[list[bool]] = []
    fut = ex.submit([Put(k, "a") for k in keys], {k: make_payload(i) for i, k in enumerate(keys)},
                    done=lambda idx, res: seen.append(res),
                    metas={k: meta_for(k, i) for i, k in enumerate(keys)})
    assert fut.result(10) == [True] * 20 and seen == [[True] * 20]
    assert [a.object_meta(k) for k in keys] == [meta_for(k, i) for i, k in enumerate(keys)]
    ex.close()


def test_manager_demotion_device_host_nvme_and_promotion_keep_metas(tmp_path: Path) -> None:
    """Objects put through ``TieredStore`` with metadata are demoted device -> host ->
    NVMe as room runs out and promoted back on a hit; wherever an object is, its tier
    holds its metadata, and after a restart the NVMe tier lists it."""
    two = {k: 2 * 128 for k in K}  # two (4, 8) float32 payloads per kind
    dev = DeviceTier(two, device="cpu")
    host = HostTier(two, pin_memory=False)
    nvme = NvmeTier(tmp_path / "nvme", BIG)
    m = TieredStore([dev, host, nvme], inline=True)
    keys = [make_key(i, kind) for i in range(6) for kind in (K.KV, K.STATE)]
    metas = {k: meta_for(k, i) for i, k in enumerate(keys)}
    vals = {k: make_payload(i) for i, k in enumerate(keys)}
    assert m.put([(k, vals[k]) for k in keys], [metas[k] for k in keys]) == [True] * len(keys)
    where = dict(zip(keys, m.where(keys), strict=True))
    assert sorted(where.values()) == sorted(["device"] * 4 + ["host"] * 4 + ["nvme"] * 4)

    def check() -> None:
        for k in keys:
            assert m.tier(m.where([k])[0] or "").object_meta(k) == metas[k], k

    check()
    oldest = keys[0]
    assert where[oldest] == "nvme"
    assert same_bits(m.get([oldest])[0], vals[oldest])  # a hit promotes it to the device
    assert m.where([oldest]) == ["device"]
    check()
    on_disk = {k: metas[k] for k in keys if m.where([k]) == ["nvme"]}
    assert len(on_disk) == 4
    m.close()
    t2 = NvmeTier(tmp_path / "nvme", BIG)
    assert {k: meta for k, _, meta in t2.inventory()} == on_disk
    m2 = TieredStore([t2], inline=True)  # adopted: reads back
    assert all(same_bits(m2.get([k])[0], vals[k]) for k in on_disk)
    m2.close()


def test_manager_put_validates_metas() -> None:
    m = TieredStore([MemoryTier("a", BIG)], inline=True)
    k = make_key(1)
    assert m.put([(k, make_payload(1))], [ObjectMeta(b"", (1, 2), (), 0)]) == [False]
    assert m.where([k]) == [None]
    with pytest.raises(ValueError, match="metas"):
        m.put([(k, make_payload(1))], [None, None])
    assert m.put([(k, make_payload(1))]) == [True]  # no metadata: as before


class RacingTier(MemoryTier):
    """Runs ``hook`` once, inside the next ``contains``: a lane's op landing between a
    reader's look at the stash and its look at this tier."""

    hook = None

    def contains(self, keys, pin=False):  # type: ignore[no-untyped-def]
        hook, self.hook = self.hook, None
        out = super().contains(keys, pin)
        if hook is not None:
            hook()
        return out


@pytest.mark.parametrize("race", ["take_into_stash", "move_to_a_tier_looked_at"])
def test_read_racing_a_move_still_finds_the_object(race: str) -> None:
    """A read that looked at the stash (or a tier) before a lane moved the object there
    looks again instead of missing (found by the flaky cache-over-tiers test: a take ran
    between the reader's stash check and its tier check)."""
    a, b = MemoryTier("a", BIG), RacingTier("b", BIG)
    ex = Executor([a, b], inline=True)
    k, v = make_key(1), make_payload(1)
    assert ex.submit([Put(k, "b")], {k: v}).result() == [True]
    if race == "take_into_stash":
        b.hook = lambda: ex.submit([Take(k, "b")], {}).result()
    else:  # "a" was looked at first; the object moves there, then leaves "b"
        b.hook = lambda: ex.submit([Move(k, "b", "a")], {}).result()
    got = ex.read([k], ["a"])[0]
    assert got is not None and same_bits(got, v)
    ex.close()
