"""Every local tier returns bit-identical tensors (dtype, shape, bytes) and keeps the Tier
contract: budgets per kind, overwrite, pin/remove semantics, get_into validation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tier_helpers import DTYPES, make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.device import DeviceTier
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.indexed import IndexedTier
from hybrid_connector.tiers.nvme import NvmeTier

K = ObjectKind
BUDGET = {K.KV: 1 << 16, K.STATE: 1 << 15, K.ANCHOR: 1 << 14}
SHAPES = [(4, 8), (3,), (), (0, 5), (2, 3, 4, 5, 2)]

TierFactory = Callable[[Path], IndexedTier]
FACTORIES: dict[str, TierFactory] = {
    "device": lambda d: DeviceTier(BUDGET),
    "host": lambda d: HostTier(BUDGET),
    "nvme": lambda d: NvmeTier(d / "nvme", BUDGET),
    "nvme_zstd": lambda d: NvmeTier(d / "nvme", BUDGET, zstd={k: 3 for k in K}),
}


@pytest.fixture(params=sorted(FACTORIES))
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> IndexedTier:
    t = FACTORIES[request.param](tmp_path)
    yield t
    t.close()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_bit_identical(tier: IndexedTier, dtype: torch.dtype) -> None:
    items = [(make_key(i, kind), make_payload(i, shape, dtype))
             for i, shape in enumerate(SHAPES) for kind in K]
    assert all(tier.put(items))
    got = tier.get([k for k, _ in items])
    for (k, v), g in zip(items, got, strict=True):
        assert same_bits(g, v), (k, v.dtype, v.shape)
    # get_into a caller buffer, also bit-identical
    outs = [torch.empty_like(v) for _, v in items]
    assert all(tier.get_into([k for k, _ in items], outs))
    for (_, v), o in zip(items, outs, strict=True):
        assert same_bits(o, v)


def test_nan_payloads_and_noncontiguous_rejected(tier: IndexedTier) -> None:
    v = torch.tensor([float("nan"), -0.0, float("inf")], dtype=torch.bfloat16)
    assert tier.put([(make_key(1), v)]) == [True]
    assert same_bits(tier.get([make_key(1)])[0], v)
    nc = torch.randn(4, 6).t()
    assert tier.put([(make_key(2), nc)]) == [False]
    assert tier.get([make_key(2)]) == [None]


def test_budget_per_kind_and_no_own_eviction(tier: IndexedTier) -> None:
    big = make_payload(0, (BUDGET[K.ANCHOR] // 4 // 2,), torch.float32)  # half the anchor pool
    assert tier.put([(make_key(1, K.ANCHOR), big), (make_key(2, K.ANCHOR), big)]) == [True, True]
    assert tier.put([(make_key(3, K.ANCHOR), big)]) == [False]  # full: tier never evicts
    assert tier.used(K.ANCHOR) == 2 * big.numel() * 4 <= tier.capacity(K.ANCHOR)
    # another kind's pool is untouched by anchor pressure
    assert tier.put([(make_key(4, K.KV), big)]) == [True]
    assert tier.contains([make_key(1, K.ANCHOR), make_key(2, K.ANCHOR)]) == [True, True]


def test_overwrite_and_remove(tier: IndexedTier) -> None:
    k = make_key(7, K.STATE)
    a, b = make_payload(1, (16,)), make_payload(2, (2, 3), torch.bfloat16)
    assert tier.put([(k, a)]) == [True]
    assert tier.put([(k, b)]) == [True]
    assert same_bits(tier.get([k])[0], b)
    assert tier.used(K.STATE) == 12
    assert tier.remove([k, make_key(99)]) == [True, False]
    assert tier.get([k]) == [None] and tier.used(K.STATE) == 0


def test_pins(tier: IndexedTier) -> None:
    keys = [make_key(i) for i in range(4)]
    assert all(tier.put([(k, make_payload(i)) for i, k in enumerate(keys)]))
    assert tier.contains(keys[:2], pin=True) == [True, True]
    assert tier.pin([keys[0], make_key(50)]) == [True, False]
    assert list(tier.lru(K.KV)) == keys[2:]
    tier.unpin([keys[0]])
    assert keys[0] not in list(tier.lru(K.KV))  # still pinned once
    tier.unpin([keys[0], keys[1]])
    assert set(tier.lru(K.KV)) == set(keys)
    # removing a pinned object hides it now and frees it at the last unpin
    tier.pin([keys[3]])
    assert tier.remove([keys[3]]) == [True]
    assert tier.get([keys[3]]) == [None] and tier.used(K.KV) == 3 * 128
    tier.unpin([keys[3]])
    assert tier.used(K.KV) == 3 * 128


def test_get_into_rejects_wrong_buffer(tier: IndexedTier) -> None:
    k = make_key(1)
    assert tier.put([(k, make_payload(1, (4, 8)))]) == [True]
    assert tier.get_into([k], [torch.empty(8, 4)]) == [False]
    assert tier.get_into([k], [torch.empty(4, 8, dtype=torch.float16)]) == [False]
    with pytest.raises(ValueError, match="buffers"):
        tier.get_into([k], [])
    assert same_bits(tier.get([k])[0], make_payload(1, (4, 8)))  # a bad buffer is not corruption


def test_lru_order_follows_reads(tier: IndexedTier) -> None:
    keys = [make_key(i) for i in range(3)]
    tier.put([(k, make_payload(i)) for i, k in enumerate(keys)])
    tier.get([keys[0]])
    assert list(tier.lru(K.KV)) == [keys[1], keys[2], keys[0]]
    s = tier.stats()
    assert s.objects["kv"] == 3 and s.hits == 1 and s.used["kv"] == 3 * 128


def test_budget_validation() -> None:
    with pytest.raises(ValueError, match="budget of kv"):
        HostTier({K.KV: -1})
