"""The ledger's vocabulary: how a tier looks to it (``TierSpec``), what it records per
object (``Entry``) and per tier (``TierUsage``), and what a placement decision returns."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.ops import Op


@dataclass(frozen=True)
class TierSpec:
    """One tier as the ledger sees it. ``pools``: budget bytes by pool name; ``kind_pool``:
    the pool each kind uses (a kind without one is not stored here). ``slow``: reads are
    async (disk, remote). ``shared``: a store other instances share (see module doc)."""

    name: str
    pools: Mapping[str, int]
    kind_pool: Mapping[ObjectKind, str]
    slow: bool = False
    shared: bool = False
    grains: Mapping[str, int] = field(default_factory=dict)  # pool -> allocation unit

    @classmethod
    def per_kind(cls, name: str, budgets: Mapping[ObjectKind, int], slow: bool = False,
                 shared: bool = False, grains: Mapping[ObjectKind, int] | None = None,
                 joint: Collection[ObjectKind] = ()) -> TierSpec:
        """One pool per kind (kinds with a 0 budget are not stored); ``grains``: the
        allocation unit of each kind's pool (default 1 byte). ``joint``: kinds that share
        one pool instead (named by their values joined with ``_``, e.g. ``kv_state``),
        whose ``budgets`` entries are that pool's one budget (equal; ValueError if not)."""
        live = {k: int(v) for k, v in budgets.items() if v}
        together = [k for k in ObjectKind if k in joint and k in live]
        if len({live[k] for k in together}) > 1:
            raise ValueError(f"tier {name!r}: kinds sharing a pool need one budget, got "
                             f"{ {k.value: live[k] for k in together} }")
        pool = {k: k.value for k in live}
        if len(together) > 1:
            pool.update(dict.fromkeys(together, "_".join(k.value for k in together)))
        gr = grains or {}
        return cls(name, {pool[k]: v for k, v in live.items()}, pool, slow, shared,
                   {pool[k]: int(gr[k]) for k in live if k in gr})

    def grain(self, kind: ObjectKind) -> int:
        return int(self.grains.get(self.kind_pool.get(kind, ""), 1))

    def size(self, kind: ObjectKind, nbytes: int) -> int:
        """Bytes an object of ``kind`` and ``nbytes`` takes in this tier's pool."""
        g = self.grain(kind)
        return (max(nbytes, 1) + g - 1) // g * g

    def budget(self, kind: ObjectKind) -> int:
        pool = self.kind_pool.get(kind)
        return int(self.pools[pool]) if pool is not None else 0


@dataclass
class Entry:
    """What the ledger knows of one object. ``tier``: the local tier holding it (None:
    only a shared copy); ``shared``: a copy is (being) written to the shared tier.
    ``hits``/``last``: what ``tier_eviction: value`` scores likelihood by."""

    key: ObjectKey
    nbytes: int
    tier: str | None
    shared: bool = False
    pending: bool = True  # the local put (or, shared-only, the shared put) is in flight
    shared_pending: bool = False
    pins: int = 0
    hits: int = 0  # touches (uses) since placed
    last: int = 0  # ledger clock at the last place, touch or demotion into its tier


@dataclass
class TierUsage:
    """One tier's pools in the ledger: bytes used per pool and the LRU order of its keys."""

    spec: TierSpec
    used: dict[str, int] = field(default_factory=dict)
    lru: OrderedDict[ObjectKey, None] = field(default_factory=OrderedDict)

    def pool_used(self, kind: ObjectKind) -> int:
        return self.used.get(self.spec.kind_pool.get(kind, ""), 0)

    def fits(self, kind: ObjectKind, nbytes: int) -> bool:
        return self.pool_used(kind) + self.spec.size(kind, nbytes) <= self.spec.budget(kind)

    def holds(self, kind: ObjectKind, nbytes: int) -> bool:
        """Could the pool hold such an object at all (when empty)?"""
        return self.spec.size(kind, nbytes) <= self.spec.budget(kind) and kind in self.spec.kind_pool

    def charge(self, key: ObjectKey, nbytes: int) -> None:
        pool = self.spec.kind_pool[key.kind]
        self.used[pool] = self.used.get(pool, 0) + self.spec.size(key.kind, nbytes)
        self.lru[key] = None

    def free(self, key: ObjectKey, nbytes: int) -> None:
        pool = self.spec.kind_pool[key.kind]
        self.used[pool] -= self.spec.size(key.kind, nbytes)
        self.lru.pop(key, None)

    def oldest(self, entries: Mapping[ObjectKey, Entry], pool: str | None,
               exclude: set[ObjectKey]) -> ObjectKey | None:
        """The least recently used ready, unpinned key of ``pool`` not in ``exclude``."""
        for k in self.lru:
            e = entries[k]
            if (self.spec.kind_pool.get(k.kind) == pool and not e.pending and not e.pins
                    and k not in exclude):
                return k
        return None


@dataclass(frozen=True)
class Placement:
    """Result of a placement decision: the ops to run (in order) and the keys that left
    every tier (the index forgets them). ``tier``: where the object went (None: nowhere)."""

    tier: str | None
    ops: tuple[Op, ...] = ()
    dropped: tuple[ObjectKey, ...] = ()


def pool_groups(specs: list[TierSpec]) -> dict[ObjectKind, str]:
    """Each kind's budget group over ``specs``: kinds sharing a pool in any tier are one
    group (transitively), named by their values joined with ``_`` (``kv_state``; a kind
    alone: its own value, as in the one-pool-per-kind layout)."""
    group = {k: {k} for k in ObjectKind}
    for s in specs:
        for k, pool in s.kind_pool.items():
            for o, p in s.kind_pool.items():
                if p == pool and group[o] is not group[k]:
                    merged = group[k] | group[o]
                    for m in merged:
                        group[m] = merged
    return {k: "_".join(o.value for o in ObjectKind if o in group[k]) for k in ObjectKind}


def pool_totals(specs: list[TierSpec]) -> tuple[dict[str, int], dict[str, int]]:
    """Per budget group (``pool_groups``) over ``specs``: the summed budget of the pools its
    kinds use and their coarsest allocation unit. A group's budget bounds what its kinds
    hold together over all tiers (where tiers group kinds differently, e.g. a host
    ``kv_state`` pool above disk ``kv`` and ``state`` pools, placement may still have to
    demote or drop to find the room in one tier's pool)."""
    groups = pool_groups(specs)
    budget: dict[str, int] = {}
    grain: dict[str, int] = {}
    for s in specs:
        seen: set[str] = set()
        for k, pool in s.kind_pool.items():
            if pool in seen:
                continue
            seen.add(pool)
            g = groups[k]
            budget[g] = budget.get(g, 0) + int(s.pools[pool])
            grain[g] = max(grain.get(g, 1), int(s.grains.get(pool, 1)))
    return budget, grain


def kind_limits(specs: list[TierSpec]) -> tuple[dict[ObjectKind, int],
                                                 dict[ObjectKind, tuple[ObjectKind, ...]]]:
    """Per kind over ``specs``: the largest object any one pool could hold, and the kinds
    sharing a pool with it in some tier (itself first)."""
    biggest = {k: max((s.budget(k) // s.grain(k) * s.grain(k) for s in specs
                       if k in s.kind_pool), default=0) for k in ObjectKind}
    room = {k: tuple(dict.fromkeys([k, *(o for s in specs for o, p in s.kind_pool.items()
                                         if p == s.kind_pool.get(k))])) for k in ObjectKind}
    return biggest, room
