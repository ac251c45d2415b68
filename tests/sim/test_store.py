"""The size-only store accounts bytes exactly and holds no data."""

from __future__ import annotations

import pytest

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.size_only import Budget, SizeOnlyStore, zero_payload


def key(kind: ObjectKind, end: int) -> ObjectKey:
    return ObjectKey("fp", end.to_bytes(4, "little"), kind, 0 if kind is not ObjectKind.STATE else end, end)


def test_zero_payload_reports_bytes_without_holding_them() -> None:
    t = zero_payload(10**9)
    assert t.numel() * t.element_size() == 10**9
    assert t.stride() == (0,)
    assert t.untyped_storage().nbytes() == 1
    with pytest.raises(ValueError):
        zero_payload(0)


def test_pooled_capacity_is_shared_between_kv_and_state() -> None:
    s = SizeOnlyStore(Budget.pooled(1000, anchor=100))
    assert s.put([(key(ObjectKind.KV, 1), zero_payload(600))]) == [True]
    assert s.ledger.fits({ObjectKind.STATE: 400}) and not s.ledger.fits({ObjectKind.STATE: 401})
    assert s.put([(key(ObjectKind.STATE, 2), zero_payload(400))]) == [True]
    assert s.used(ObjectKind.KV) == 600 and not s.ledger.fits({ObjectKind.KV: 1})
    dropped = []
    s.set_drop_listener(dropped.extend)
    assert s.put([(key(ObjectKind.STATE, 3), zero_payload(500))]) == [True]  # the pool's LRU goes
    assert dropped == [key(ObjectKind.KV, 1)] and s.used(ObjectKind.KV) == 0
    assert s.put([(key(ObjectKind.KV, 1), zero_payload(600))]) == [True]
    assert dropped == [key(ObjectKind.KV, 1), key(ObjectKind.STATE, 2), key(ObjectKind.STATE, 3)]
    assert s.ledger.room_kinds(ObjectKind.STATE) == (ObjectKind.STATE, ObjectKind.KV)
    assert s.ledger.fits({ObjectKind.ANCHOR: 100})
    assert s.where([key(ObjectKind.KV, 1), key(ObjectKind.KV, 9)]) == ["host", None]
    got = s.get([key(ObjectKind.KV, 1)])[0]
    assert got is not None and got.numel() == 600
    s.remove([key(ObjectKind.KV, 1), key(ObjectKind.KV, 9)])
    assert s.used(ObjectKind.KV) == 0 and s.ledger.fits({ObjectKind.STATE: 1000})
    assert s.peak[ObjectKind.KV] == 600


def test_overwrite_and_per_kind_budgets() -> None:
    s = SizeOnlyStore(Budget.per_kind({ObjectKind.KV: 100, ObjectKind.STATE: 50}))
    assert s.capacity(ObjectKind.ANCHOR) == 0
    assert s.put([(key(ObjectKind.KV, 1), zero_payload(80))]) == [True]
    assert s.put([(key(ObjectKind.KV, 1), zero_payload(100))]) == [True]  # replaces its own bytes
    assert s.used(ObjectKind.KV) == 100
    with pytest.raises(ValueError, match="unknown pool"):
        SizeOnlyStore(Budget({"a": 1}, {ObjectKind.KV: "b"}))
