"""The ledger's placement decisions, on metadata alone: cascade demotion, drops at the
bottom, the demotion filter, pins and pending objects, the shared tier's copies, commits,
losses, promotion and pooled budgets."""

from __future__ import annotations

import pytest

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ledger.ledger import Ledger, TierSpec
from hybrid_connector.tiers.ops import Move, Put, Remove, Take

K = ObjectKind


def key(i: int, kind: ObjectKind = K.KV) -> ObjectKey:
    return ObjectKey("fp", i.to_bytes(16, "little"), kind, 0, 8 if kind is not K.STATE else 0)


def three(kv: int = 2, shared: bool = False) -> Ledger:
    specs = [TierSpec.per_kind(n, {K.KV: kv * 10, K.STATE: 10}) for n in ("device", "host", "disk")]
    if shared:
        specs.append(TierSpec.per_kind("remote", {K.KV: 100, K.STATE: 100}, slow=True, shared=True))
    return Ledger(specs)


def ready(led: Ledger, k: ObjectKey, n: int = 10):
    pl = led.place(k, n)
    assert pl.tier is not None
    for op in pl.ops:
        if isinstance(op, Put):
            led.commit(k, True, shared=op.tier == led.shared_tier)
    return pl


def test_cascade_demotes_oldest_down_and_drops_at_the_bottom() -> None:
    led = three(kv=1)
    for i in range(3):
        ready(led, key(i))
    assert [led.where(key(i)) for i in range(3)] == ["disk", "host", "device"]
    pl = ready(led, key(3))
    assert pl.dropped == (key(0),)                   # nothing below disk
    assert pl.ops == (Remove(key(0), "disk"), Move(key(1), "host", "disk"),
                      Move(key(2), "device", "host"), Put(key(3), "device"))
    led.check()


def test_demotion_filter_and_pins_and_pending() -> None:
    led = three(kv=1)
    led.merits = lambda k: k != key(0)
    ready(led, key(0))
    pl = ready(led, key(1))
    assert pl.dropped == (key(0),) and led.where(key(0)) is None  # did not merit demotion
    led.pin([key(1)])
    pl = led.place(key(2), 10)
    assert pl.tier == "host" and led.where(key(1)) == "device"    # pinned: never moved
    assert led.where(key(2)) is None and led.is_pending(key(2))   # pending: not readable
    pl = led.place(key(3), 10)
    assert pl.tier == "disk"                                        # pending is no victim
    led.check()


def test_fits_and_capacity_sum_the_tiers_but_objects_must_fit_one() -> None:
    led = three(kv=1)
    assert led.capacity(K.KV) == 30 and led.max_object_bytes(K.KV) == 10
    assert led.fits({K.KV: 30}) and not led.fits({K.KV: 31})
    assert led.place(key(0), 11).tier is None


def test_shared_tier_gets_copies_and_keeps_what_leaves_the_local_tiers() -> None:
    led = three(kv=1, shared=True)
    pl = ready(led, key(0))
    assert pl.ops == (Put(key(0), "device"), Put(key(0), "remote"))
    for i in range(1, 4):
        ready(led, key(i))
    assert led.where(key(0)) == "remote"             # off the local tiers, still indexed
    assert not any(isinstance(o, Remove) and o.tier == "remote" for o in led.remove(key(0)))
    led.check()


def test_a_failed_local_put_with_a_shared_copy_becomes_shared_only() -> None:
    led = three(shared=True)
    led.place(key(0), 10)
    assert led.commit(key(0), False) and led.is_pending(key(0))
    assert led.commit(key(0), True, shared=True) and led.where(key(0)) == "remote"
    led.place(key(1), 10)
    assert not led.commit(key(1), False) or not led.commit(key(1), False, shared=True)
    assert key(1) not in led.entries
    led.check()


def test_lost_copies_and_promotion() -> None:
    led = three(kv=1)
    for i in range(3):
        ready(led, key(i))
    pl = led.promote(key(0))                         # read from disk: move it to device
    assert pl.tier == "device"
    assert pl.ops[0] == Take(key(0), "disk") and pl.ops[-1] == Put(key(0), "device")
    assert Move(key(1), "host", "disk") in pl.ops  # room below came from the taken object
    led.check()
    pl = led.lost(key(0))
    assert pl.dropped == (key(0),) and pl.ops == (Remove(key(0), "device"),)
    led.check()


def test_pooled_budget_shares_one_pool_between_kv_and_states() -> None:
    spec = TierSpec("host", {"main": 30}, {K.KV: "main", K.STATE: "main"})
    led = Ledger([spec])
    ready(led, key(0))
    ready(led, key(1, K.STATE))
    assert led.room_kinds(K.STATE) == (K.STATE, K.KV)
    assert led.fits({K.KV: 10}) and not led.fits({K.STATE: 11})


def test_place_twice_is_a_bug() -> None:
    led = three()
    led.place(key(0), 10)
    with pytest.raises(KeyError):
        led.place(key(0), 10)
