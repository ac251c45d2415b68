"""``Ledger.check``: the ledger's invariants, recomputed from its entries."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ledger.records import Entry, TierUsage


def check_ledger(entries: Mapping[ObjectKey, Entry], tiers: Sequence[TierUsage],
                 shared: TierUsage | None, pool_name: Callable[[ObjectKind], str],
                 charged: Callable[[str, int], int], tracked_now: Mapping[str, int]) -> None:
    """Every entry sits in exactly the tier the ledger says (its local tier, else the
    shared one), every pool's usage is the sum of its entries and within its budget, and
    the tracked bytes per pool add up. Raises AssertionError naming what is off."""
    used: dict[tuple[str, str], int] = {}
    tracked: dict[str, int] = {}
    for k, e in entries.items():
        homes = [t for t in tiers if k in t.lru]
        want = [e.tier] if e.tier else [shared.spec.name] if shared else []
        assert [t.spec.name for t in homes] == want, f"{k}: in {homes}, ledger says {want}"
        for t in homes:
            slot = (t.spec.name, t.spec.kind_pool[k.kind])
            used[slot] = used.get(slot, 0) + t.spec.size(k.kind, e.nbytes)
        pool = pool_name(k.kind)
        tracked[pool] = tracked.get(pool, 0) + charged(pool, e.nbytes)
    for t in tiers:
        for pool, b in t.spec.pools.items():
            got = t.used.get(pool, 0)
            assert got == used.get((t.spec.name, pool), 0) and got <= b, f"{t.spec.name}.{pool}"
    assert all(tracked.get(p, 0) == n for p, n in tracked_now.items()), "tracked bytes"
